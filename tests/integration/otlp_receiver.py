"""A small OTLP/HTTP trace receiver on loopback, standing in for a
collector: it decodes each ExportTraceServiceRequest with the
opentelemetry-proto package and keeps the spans, named by service."""

from __future__ import annotations

import contextlib
import gzip
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    service: str
    span: Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    def attribute(self, key: str) -> object:
        for attribute in self.span.attributes:
            if attribute.key == key:
                value = attribute.value
                return getattr(value, value.WhichOneof("value"))
        return None


class OtlpReceiver:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's spelling)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    @property
    def endpoint(self) -> str:
        """For OTEL_EXPORTER_OTLP_ENDPOINT (the exporter appends /v1/traces)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def _add(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                received.extend(ReceivedSpan(service, span) for span in scope_spans.spans)
        with self._lock:
            self._spans.extend(received)

    @contextlib.contextmanager
    def running(self) -> Iterator[OtlpReceiver]:
        thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()


def tracing_env(endpoint: str) -> dict[str, str]:
    """What a service needs to export to `endpoint` quickly."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms between exports: spans arrive while the test waits
    }
