"""What every service process sets up for its telemetry, and tears down;
and what it does to its heap once it has started.

    with service_telemetry("router", settings.log_level, settings.log_format):
        asyncio.run(serve(settings))      # which calls freeze_startup_heap() once serving

Logging goes to the format asked for (sluice.telemetry.json_logs); tracing
is on only when an OTLP endpoint is configured (sluice.telemetry.tracing),
under the service name `sluice-<service>`, and the spans still batched are
flushed however the block ends.
"""

from __future__ import annotations

import contextlib
import gc
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


def freeze_startup_heap() -> None:
    """Once the process has started (imports done, app, channels and model
    built): collect, then move every object still alive into the
    collector's permanent generation, which no later collection walks.

    Why: a full (generation 2) collection walks every tracked object, and
    a service's start-up leaves hundreds of thousands of them (modules,
    pydantic and protobuf classes, the OpenAPI document) that live as long
    as the process. Under load, full collections come every few seconds,
    each stopping the event loop (or, in a replica, every thread holding
    the GIL): measured on 2 cores beside a 64-request flood, 40-77 ms
    pauses in the gateway and 40-137 ms in the replica, which are the
    slowest first tokens another tenant saw. After the freeze a full
    collection walks only what was made since start-up.
    """
    gc.collect()
    gc.freeze()
