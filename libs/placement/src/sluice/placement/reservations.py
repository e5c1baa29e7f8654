"""The scheduler's reservation ledger: KV blocks promised per replica.

A reservation lives from dispatch until the router releases the request
(finished, failed or cancelled) or the router's placement stream breaks,
whichever comes first. Each reservation is owned by one router stream so a
vanished router cannot leak capacity.
"""

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Reservation:
    request_id: str
    owner: str  # the router stream that placed it
    replica_id: str
    kv_blocks: int
    granted_at_s: float


class ReservationLedger:
    def __init__(self) -> None:
        self._by_request: dict[str, Reservation] = {}
        self._blocks_by_replica: dict[str, int] = defaultdict(int)

    def reserve(self, reservation: Reservation) -> None:
        if reservation.request_id in self._by_request:
            raise ValueError(f"request {reservation.request_id} already holds a reservation")
        self._by_request[reservation.request_id] = reservation
        self._blocks_by_replica[reservation.replica_id] += reservation.kv_blocks

    def release(self, request_id: str, owner: str) -> Reservation | None:
        reservation = self._by_request.get(request_id)
        if reservation is None or reservation.owner != owner:
            return None
        del self._by_request[request_id]
        self._blocks_by_replica[reservation.replica_id] -= reservation.kv_blocks
        return reservation

    def release_owner(self, owner: str) -> list[Reservation]:
        """Drop everything a broken router stream held."""
        dropped = [r for r in self._by_request.values() if r.owner == owner]
        for reservation in dropped:
            self.release(reservation.request_id, owner)
        return dropped

    def reserved_kv_blocks(self) -> dict[str, int]:
        return {replica: blocks for replica, blocks in self._blocks_by_replica.items() if blocks}

    def __len__(self) -> int:
        return len(self._by_request)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._by_request
