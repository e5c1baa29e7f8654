from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from sluice.engine.plan import RequestOutput
from sluice.engine.request import FinishReason
from sluice.replica.request_spans import RequestSpans
from sluice.telemetry.carrier import trace_headers
from sluice.v1 import common_pb2, replica_pb2


def make_spans() -> tuple[RequestSpans, InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return RequestSpans("tiny-llama-v1", "replica-0", provider.get_tracer("test")), exporter, provider


def output(tokens: list[int], finish: FinishReason | None = None, produced: int = 1) -> RequestOutput:
    return RequestOutput("r1", tuple(tokens), finish, 4, 2, produced)


def request(provider: TracerProvider) -> tuple[replica_pb2.TokenRequest, int]:
    with provider.get_tracer("router").start_as_current_span("router.generate") as parent:
        message = replica_pb2.TokenRequest(request_id="r1", prompt_token_ids=[1, 2, 3, 4],
                                           service_class=common_pb2.SERVICE_CLASS_BATCH, trace_context=trace_headers())
    return message, parent.get_span_context().span_id


def test_prefill_until_the_first_token_then_one_decode_span_to_the_end():
    spans, exporter, provider = make_spans()
    message, parent_id = request(provider)
    spans.arrived(message)
    spans.produced("r1", [output([])])  # a prompt chunk: no token yet
    assert [s.name for s in exporter.get_finished_spans()] == ["router.generate"]
    spans.produced("r1", [output([5])])
    for step in range(2, 5):
        spans.produced("r1", [output([5], produced=step)])
    spans.produced("r1", [output([6], FinishReason.LENGTH, produced=5)])

    prefill, decode = [s for s in exporter.get_finished_spans() if s.name.startswith("replica.")]
    assert (prefill.name, decode.name) == ("replica.prefill", "replica.decode")
    assert prefill.parent.span_id == decode.parent.span_id == parent_id
    assert prefill.end_time <= decode.start_time
    assert prefill.attributes["sluice.class"] == "batch"
    assert prefill.attributes["sluice.prompt_tokens"] == 4
    assert prefill.attributes["sluice.cached_prompt_tokens"] == 2
    assert decode.attributes["sluice.output_tokens"] == 5
    assert decode.attributes["sluice.outcome"] == "length"
    assert [event.name for event in decode.events] == ["finished"]


def test_a_cancelled_request_ends_its_open_span_once():
    spans, exporter, provider = make_spans()
    message, _ = request(provider)
    spans.arrived(message)
    spans.ended("r1", "cancelled")
    spans.ended("r1", "cancelled")
    spans.produced("r1", [output([5])])  # a late output after the cancel opens nothing
    (prefill,) = [s for s in exporter.get_finished_spans() if s.name.startswith("replica.")]
    assert prefill.attributes["sluice.outcome"] == "cancelled"


def test_a_failure_marks_the_span_as_an_error():
    spans, exporter, provider = make_spans()
    message, _ = request(provider)
    spans.arrived(message)
    spans.produced("r1", [output([5])])
    spans.ended("r1", "replica_lost", failed=True)
    decode = next(s for s in exporter.get_finished_spans() if s.name == "replica.decode")
    assert decode.status.status_code is StatusCode.ERROR


def test_nothing_is_kept_when_tracing_is_off():
    spans = RequestSpans("tiny-llama-v1", "replica-0")  # the API's no-op tracer: no provider installed
    spans.arrived(replica_pb2.TokenRequest(request_id="r1", prompt_token_ids=[1]))
    assert spans._open == {}  # noqa: SLF001 (the point: no per-request state when off)
