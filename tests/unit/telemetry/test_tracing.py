from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluice.telemetry.tracing import configure_tracing, make_tracer_provider, tracing_requested

ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


def test_tracing_is_off_without_an_endpoint():
    assert configure_tracing("sluice-test", environ={}) is None
    # No SDK provider was installed: the API's tracer hands out the one
    # shared non-recording span, so the hot path allocates no spans.
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("a") as first, tracer.start_as_current_span("b") as second:
        assert not first.is_recording()
        assert first is second is trace.INVALID_SPAN


def test_an_endpoint_turns_tracing_on_unless_disabled():
    assert tracing_requested(ENDPOINT)
    assert tracing_requested({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"})
    assert not tracing_requested({**ENDPOINT, "OTEL_SDK_DISABLED": "true"})
    assert not tracing_requested({**ENDPOINT, "OTEL_TRACES_EXPORTER": "none"})
    assert not tracing_requested({"OTEL_EXPORTER_OTLP_ENDPOINT": " "})


def test_provider_names_the_service_and_exports_spans():
    exporter = InMemorySpanExporter()
    provider = make_tracer_provider("sluice-test", exporter)
    with provider.get_tracer("test").start_as_current_span("work"):
        pass
    provider.shutdown()
    (span,) = exporter.get_finished_spans()
    assert span.name == "work"
    assert span.resource.attributes["service.name"] == "sluice-test"
