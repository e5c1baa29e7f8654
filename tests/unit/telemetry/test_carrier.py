from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from sluice.telemetry.carrier import extract_trace_context, inject_trace_context
from sluice.v1 import router_pb2


def test_context_round_trips_through_a_protobuf_map():
    tracer = TracerProvider().get_tracer("test")
    request = router_pb2.GenerateRequest(request_id="r1")
    with tracer.start_as_current_span("sender") as sender:
        inject_trace_context(request.trace_context)
    received = router_pb2.GenerateRequest.FromString(request.SerializeToString())

    with tracer.start_as_current_span("receiver", context=extract_trace_context(received.trace_context)) as receiver:
        pass

    assert "traceparent" in received.trace_context
    assert receiver.get_span_context().trace_id == sender.get_span_context().trace_id
    assert receiver.parent.span_id == sender.get_span_context().span_id


def test_an_empty_map_starts_a_new_trace():
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("unrelated"):
        with tracer.start_as_current_span("root", context=extract_trace_context({})) as root:
            pass
    assert root.parent is None


def test_nothing_is_injected_without_a_span():
    carrier: dict[str, str] = {}
    inject_trace_context(carrier)
    assert carrier == {}
    assert not trace.get_current_span().get_span_context().is_valid
