"""The replica's prefix-cache log: what WatchState tells each subscriber.

The engine thread records the block manager's drained cache events after
every step; each WatchState stream reads what changed since its previous
message. Events get consecutive sequence numbers; a bounded history keeps
the newest ones, and a mirror set holds every hash cached now:

    history    seq  41       42       43       44        (first_seq = 41)
                    S h7     E h2     S h9     S h2
    mirror     {h1 h7 h9 h2 ...}
    cursor     the seq a subscriber reads next: 43 -> delta {S h9, S h2}
               40 (older than the history) -> snapshot (the mirror)

A delta is the net state of each hash touched since the cursor (its last
event wins), so a hash stored, evicted and stored again in one interval is
sent once, as stored, and each hash is in at most one of the two lists:
a subscriber applies them as set operations, in either order.

Thread safety: `record` (engine thread) and `read_since` (servicer tasks)
take one lock; neither does more than copy under it.
"""

import itertools
import threading
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from sluice.engine.block_hash import BlockHash
from sluice.engine.block_manager import CacheEvent, CacheEventKind


@dataclass(frozen=True, slots=True)
class CacheDelta:
    # True: stored_block_hashes is the whole cache (first read, or the
    # subscriber fell behind the history) and evicted_block_hashes is empty.
    snapshot: bool
    stored_block_hashes: tuple[BlockHash, ...]
    evicted_block_hashes: tuple[BlockHash, ...]
    cursor: int  # pass to the next read_since


class CacheEventLog:
    def __init__(self, max_events: int) -> None:
        if max_events < 1:
            raise ValueError("max_events must be >= 1")
        self._lock = threading.Lock()
        self._history: deque[CacheEvent] = deque(maxlen=max_events)
        self._next_seq = 0  # seq of the next event recorded
        self._cached: set[BlockHash] = set()

    def record(self, events: Iterable[CacheEvent]) -> None:
        """Append events in the order they happened (engine thread)."""
        with self._lock:
            for event in events:
                if event.kind is CacheEventKind.STORED:
                    self._cached.add(event.block_hash)
                else:
                    self._cached.discard(event.block_hash)
                self._history.append(event)
                self._next_seq += 1

    def read_since(self, cursor: int | None) -> CacheDelta:
        """What changed since `cursor` (a previous delta's), or a snapshot
        when `cursor` is None or older than the history."""
        with self._lock:
            first_seq = self._next_seq - len(self._history)
            if cursor is None or cursor < first_seq:
                return CacheDelta(True, tuple(self._cached), (), self._next_seq)
            net: dict[BlockHash, CacheEventKind] = {}
            for event in itertools.islice(self._history, cursor - first_seq, None):
                net[event.block_hash] = event.kind
            next_seq = self._next_seq
        stored = tuple(h for h, kind in net.items() if kind is CacheEventKind.STORED)
        evicted = tuple(h for h, kind in net.items() if kind is CacheEventKind.EVICTED)
        return CacheDelta(False, stored, evicted, next_seq)

    def cached_block_hashes(self) -> frozenset[BlockHash]:
        with self._lock:
            return frozenset(self._cached)
