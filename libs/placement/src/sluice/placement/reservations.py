"""The scheduler's reservation ledger: KV blocks and seats promised per
replica, from dispatch until the router releases the request (finished,
failed or cancelled) or its placement stream breaks, whichever is first.
Each reservation is owned by one router stream, so a vanished router cannot
leak capacity. Only `ClusterScheduler` writes it.
"""

import dataclasses
from collections import defaultdict
from dataclasses import dataclass

from sluice.placement.asks import ServiceClass


@dataclass(frozen=True, slots=True)
class Reservation:
    request_id: str
    owner: str
    tenant: str
    model_version: str
    replica_id: str
    service_class: ServiceClass
    prompt_tokens: int
    output_tokens: int  # the bounded output charged at dispatch
    kv_blocks: int
    is_long: bool
    granted_at_s: float
    started_at_s: float | None = None  # first token seen (prefill over)
    critical: bool = False  # a critical tenant's: counts toward the critical reserve
    output_cap_tokens: int = 0  # the overload cap it was granted under; 0 = none
    # What the scheduler predicted at dispatch: seconds to its first token
    # and per output token after it. Its finish is checked against them
    # (how late the pool's predictions run; 0 = none made).
    predicted_first_token_s: float = 0.0
    predicted_per_token_s: float = 0.0


@dataclass(slots=True)
class ReplicaHolding:
    kv_blocks: list[int] = dataclasses.field(default_factory=lambda: [0, 0])  # by ServiceClass
    seats: list[int] = dataclasses.field(default_factory=lambda: [0, 0])
    # Of the above (both classes), what critical tenants hold.
    critical_kv_blocks: int = 0
    critical_seats: int = 0

    @property
    def total_kv_blocks(self) -> int:
        return sum(self.kv_blocks)

    @property
    def total_seats(self) -> int:
        return sum(self.seats)


class ReservationLedger:
    def __init__(self) -> None:
        self._by_request: dict[str, Reservation] = {}
        self._by_replica: dict[str, ReplicaHolding] = defaultdict(ReplicaHolding)
        # (model_version, tenant, class) -> [seqs, blocks]
        self._by_tenant: dict[tuple[str, str, ServiceClass], list[int]] = defaultdict(lambda: [0, 0])

    def reserve(self, reservation: Reservation) -> None:
        if reservation.request_id in self._by_request:
            raise ValueError(f"request {reservation.request_id} already holds a reservation")
        self._by_request[reservation.request_id] = reservation
        self._apply(reservation, +1)

    def mark_started(self, request_id: str, now_s: float) -> Reservation | None:
        reservation = self._by_request.get(request_id)
        if reservation is None or reservation.started_at_s is not None:
            return None
        started = dataclasses.replace(reservation, started_at_s=now_s)
        self._by_request[request_id] = started
        return started

    def release(self, request_id: str, owner: str | None = None) -> Reservation | None:
        reservation = self._by_request.get(request_id)
        if reservation is None or (owner is not None and reservation.owner != owner):
            return None
        del self._by_request[request_id]
        self._apply(reservation, -1)
        return reservation

    def release_owner(self, owner: str) -> list[Reservation]:
        dropped = [r for r in self._by_request.values() if r.owner == owner]
        for reservation in dropped:
            self.release(reservation.request_id)
        return dropped

    def get(self, request_id: str) -> Reservation | None:
        return self._by_request.get(request_id)

    def holding(self, replica_id: str) -> ReplicaHolding:
        return self._by_replica.get(replica_id) or ReplicaHolding()

    def tenant_holding(
        self, model_version: str, tenant: str, service_class: ServiceClass | None = None
    ) -> tuple[int, int]:
        """(sequences, KV blocks) the tenant holds in the pool: in one class, or in all."""
        classes = list(ServiceClass) if service_class is None else [service_class]
        seqs = blocks = 0
        for c in classes:
            held = self._by_tenant.get((model_version, tenant, c), (0, 0))
            seqs += held[0]
            blocks += held[1]
        return seqs, blocks

    def reservations(self) -> list[Reservation]:
        return list(self._by_request.values())

    def on_replica(self, replica_id: str) -> list[Reservation]:
        return [r for r in self._by_request.values() if r.replica_id == replica_id]

    def reserved_kv_blocks(self) -> dict[str, int]:
        return {replica: h.total_kv_blocks for replica, h in self._by_replica.items() if h.total_kv_blocks}

    def __len__(self) -> int:
        return len(self._by_request)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_request

    def _apply(self, reservation: Reservation, sign: int) -> None:
        holding = self._by_replica[reservation.replica_id]
        holding.kv_blocks[reservation.service_class] += sign * reservation.kv_blocks
        holding.seats[reservation.service_class] += sign
        if reservation.critical:
            holding.critical_kv_blocks += sign * reservation.kv_blocks
            holding.critical_seats += sign
        tenant_key = (reservation.model_version, reservation.tenant, reservation.service_class)
        tenant = self._by_tenant[tenant_key]
        tenant[0] += sign
        tenant[1] += sign * reservation.kv_blocks
        if holding.total_seats == 0:
            del self._by_replica[reservation.replica_id]
        if tenant[0] == 0:
            del self._by_tenant[tenant_key]
