"""Span helpers shared by the services: one attribute vocabulary, and the
parent a request's spans hang under.

Attributes name the request (id, model, class, tenant name) and its token
counts and outcome; never prompt or output text.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, Status, StatusCode

from sluice.telemetry.carrier import extract_trace_context

REQUEST_ID = "sluice.request_id"
MODEL = "sluice.model"
SERVICE_CLASS = "sluice.class"
TENANT = "sluice.tenant"
PROMPT_TOKENS = "sluice.prompt_tokens"
CACHED_PROMPT_TOKENS = "sluice.cached_prompt_tokens"
OUTPUT_TOKENS = "sluice.output_tokens"
OUTCOME = "sluice.outcome"
REPLICA = "sluice.replica"


def request_parent(carrier: Mapping[str, str] | None) -> Context:
    """The context a request's first span on this hop starts in: the one
    its message carries (a multiplexed stream), else the current one (a
    call of its own, whose context the gRPC interceptor already set)."""
    if carrier:
        return extract_trace_context(carrier)
    return otel_context.get_current()


def end_with_outcome(span: Span, outcome: str, *, failed: bool = False, end_time_ns: int | None = None) -> None:
    """Record how the request's part here ended, and end the span (now, or
    at `end_time_ns` for a span built after the fact)."""
    span.set_attribute(OUTCOME, outcome)
    if failed:
        span.set_status(Status(StatusCode.ERROR, outcome))
    span.end(end_time=end_time_ns)


def child_context(span: Span) -> Context:
    """A context whose current span is `span`: what to inject into the next
    hop's message, or to start a child span in."""
    return trace.set_span_in_context(span, Context())


class current_span:  # noqa: N801 (used like the tracer's own context managers)
    """A span around a block, current inside it, ended however it ends.

    A plain class rather than ``tracer.start_as_current_span``: that one is a
    generator context manager, and an exception leaving it has its
    ``__traceback__`` rewritten, which a frozen-dataclass exception (the
    gateway's ApiError) refuses with a TypeError.
    """

    def __init__(self, tracer: trace.Tracer, name: str, attributes: dict | None = None) -> None:
        self._tracer = tracer
        self._name = name
        self._attributes = attributes
        self._span: Span | None = None
        self._token: object | None = None

    def __enter__(self) -> Span:
        self._span = self._tracer.start_span(self._name, attributes=self._attributes)
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, exc_type, exc, traceback) -> bool:
        otel_context.detach(self._token)
        if exc is not None:
            self._span.set_status(Status(StatusCode.ERROR, exc_type.__name__))
        self._span.end()
        return False
