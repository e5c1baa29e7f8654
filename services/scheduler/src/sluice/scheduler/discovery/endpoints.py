"""Which replica addresses a set of EndpointSlices says may take requests.
Pure: the `kubernetes` client's models in, plain values out; the watch
adapter (endpoint_slices.py) keeps the slices and logs what this returns.

A Service's endpoints are spread over one or more EndpointSlices (the
controller splits at 100 endpoints and moves them while pods churn):

    Service replica-v1 -> slice replica-v1-abcde  endpoints [10.0.0.5 ready, 10.0.0.6 not ready]
                       -> slice replica-v1-fghij  endpoints [10.0.0.7 ready, terminating]

An endpoint counts when `conditions.ready` is true, or unset (the API says a
nil ready means ready), and it is not terminating. `serving` is not used: a
terminating pod that still serves is draining and takes no new placements.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from kubernetes.client import V1Endpoint, V1EndpointSlice

SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class EndpointCondition(StrEnum):
    # Ordered from least to most ready: when two slices list one address
    # (a pod moving between slices), the less ready reading wins, so a pod
    # that any slice reports going away leaves placement.
    TERMINATING = "terminating"
    NOT_READY = "not ready"
    READY = "ready"


_RANK = {EndpointCondition.TERMINATING: 0, EndpointCondition.NOT_READY: 1, EndpointCondition.READY: 2}


@dataclass(slots=True, frozen=True)
class EndpointReading:
    """Every address the slices list, with its condition and service; and the
    slices that had no port of the wanted name (a chart mistake worth a log)."""

    conditions: Mapping[str, EndpointCondition]
    services: Mapping[str, str]  # address -> the Service whose slice lists it
    slices_without_port: tuple[str, ...]

    def ready_addresses(self) -> frozenset[str]:
        return frozenset(a for a, c in self.conditions.items() if c is EndpointCondition.READY)


@dataclass(slots=True, frozen=True)
class MembershipChange:
    added: tuple[str, ...]
    removed: tuple[tuple[str, str], ...]  # (address, why it left)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


def service_selector(services: Iterable[str]) -> str:
    """The label selector for the slices of these Services."""
    names = sorted(set(services))
    if not names:
        raise ValueError("at least one Service name is needed to select EndpointSlices")
    return f"{SERVICE_NAME_LABEL} in ({','.join(names)})"


def condition_of(endpoint: V1Endpoint) -> EndpointCondition:
    conditions = endpoint.conditions
    if conditions is not None and conditions.terminating:
        return EndpointCondition.TERMINATING
    if conditions is not None and conditions.ready is False:
        return EndpointCondition.NOT_READY
    return EndpointCondition.READY


def host_port(address_type: str | None, host: str, port: int) -> str:
    """A gRPC target: IPv6 literals go in brackets."""
    return f"[{host}]:{port}" if address_type == "IPv6" else f"{host}:{port}"


def read_endpoints(slices: Iterable[V1EndpointSlice], port_name: str) -> EndpointReading:
    conditions: dict[str, EndpointCondition] = {}
    services: dict[str, str] = {}
    without_port: list[str] = []
    for endpoint_slice in slices:
        port = next((p.port for p in endpoint_slice.ports or [] if (p.name or "") == port_name and p.port), None)
        if port is None:
            without_port.append(endpoint_slice.metadata.name)
            continue
        service = (endpoint_slice.metadata.labels or {}).get(SERVICE_NAME_LABEL, "")
        for endpoint in endpoint_slice.endpoints or []:
            if not endpoint.addresses:
                continue
            # The addresses of one endpoint are fungible (API docs); the first is the one to dial.
            address = host_port(endpoint_slice.address_type, endpoint.addresses[0], port)
            condition = condition_of(endpoint)
            if address not in conditions or _RANK[condition] < _RANK[conditions[address]]:
                conditions[address] = condition
                services[address] = service
    return EndpointReading(conditions, services, tuple(sorted(without_port)))


def membership_change(before: EndpointReading, after: EndpointReading) -> MembershipChange:
    """What joined and left the ready set between two readings, and why each left."""
    was, now = before.ready_addresses(), after.ready_addresses()
    removed = tuple(
        (address, str(after.conditions[address]) if address in after.conditions else "gone from the EndpointSlices")
        for address in sorted(was - now)
    )
    return MembershipChange(tuple(sorted(now - was)), removed)


EMPTY_READING = EndpointReading({}, {}, ())
