"""Which prompt blocks each replica holds in its prefix cache.

Replicas report their cache as deltas on the state stream (block hashes
stored and evicted; a snapshot on a new stream or after the replica dropped
deltas). A hit is a run of leading blocks: the hashes chain through their
parents, so block i can only match if blocks 0..i-1 do.
"""

from collections.abc import Iterable, Sequence


class PrefixIndex:
    def __init__(self) -> None:
        self._by_replica: dict[str, set[bytes]] = {}

    def apply(
        self, replica_id: str, stored: Iterable[bytes], evicted: Iterable[bytes], snapshot: bool = False
    ) -> None:
        held = self._by_replica.setdefault(replica_id, set())
        if snapshot:
            held.clear()
        held.difference_update(evicted)
        held.update(stored)

    def forget(self, replica_id: str) -> None:
        self._by_replica.pop(replica_id, None)

    def matched_blocks(self, replica_id: str, block_hashes: Sequence[bytes]) -> int:
        held = self._by_replica.get(replica_id)
        if not held:
            return 0
        matched = 0
        for block_hash in block_hashes:
            if block_hash not in held:
                break
            matched += 1
        return matched

    def num_blocks(self, replica_id: str) -> int:
        return len(self._by_replica.get(replica_id, ()))
