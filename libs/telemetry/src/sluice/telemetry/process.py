"""What every service process sets up for its telemetry, and tears down.

    with service_telemetry("router", settings.log_level, settings.log_format):
        asyncio.run(serve(settings))

Logging goes to the format asked for (sluice.telemetry.json_logs); tracing
is on only when an OTLP endpoint is configured (sluice.telemetry.tracing),
under the service name `sluice-<service>`, and the spans still batched are
flushed however the block ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sluice.telemetry.json_logs import configure_logging
from sluice.telemetry.tracing import configure_tracing


@contextlib.contextmanager
def service_telemetry(service: str, log_level: str, log_format: str) -> Iterator[None]:
    configure_logging(log_level, log_format, service)
    tracing = configure_tracing(f"sluice-{service}")
    try:
        yield
    finally:
        if tracing is not None:
            tracing.shutdown()  # flush the spans still batched
