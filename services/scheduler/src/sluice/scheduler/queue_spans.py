"""The scheduler's spans of a request: `scheduler.queue` from Enqueue to the
decision (its queue wait), and `scheduler.placement`, the dispatch itself
(which replica, how many KV blocks reserved), as a child of the queue span.

Both hang under the router's admission span, whose context the Enqueue
message carries. Event-loop only, like the servicer. With tracing off the
spans do not record and nothing is kept.
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import Span

from sluice.telemetry import spans
from sluice.telemetry.carrier import extract_trace_context
from sluice.v1 import scheduler_pb2


class QueueSpans:
    def __init__(self, tracer: trace.Tracer | None = None) -> None:
        self._tracer = tracer or trace.get_tracer("sluice.scheduler")
        self._queued: dict[str, Span] = {}  # request id -> its open queue span
        self._owners: dict[str, str] = {}  # request id -> the router stream that queued it

    def enqueued(self, enqueue: scheduler_pb2.Enqueue, class_name: str, owner: str) -> None:
        span = self._tracer.start_span(
            "scheduler.queue", context=extract_trace_context(enqueue.trace_context), attributes={
                spans.REQUEST_ID: enqueue.request_id, spans.MODEL: enqueue.model_version,
                spans.SERVICE_CLASS: class_name, spans.TENANT: enqueue.tenant,
                spans.PROMPT_TOKENS: enqueue.prompt_tokens,
            },
        )
        if span.is_recording():
            self._queued[enqueue.request_id] = span
            self._owners[enqueue.request_id] = owner

    def _pop(self, request_id: str) -> Span | None:
        self._owners.pop(request_id, None)
        return self._queued.pop(request_id, None)

    def refused(self, request_id: str, reason: str) -> None:
        span = self._pop(request_id)
        if span is not None:
            spans.end_with_outcome(span, reason, failed=True)

    def left(self, request_id: str) -> None:
        """Released while queued (cancelled, its router stream closed)."""
        span = self._pop(request_id)
        if span is not None:
            spans.end_with_outcome(span, "left_queue")

    def dispatched(self, request_id: str, replica_id: str, reserved_kv_blocks: int, model_version: str) -> None:
        span = self._pop(request_id)
        if span is None:
            return
        placement = self._tracer.start_span("scheduler.placement", context=spans.child_context(span), attributes={
            spans.REPLICA: replica_id, "sluice.reserved_kv_blocks": reserved_kv_blocks,
            spans.MODEL: model_version,
        })
        spans.end_with_outcome(placement, "dispatched")
        spans.end_with_outcome(span, "dispatched")

    def drop_owner(self, owner: str) -> None:
        """A router stream closed: what it had queued left with it."""
        for request_id in [r for r, o in self._owners.items() if o == owner]:
            self.left(request_id)
