from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

from sluice.telemetry.exemplars import current_exemplar


def test_no_exemplar_without_a_span():
    assert current_exemplar() is None


def test_exemplar_names_the_recording_span_trace():
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        exemplar = current_exemplar()
    trace_id = span.get_span_context().trace_id
    assert exemplar == {"trace_id": format(trace_id, "032x")}


def test_no_exemplar_for_an_unsampled_span():
    tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")
    with tracer.start_as_current_span("work"):
        assert current_exemplar() is None
