import json
import logging

import pytest
from opentelemetry.sdk.trace import TracerProvider

from sluice.telemetry.json_logs import JsonFormatter, configure_logging


def _record(message: str, **extra) -> logging.LogRecord:
    record = logging.LogRecord("sluice.test", logging.WARNING, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    return record


def test_one_json_object_with_the_fields():
    line = JsonFormatter("router").format(_record("queue %s", request_id="req-1"))
    entry = json.loads(line)
    assert entry["level"] == "WARNING"
    assert entry["logger"] == "sluice.test"
    assert entry["message"] == "queue %s"
    assert entry["service"] == "router"
    assert entry["request_id"] == "req-1"
    assert entry["ts"].endswith("+00:00")
    assert "trace_id" not in entry and "span_id" not in entry
    assert "\n" not in line


def test_the_current_span_is_named():
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("work") as span:
        entry = json.loads(JsonFormatter("gateway").format(_record("hello")))
    context = span.get_span_context()
    assert entry["trace_id"] == format(context.trace_id, "032x")
    assert entry["span_id"] == format(context.span_id, "016x")


def test_an_exception_is_kept_on_the_line():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), exc_info=__import__("sys").exc_info())
    entry = json.loads(JsonFormatter("replica").format(record))
    assert "RuntimeError: boom" in entry["exc"]


def test_configure_logging_rejects_an_unknown_format():
    with pytest.raises(ValueError):
        configure_logging("INFO", "xml")


def test_configure_logging_json(capsys):
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        configure_logging("DEBUG", "json", "scheduler")
        logging.getLogger("sluice.x").debug("placed")
        entry = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert (entry["service"], entry["message"], entry["level"]) == ("scheduler", "placed", "DEBUG")
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
