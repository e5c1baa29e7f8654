"""python -m sluice.gateway"""

import uvicorn

from sluice.gateway.app import create_app
from sluice.gateway.http_edge import EdgeLimits, edge_protocol
from sluice.gateway.settings import GatewaySettings
from sluice.telemetry.process import freeze_startup_heap, service_telemetry


def main() -> None:
    settings = GatewaySettings()
    # uvicorn handles SIGTERM: stop accepting, let responses finish for up
    # to the grace period, then close what is left (cancelling streams).
    limits = EdgeLimits(
        header_timeout_s=settings.http_header_timeout_s,
        max_connections=settings.http_max_connections,
        max_connections_per_client=settings.http_max_connections_per_client,
        write_timeout_s=settings.http_write_timeout_s,
        max_header_bytes=settings.http_max_header_bytes,
    )
    with service_telemetry("gateway", settings.log_level, settings.log_format):
        uvicorn.run(
            # Once its stores, keys and router channel are open, what lives
            # as long as the process is in and the per-request heap is not.
            create_app(settings, limits, on_started=freeze_startup_heap),
            host=settings.gateway_host,
            port=settings.gateway_port,
            log_level=settings.log_level.lower(),
            log_config=None,  # uvicorn's loggers go through ours (SLUICE_LOG_FORMAT), not its own formatters
            timeout_graceful_shutdown=int(settings.shutdown_grace_s),
            access_log=False,
            http=edge_protocol(limits),
            loop="auto",  # uvloop where installed (a gateway dependency off Windows), else asyncio
            timeout_keep_alive=int(settings.http_keep_alive_timeout_s),
        )


if __name__ == "__main__":
    main()
