"""The replica's spans of a request: `replica.prefill` from its arrival to
its first token (queue wait on the replica and the prompt's forward
passes), then `replica.decode` from the first token to its end: one span
for the whole decode, with a `finished` event, never a span per token.

Both hang under the router's span, whose context the TokenRequest carries.
Event-loop only. With tracing off the spans do not record and nothing is
kept, so the per-step cost is one dict lookup per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

from sluice.engine.plan import RequestOutput
from sluice.engine.request import ServiceClass
from sluice.replica.engine_metrics import CLASS_NAMES
from sluice.replica.requests import SERVICE_CLASSES
from sluice.telemetry import spans
from sluice.v1 import replica_pb2


@dataclass(slots=True)
class _Open:
    parent: Context
    prefill: Span
    decode: Span | None = None


class RequestSpans:
    def __init__(self, model_version: str, replica_id: str, tracer: trace.Tracer | None = None) -> None:
        self._tracer = tracer or trace.get_tracer("sluice.replica")
        self._attributes = {spans.MODEL: model_version, spans.REPLICA: replica_id}
        self._open: dict[str, _Open] = {}  # request id -> its spans

    def arrived(self, request: replica_pb2.TokenRequest) -> None:
        parent = spans.request_parent(request.trace_context)
        span = self._tracer.start_span("replica.prefill", context=parent, attributes={
            **self._attributes, spans.REQUEST_ID: request.request_id,
            spans.SERVICE_CLASS: CLASS_NAMES[SERVICE_CLASSES.get(request.service_class, ServiceClass.INTERACTIVE)],
            spans.PROMPT_TOKENS: len(request.prompt_token_ids),
        })
        if span.is_recording():
            self._open[request.request_id] = _Open(parent, span)

    def produced(self, request_id: str, outputs: list[RequestOutput]) -> None:
        """The outputs the engine made for it since the last call."""
        state = self._open.get(request_id)
        if state is None or not outputs:
            return
        last = outputs[-1]
        if state.decode is None and any(output.new_token_ids for output in outputs):
            state.prefill.set_attribute(spans.CACHED_PROMPT_TOKENS, last.num_cached_tokens)
            spans.end_with_outcome(state.prefill, "first_token")
            state.decode = self._tracer.start_span("replica.decode", context=state.parent, attributes={
                **self._attributes, spans.REQUEST_ID: request_id,
            })
        if last.finished:
            del self._open[request_id]
            reason = last.finish_reason.value
            span = state.decode or state.prefill
            span.add_event("finished", {"sluice.finish_reason": reason})
            span.set_attribute(spans.OUTPUT_TOKENS, last.num_output_tokens)
            spans.end_with_outcome(span, reason)

    def ended(self, request_id: str, outcome: str, *, failed: bool = False) -> None:
        """It ended without finishing: cancelled by the caller, or failed."""
        state = self._open.pop(request_id, None)
        if state is not None:
            spans.end_with_outcome(state.decode or state.prefill, outcome, failed=failed)
