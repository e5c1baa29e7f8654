"""What the routes share, built once by the app factory."""

from dataclasses import dataclass

from sluice.gateway.auth import Authenticator
from sluice.gateway.metrics import GatewayMetrics
from sluice.gateway.router_client import RouterClient
from sluice.gateway.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class GatewayState:
    settings: GatewaySettings
    router: RouterClient
    authenticator: Authenticator
    metrics: GatewayMetrics
