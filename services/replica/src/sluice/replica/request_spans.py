"""The replica's spans of a request: `replica.prefill` from its arrival to
its first token (queue wait on the replica and the prompt's forward
passes), then `replica.decode` from the first token to its end: one span
for the whole decode, with a `finished` event, never a span per token.

Both hang under the router's span, whose context the TokenRequest carries.
Event-loop only.

The spans are built when the request ends, from the times noted on the
way (`start_time` / `end_time` are the API's own arguments): a burst of
arrivals then costs the event loop one small record each, not two SDK spans
with their attributes while the model thread waits on the GIL for the
prompts' first tokens. Measured on the whole stack (bench/peer_stack_vs_vllm.py
--tracing-overhead): spans started on arrival put ~100 ms on the p99 TTFT of
a 64-stream burst. With tracing off (no SDK provider installed) nothing is
kept at all.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from opentelemetry import trace

from sluice.engine.plan import RequestOutput
from sluice.engine.request import ServiceClass
from sluice.replica.engine_metrics import CLASS_NAMES
from sluice.replica.requests import SERVICE_CLASSES
from sluice.telemetry import spans
from sluice.telemetry.tracing import tracing_installed
from sluice.v1 import replica_pb2


@dataclass(slots=True)
class _Noted:
    """What the spans of one request will say; written on the event loop only."""

    carrier: Mapping[str, str]  # the router's trace context, parsed only at the end
    class_name: str
    prompt_tokens: int
    arrived_ns: int
    first_token_ns: int = 0  # 0: no token yet (still prefilling)
    cached_prompt_tokens: int = 0


class RequestSpans:
    def __init__(self, model_version: str, replica_id: str, tracer: trace.Tracer | None = None) -> None:
        self._tracer = tracer or trace.get_tracer("sluice.replica")
        self._on = tracer is not None or tracing_installed()
        self._attributes = {spans.MODEL: model_version, spans.REPLICA: replica_id}
        self._open: dict[str, _Noted] = {}  # request id -> what its spans will say

    def arrived(self, request: replica_pb2.TokenRequest) -> None:
        if not self._on:
            return
        service_class = SERVICE_CLASSES.get(request.service_class, ServiceClass.INTERACTIVE)
        self._open[request.request_id] = _Noted(
            dict(request.trace_context), CLASS_NAMES[service_class], len(request.prompt_token_ids), time.time_ns())

    def produced(self, request_id: str, outputs: list[RequestOutput]) -> None:
        """The outputs the engine made for it since the last call."""
        noted = self._open.get(request_id)
        if noted is None or not outputs:
            return
        last = outputs[-1]
        if not noted.first_token_ns and any(output.new_token_ids for output in outputs):
            noted.first_token_ns = time.time_ns()
            noted.cached_prompt_tokens = last.num_cached_tokens
        if last.finished:
            del self._open[request_id]
            self._emit(request_id, noted, last.finish_reason.value, output_tokens=last.num_output_tokens)

    def ended(self, request_id: str, outcome: str, *, failed: bool = False) -> None:
        """It ended without finishing: cancelled by the caller, or failed."""
        noted = self._open.pop(request_id, None)
        if noted is not None:
            self._emit(request_id, noted, outcome, failed=failed)

    def _emit(self, request_id: str, noted: _Noted, outcome: str, *, output_tokens: int | None = None,
              failed: bool = False) -> None:
        now_ns = time.time_ns()
        parent = spans.request_parent(noted.carrier)
        prefill = self._tracer.start_span("replica.prefill", context=parent, start_time=noted.arrived_ns, attributes={
            **self._attributes, spans.REQUEST_ID: request_id, spans.SERVICE_CLASS: noted.class_name,
            spans.PROMPT_TOKENS: noted.prompt_tokens,
        })
        if not noted.first_token_ns:  # it ended before its first token
            last = prefill
        else:
            prefill.set_attribute(spans.CACHED_PROMPT_TOKENS, noted.cached_prompt_tokens)
            spans.end_with_outcome(prefill, "first_token", end_time_ns=noted.first_token_ns)
            last = self._tracer.start_span("replica.decode", context=parent, start_time=noted.first_token_ns,
                                           attributes={**self._attributes, spans.REQUEST_ID: request_id})
        if output_tokens is not None:
            last.add_event("finished", {"sluice.finish_reason": outcome}, timestamp=now_ns)
            last.set_attribute(spans.OUTPUT_TOKENS, output_tokens)
        spans.end_with_outcome(last, outcome, failed=failed, end_time_ns=now_ns)
