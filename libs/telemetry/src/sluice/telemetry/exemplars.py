"""The exemplar that links a histogram observation to the trace it came from.

prometheus_client attaches exemplars with ``Histogram.observe(value,
exemplar=...)`` and serves them in the OpenMetrics exposition only. An
exemplar is only useful when the trace it names will exist in the tracing
backend, so a span that is not sampled (or the no-op span when tracing is
off) gives none.
"""

from __future__ import annotations

from opentelemetry import trace


def current_exemplar() -> dict[str, str] | None:
    """``{"trace_id": <32 hex>}`` for the current span if it is recording
    and sampled, else ``None`` (pass straight to ``observe(exemplar=...)``)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return None
    context = span.get_span_context()
    if not (context.is_valid and context.trace_flags.sampled):
        return None
    return {"trace_id": trace.format_trace_id(context.trace_id)}
