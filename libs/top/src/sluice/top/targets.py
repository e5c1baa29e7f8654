"""Which /metrics pages `sluice top` reads.

A flag wins over the environment, the environment over the local defaults
(the ports `sluice.devstack` and `make run` use: scheduler metrics 9052,
router metrics 9051, first replica's metrics 9061, gateway HTTP 8000).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from sluice.devstack.stack import StackPorts


class TargetKind(str, Enum):
    SCHEDULER = "scheduler"
    ROUTER = "router"
    GATEWAY = "gateway"
    REPLICA = "replica"


@dataclass(frozen=True, slots=True)
class Target:
    kind: TargetKind
    url: str


_LOCAL = StackPorts()  # make run's ports
DEFAULT_SCHEDULER_URL = f"http://127.0.0.1:{_LOCAL.scheduler_metrics}/metrics"
DEFAULT_ROUTER_URL = f"http://127.0.0.1:{_LOCAL.router_metrics}/metrics"
DEFAULT_GATEWAY_URL = f"http://127.0.0.1:{_LOCAL.gateway}/metrics"
DEFAULT_REPLICA_URLS = (f"http://127.0.0.1:{_LOCAL.replica_metrics}/metrics",)

# One variable per flag; SLUICE_TOP_REPLICA_URLS is comma-separated.
ENV_SCHEDULER_URL = "SLUICE_TOP_SCHEDULER_URL"
ENV_ROUTER_URL = "SLUICE_TOP_ROUTER_URL"
ENV_GATEWAY_URL = "SLUICE_TOP_GATEWAY_URL"
ENV_REPLICA_URLS = "SLUICE_TOP_REPLICA_URLS"


def metrics_url(url: str) -> str:
    """`http://host:port` alone means its /metrics page."""
    stripped = url.rstrip("/")
    scheme_end = stripped.find("://")
    path_start = stripped.find("/", scheme_end + 3 if scheme_end >= 0 else 0)
    return stripped + "/metrics" if path_start < 0 else url


def resolve_targets(
    env: Mapping[str, str],
    scheduler: str | None = None,
    router: str | None = None,
    gateway: str | None = None,
    replicas: Sequence[str] = (),
) -> tuple[Target, ...]:
    """The targets in display order: scheduler, router, gateway, replicas."""
    def pick(flag: str | None, name: str, default: str) -> str:
        return metrics_url(flag or env.get(name) or default)

    replica_urls = tuple(replicas) or tuple(u.strip() for u in env.get(ENV_REPLICA_URLS, "").split(",") if u.strip())
    return (
        Target(TargetKind.SCHEDULER, pick(scheduler, ENV_SCHEDULER_URL, DEFAULT_SCHEDULER_URL)),
        Target(TargetKind.ROUTER, pick(router, ENV_ROUTER_URL, DEFAULT_ROUTER_URL)),
        Target(TargetKind.GATEWAY, pick(gateway, ENV_GATEWAY_URL, DEFAULT_GATEWAY_URL)),
        *(Target(TargetKind.REPLICA, metrics_url(url)) for url in replica_urls or DEFAULT_REPLICA_URLS),
    )
