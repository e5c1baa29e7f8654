"""Turning OpenTelemetry tracing on for one service.

Tracing is on only when an OTLP endpoint is configured (the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``),
and off whenever ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``.
Off means no provider is installed at all: the API's default tracer hands
out one shared non-recording span, so an instrumented hot path allocates no
span objects and exports nothing.

The exporter is OTLP over HTTP/protobuf (lighter than the gRPC exporter)
and reads the standard variables itself (headers, timeout, compression);
the batch processor reads ``OTEL_BSP_*`` (schedule delay, queue size).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def tracing_requested(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces to be exported."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def tracing_installed() -> bool:
    """Whether configure_tracing (or a test) installed an SDK provider: what
    lets a hot path skip even the bookkeeping for spans it would not record."""
    return isinstance(trace.get_tracer_provider(), TracerProvider)


def make_tracer_provider(service_name: str, exporter: SpanExporter) -> TracerProvider:
    """An SDK provider exporting through `exporter` in batches, named
    `service_name` (what a trace view shows per span). Tests pass their own
    in-memory exporter."""
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def configure_tracing(service_name: str, environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """Install the global tracer provider when tracing is requested and
    return it (call ``shutdown()`` on exit to flush); ``None`` when off."""
    environ = os.environ if environ is None else environ
    if not tracing_requested(environ):
        return None
    # Imported here: the exporter pulls in requests/urllib3, which a service
    # with tracing off never needs to load.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    provider = make_tracer_provider(service_name, OTLPSpanExporter())
    trace.set_tracer_provider(provider)
    return provider
