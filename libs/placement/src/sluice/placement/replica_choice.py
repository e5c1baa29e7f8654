"""Choose a replica for a request from the replicas' reported state.

The scheduler keeps a reservation ledger (KV blocks promised to dispatched,
unfinished requests) per replica; a replica's headroom is its total blocks
less what is reserved there. Free-GPU percentage is never the signal.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

# A replica whose last state report is older than this is treated as gone:
# its state stream broke or it stopped stepping.
STALE_STATE_S = 5.0


@dataclass(frozen=True, slots=True)
class ReplicaView:
    replica_id: str
    address: str
    model_version: str
    total_kv_blocks: int
    free_kv_blocks: int
    block_size_tokens: int
    num_running: int
    num_waiting: int
    ready: bool
    seen_at_s: float


@dataclass(frozen=True, slots=True)
class PlacementAsk:
    request_id: str
    tenant: str
    model_version: str
    prompt_tokens: int
    max_output_tokens: int


@dataclass(frozen=True, slots=True)
class DispatchDecision:
    replica_id: str
    address: str
    reserved_kv_blocks: int


@dataclass(frozen=True, slots=True)
class RejectDecision:
    reason: str
    message: str
    retry_after_s: float


def blocks_to_reserve(ask: PlacementAsk, block_size_tokens: int) -> int:
    return -(-(ask.prompt_tokens + ask.max_output_tokens) // block_size_tokens)


def choose_replica(
    ask: PlacementAsk,
    replicas: Iterable[ReplicaView],
    reserved_kv_blocks: Mapping[str, int],
    now_s: float,
) -> DispatchDecision | RejectDecision:
    live = [
        r for r in replicas
        if r.model_version == ask.model_version and r.ready and now_s - r.seen_at_s <= STALE_STATE_S
    ]
    if not live:
        return RejectDecision("no_replica", f"no ready replica serves {ask.model_version}", retry_after_s=1.0)

    def headroom(replica: ReplicaView) -> int:
        return replica.total_kv_blocks - reserved_kv_blocks.get(replica.replica_id, 0)

    fitting = [r for r in live if blocks_to_reserve(ask, r.block_size_tokens) <= headroom(r)]
    if not fitting:
        return RejectDecision(
            "over_capacity", f"no replica of {ask.model_version} has KV room for this request", retry_after_s=1.0
        )
    best = max(fitting, key=lambda r: (headroom(r), -(r.num_running + r.num_waiting), r.replica_id))
    return DispatchDecision(best.replica_id, best.address, blocks_to_reserve(ask, best.block_size_tokens))
