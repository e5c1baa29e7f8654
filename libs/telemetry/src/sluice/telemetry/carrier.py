"""W3C trace context in a protobuf ``map<string, string> trace_context``.

A multiplexed gRPC stream (GenerateMany, Place) carries many requests, so
the stream's own metadata cannot say which trace a request belongs to: each
request message carries its own ``traceparent``/``tracestate``. The sender
injects the current context into the message's map; the receiver extracts it
and starts its span as a child of it.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from opentelemetry import propagate
from opentelemetry.context import Context


def inject_trace_context(carrier: MutableMapping[str, str], context: Context | None = None) -> None:
    """Write the current (or the given) context's trace headers into the
    message's map field. With tracing off nothing is written."""
    propagate.inject(carrier, context=context)


def extract_trace_context(carrier: MutableMapping[str, str] | None) -> Context:
    """The context the sender injected; an empty one (so a span started in
    it is a root) when the map is empty, e.g. an untraced caller."""
    # A protobuf map is a Mapping, but the default getter wants a dict.
    return propagate.extract(dict(carrier or {}), context=Context())


def trace_headers(context: Context | None = None) -> dict[str, str]:
    """The headers as a dict, for a message built with keyword arguments."""
    headers: dict[str, str] = {}
    propagate.inject(headers, context=context)
    return headers
