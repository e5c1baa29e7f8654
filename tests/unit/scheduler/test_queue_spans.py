from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from sluice.scheduler.queue_spans import QueueSpans
from sluice.telemetry.carrier import trace_headers
from sluice.v1 import scheduler_pb2


def make_spans() -> tuple[QueueSpans, InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return QueueSpans(provider.get_tracer("test")), exporter, provider


def enqueue(provider: TracerProvider, request_id: str) -> scheduler_pb2.Enqueue:
    with provider.get_tracer("router").start_as_current_span("router.admission"):
        return scheduler_pb2.Enqueue(request_id=request_id, tenant="acme", model_version="v1", prompt_tokens=12,
                                     trace_context=trace_headers())


def finished(exporter: InMemorySpanExporter, name: str) -> list:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def test_dispatch_ends_the_queue_span_with_a_placement_child():
    spans, exporter, provider = make_spans()
    spans.enqueued(enqueue(provider, "r1"), "interactive", owner="router-a")
    assert finished(exporter, "scheduler.queue") == []
    spans.dispatched("r1", "replica-0", 3, "v1")
    (queue,) = finished(exporter, "scheduler.queue")
    (placement,) = finished(exporter, "scheduler.placement")
    (admission,) = finished(exporter, "router.admission")
    assert queue.parent.span_id == admission.context.span_id
    assert placement.parent.span_id == queue.context.span_id
    assert placement.attributes["sluice.replica"] == "replica-0"
    assert queue.attributes["sluice.tenant"] == "acme"
    assert queue.attributes["sluice.outcome"] == "dispatched"


def test_refused_released_and_dropped_requests_end_their_queue_spans():
    spans, exporter, provider = make_spans()
    for request_id, owner in (("refused", "a"), ("released", "a"), ("dropped", "b"), ("kept", "a")):
        spans.enqueued(enqueue(provider, request_id), "batch", owner=owner)
    spans.refused("refused", "over_capacity")
    spans.left("released")
    spans.drop_owner("b")
    outcomes = {s.attributes["sluice.request_id"]: s.attributes["sluice.outcome"]
                for s in finished(exporter, "scheduler.queue")}
    assert outcomes == {"refused": "over_capacity", "released": "left_queue", "dropped": "left_queue"}
    assert finished(exporter, "scheduler.placement") == []
