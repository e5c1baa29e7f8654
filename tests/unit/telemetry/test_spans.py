from dataclasses import dataclass

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from sluice.telemetry import spans
from sluice.telemetry.carrier import inject_trace_context


@dataclass(frozen=True, slots=True)
class FrozenError(Exception):  # the gateway's ApiError has this shape
    code: str


def _tracer() -> tuple[trace.Tracer, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def test_current_span_lets_a_frozen_exception_through_and_marks_the_span():
    tracer, exporter = _tracer()
    with pytest.raises(FrozenError):
        with spans.current_span(tracer, "gateway.auth"):
            raise FrozenError("invalid_api_key")
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert not trace.get_current_span().get_span_context().is_valid  # detached again


def test_current_span_is_current_inside_and_a_child_of_the_outer_span():
    tracer, exporter = _tracer()
    with tracer.start_as_current_span("request") as outer:
        with spans.current_span(tracer, "gateway.limits", {spans.TENANT: "acme"}) as inner:
            assert trace.get_current_span() is inner
    limits = next(s for s in exporter.get_finished_spans() if s.name == "gateway.limits")
    assert limits.parent.span_id == outer.get_span_context().span_id
    assert limits.attributes[spans.TENANT] == "acme"


def test_request_parent_prefers_the_message_context_over_the_current_one():
    tracer, _ = _tracer()
    with tracer.start_as_current_span("sender") as sender:
        carrier: dict[str, str] = {}
        inject_trace_context(carrier)
    with tracer.start_as_current_span("stream"):
        parent = spans.request_parent(carrier)
        with tracer.start_as_current_span("stream-only") as current:
            fallback = spans.request_parent({})
    assert trace.get_current_span(parent).get_span_context().span_id == sender.get_span_context().span_id
    assert trace.get_current_span(fallback) is current
