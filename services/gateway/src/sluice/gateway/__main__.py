"""python -m sluice.gateway"""

import uvicorn

from sluice.config import configure_logging
from sluice.gateway.app import create_app
from sluice.gateway.settings import GatewaySettings


def main() -> None:
    settings = GatewaySettings()
    configure_logging(settings.log_level)
    # uvicorn handles SIGTERM: stop accepting, let responses finish for up
    # to the grace period, then close what is left (cancelling streams).
    uvicorn.run(
        create_app(settings),
        host=settings.gateway_host,
        port=settings.gateway_port,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
        access_log=False,
    )


if __name__ == "__main__":
    main()
