"""What the routes share, built once by the app factory."""

from dataclasses import dataclass

from sluice.gateway.auth import Authenticator
from sluice.gateway.background import BackgroundTasks
from sluice.gateway.front_door import FrontDoor
from sluice.gateway.metrics import GatewayMetrics
from sluice.gateway.resources import GatewayResources
from sluice.gateway.router_client import RouterClient
from sluice.gateway.settings import GatewaySettings
from sluice.gateway.tenant_backoff import TenantBackoff
from sluice.gateway.translate import StreamDeadline


@dataclass(frozen=True, slots=True)
class GatewayState:
    settings: GatewaySettings
    router: RouterClient
    authenticator: Authenticator
    metrics: GatewayMetrics
    resources: GatewayResources
    front_door: FrontDoor
    background: BackgroundTasks
    backoff: TenantBackoff
    stream_deadline: StreamDeadline | None = None
