"""What a request of each class may still reserve on one replica.

    batch        min(total - reserved, reported free - reserved since that report)
                 and, while interactive work is in the pool, at most
                 batch_max_share of the replica's blocks and seats
    interactive  total - interactive reserved: batch is preemptible, the
                 replica preempts it by recompute for a waiting interactive

So interactive reservations never exceed a replica's capacity; batch is
only ever dispatched into KV nobody has reserved; the sum of both can pass
capacity only by batch work that interactive displaced.

A request from a tenant that is not critical also leaves the replica's
critical reserve alone: `reserve_kv_blocks` / `reserve_seats` (what of the
reserve critical tenants do not hold yet) come off its headroom.
"""

from dataclasses import dataclass

from sluice.placement.asks import ServiceClass
from sluice.placement.replica_choice import ReplicaView
from sluice.placement.reservations import ReplicaHolding

# A replica that does not report max_num_seqs: seats are not its limit.
UNBOUNDED_SEATS = 1 << 20


@dataclass(frozen=True, slots=True)
class Headroom:
    kv_blocks: int
    seats: int
    load: float  # 0..1, the larger of KV and seat utilisation by every class


def seats_of(view: ReplicaView) -> int:
    return view.max_num_seqs or UNBOUNDED_SEATS


def headroom(
    view: ReplicaView,
    holding: ReplicaHolding,
    unseen_kv_blocks: int,
    service_class: ServiceClass,
    interactive_present: bool,
    batch_max_share: float,
    reserve_kv_blocks: int = 0,
    reserve_seats: int = 0,
) -> Headroom:
    total_blocks = view.total_kv_blocks
    total_seats = seats_of(view)
    load = max(
        holding.total_kv_blocks / max(total_blocks, 1),
        holding.total_seats / total_seats if view.max_num_seqs else 0.0,
    )
    if service_class is ServiceClass.INTERACTIVE:
        kv = total_blocks - holding.kv_blocks[ServiceClass.INTERACTIVE]
        seats = total_seats - holding.seats[ServiceClass.INTERACTIVE]
        return Headroom(kv - reserve_kv_blocks, seats - reserve_seats, load)
    kv = min(total_blocks - holding.total_kv_blocks, view.free_kv_blocks - unseen_kv_blocks)
    seats = total_seats - holding.total_seats
    if interactive_present:
        kv = min(kv, int(batch_max_share * total_blocks) - holding.kv_blocks[ServiceClass.BATCH])
        seats = min(seats, int(batch_max_share * total_seats) - holding.seats[ServiceClass.BATCH])
    return Headroom(kv - reserve_kv_blocks, seats - reserve_seats, load)
