"""Logs an SRE can query: one JSON object per line, with the trace.

Fields: ``ts`` (UTC, ISO 8601, ms), ``level``, ``logger``, ``message``,
``service``, ``trace_id``/``span_id`` when a span is current (so a log line
leads to its trace), ``request_id`` when the call passes
``extra={"request_id": ...}``, and ``exc`` for an exception's traceback.
Prompt and output text are never logged, in either format.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from opentelemetry import trace

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self._service = service

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "service": self._service,
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            entry["trace_id"] = trace.format_trace_id(context.trace_id)
            entry["span_id"] = trace.format_span_id(context.span_id)
        request_id = getattr(record, "request_id", None)
        if request_id:
            entry["request_id"] = str(request_id)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: str = "text", service: str = "sluice") -> None:
    """Configure the root logger once per process: `fmt` is "text" (for a
    terminal, `make run`) or "json" (one object per line, the chart's
    default)."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {LOG_FORMATS}, not {fmt!r}")
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter(service) if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.captureWarnings(True)  # Python warnings as log lines in the same format, not bare stderr
