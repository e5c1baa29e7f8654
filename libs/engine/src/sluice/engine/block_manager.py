"""Paged KV bookkeeping with a prefix cache.

    block_size = 4, sequence of 10 tokens:
    tokens  [t0 t1 t2 t3][t4 t5 t6 t7][t8 t9 __ __]
    table   [   17      ][    3      ][    42     ]   -> slots 17*4+0 .. 42*4+1

Each block has a reference count (how many tables hold it) and, once its
tokens are full and computed, a `BlockHash` under which the prefix cache
finds it. A free block is in one of two pools:

    free uncached  LIFO stack: reused first, last freed first (warm memory)
    free cached    LRU: ref count 0 but still a valid cached prefix; evicted
                   oldest first, only when no uncached block is left

so "free" = uncached + cached-free, and free + used == num_blocks always.

Who writes what: only `BlockManager` writes its tables, counts and pools;
the scheduler decides when (allocate on schedule, cache_full_blocks after
update confirmed the tokens were computed, free on finish/preempt/cancel).

Cache events: a hash registered is STORED, a cached block evicted is
EVICTED. They are kept as the net change since the last
`drain_cache_events()` (the replica's engine loop drains them after every
step to tell the cluster scheduler what this cache holds), so an owner that
never drains holds at most one entry per hash stored or evicted since, not
an ever-growing list.
"""

import enum

from collections import Counter, OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

from sluice.engine.block_hash import BlockHash


@dataclass(frozen=True, slots=True)
class KVBlocks:
    """An opaque, read-only view of one sequence's block table."""

    block_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class CachedPrefix:
    """The longest run of cached blocks matching a new sequence's leading
    full blocks; `lookup_prefix` finds it, `allocate` takes it over."""

    block_ids: tuple[int, ...]
    block_hashes: tuple[BlockHash, ...]
    num_tokens: int          # tokens the hit covers: its K/V need not be computed
    num_queried_tokens: int  # tokens of the sequence when it was looked up


class CacheEventKind(enum.Enum):
    STORED = "stored"    # the hash is now cached: a new sequence may hit it
    EVICTED = "evicted"  # the hash is no longer cached


@dataclass(frozen=True, slots=True)
class CacheEvent:
    kind: CacheEventKind
    block_hash: BlockHash


@dataclass(frozen=True, slots=True)
class BlockPoolState:
    """A snapshot of the pool for invariant checks (tests, debugging)."""

    ref_counts: tuple[int, ...]
    cached_block_ids: frozenset[int]    # blocks registered under a hash
    free_uncached: tuple[int, ...]      # next reused last
    free_cached_lru: tuple[int, ...]    # next evicted first
    tables: Mapping[str, tuple[int, ...]]


class BlockManager:
    def __init__(self, num_blocks: int, block_size_tokens: int = 16, free_order: Sequence[int] | None = None) -> None:
        """`free_order`: the order the free blocks are first handed out in
        (default 0, 1, 2, ...). A replica that has served a while hands them
        out scattered over its pool (its LRU evictions are), and on a CPU a
        decode step over scattered blocks costs up to ~40% more than over
        consecutive ones: the calibration times steps in that state."""
        if num_blocks < 1 or block_size_tokens < 1:
            raise ValueError("num_blocks and block_size_tokens must be >= 1")
        if free_order is not None and sorted(free_order) != list(range(num_blocks)):
            raise ValueError(f"free_order must be a permutation of the {num_blocks} block ids")
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        # Per block, by id: how many tables hold it, and the hash it is
        # cached under (None: uncached). Two flat lists rather than an object
        # per block: a 70B replica has ~10^5 blocks, and the simulator builds
        # a pool per replica per run.
        self._ref_counts: list[int] = [0] * num_blocks
        self._hashes: list[BlockHash | None] = [None] * num_blocks
        # pop() takes the first of the order (block 0 by default) first.
        self._free_uncached: list[int] = (list(range(num_blocks - 1, -1, -1)) if free_order is None
                                          else list(reversed(free_order)))
        self._free_cached: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._cached: dict[BlockHash, int] = {}
        self._tables: dict[str, list[int]] = {}
        # Leading blocks of each table that are registered in (or were hit in)
        # the cache, so cache_full_blocks only hashes what is new.
        self._num_cached_blocks: dict[str, int] = {}
        # Prefix cache effectiveness, in tokens, counted once per allocation
        # that starts a table (admission or re-admission after preemption).
        self.prefix_cache_queried_tokens_total = 0
        self.prefix_cache_hit_tokens_total = 0
        # Net cache changes since the last drain, oldest first. A hash is
        # stored only when it is not cached and evicted only when it is, so
        # its events alternate and an opposite event cancels a pending one.
        self._cache_changes: dict[BlockHash, CacheEventKind] = {}

    # -- sizes ---------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation may take: uncached plus evictable cached ones."""
        return len(self._free_uncached) + len(self._free_cached)

    @property
    def num_cached_free_blocks(self) -> int:
        return len(self._free_cached)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size_tokens)

    # -- prefix cache --------------------------------------------------------

    def lookup_prefix(self, block_hashes: Sequence[BlockHash], num_tokens: int) -> CachedPrefix:
        """The cached prefix of a sequence of `num_tokens` whose full blocks
        hash to `block_hashes`. Changes nothing. At least one token is always
        left out of the hit: the step that computes it yields the logits to
        sample from."""
        max_hit_blocks = max(num_tokens - 1, 0) // self.block_size_tokens
        block_ids: list[int] = []
        for block_hash in block_hashes[:max_hit_blocks]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break  # the chain is broken: later blocks cannot match either
            block_ids.append(block_id)
        return CachedPrefix(
            block_ids=tuple(block_ids),
            block_hashes=tuple(block_hashes[: len(block_ids)]),
            num_tokens=len(block_ids) * self.block_size_tokens,
            num_queried_tokens=num_tokens,
        )

    def cache_full_blocks(self, seq_id: str, block_hashes: Sequence[BlockHash], num_computed_tokens: int) -> None:
        """Register the sequence's blocks that are full and computed.

        Call only once the step that wrote them has run (the scheduler does
        it in update): a block registered earlier could be hit by another
        sequence and read before its K/V exist.
        """
        done = self._num_cached_blocks.get(seq_id, 0)
        if num_computed_tokens // self.block_size_tokens <= done:
            return  # no block filled since the last call: most decode steps
        table = self._tables.get(seq_id)
        if table is None:
            return
        full = min(num_computed_tokens // self.block_size_tokens, len(block_hashes), len(table))
        for index in range(done, full):
            block_hash, block_id = block_hashes[index], table[index]
            if self._hashes[block_id] is None and block_hash not in self._cached:
                self._hashes[block_id] = block_hash
                self._cached[block_hash] = block_id
                self._note_cache_change(block_hash, CacheEventKind.STORED)
            # Otherwise an identical block is already cached (two sequences
            # computed the same prefix in the same steps); this copy stays
            # private and goes back to the uncached pool when freed.
        self._num_cached_blocks[seq_id] = max(done, full)

    def cached_block_hashes(self) -> frozenset[BlockHash]:
        """Every hash a lookup can hit now (in use or free)."""
        return frozenset(self._cached)

    def drain_cache_events(self) -> tuple[CacheEvent, ...]:
        """The hashes stored and evicted since the previous drain, each once,
        as their net change (stored then evicted in between: not at all)."""
        if not self._cache_changes:  # most steps (every step of the simulator's replicas drains)
            return ()
        events = tuple(CacheEvent(kind, block_hash) for block_hash, kind in self._cache_changes.items())
        self._cache_changes.clear()
        return events

    # -- check-then-act ------------------------------------------------------

    def can_allocate(self, seq_id: str, num_tokens: int, prefix: CachedPrefix | None = None,
                     after_freeing: Collection[str] = ()) -> bool:
        """Whether the sequence's table can grow to hold `num_tokens` in total
        (starting from `prefix` when the sequence has no table yet); with
        `after_freeing`, whether it could once those tables were freed (the
        scheduler asks before it preempts them)."""
        released = self._num_released_by(after_freeing, prefix) if after_freeing else 0
        return self._blocks_needed(seq_id, num_tokens, prefix) <= self.num_free_blocks + released

    def allocate(self, seq_id: str, num_tokens: int, prefix: CachedPrefix | None = None) -> KVBlocks | None:
        """Grow the table to hold `num_tokens`; None (and no change) if it cannot.

        With `prefix` (only for a sequence without a table) the table starts
        with the prefix's cached blocks, shared with whoever else holds them.
        """
        if self._blocks_needed(seq_id, num_tokens, prefix) > self.num_free_blocks:
            return None
        table = self._tables.setdefault(seq_id, [])
        if prefix is not None:
            # Take the hit blocks before drawing new ones, so that drawing
            # cannot evict them.
            for block_id in prefix.block_ids:
                self._acquire(block_id)
                table.append(block_id)
            self._num_cached_blocks[seq_id] = len(prefix.block_ids)
            self.prefix_cache_queried_tokens_total += prefix.num_queried_tokens
            self.prefix_cache_hit_tokens_total += prefix.num_tokens
        for _ in range(self.blocks_for(num_tokens) - len(table)):
            table.append(self._take_free_block())
        return KVBlocks(tuple(table))

    def free(self, seq_id: str) -> None:
        """Drop the sequence's table. Unknown ids are ignored."""
        table = self._tables.pop(seq_id, [])
        self._num_cached_blocks.pop(seq_id, None)
        # Tail first: its cached blocks enter the LRU earliest and so are
        # evicted before the sequence's head, the part most likely shared;
        # its uncached blocks go deepest into the stack, so the head's are
        # reused first.
        for block_id in reversed(table):
            self._ref_counts[block_id] -= 1
            if self._ref_counts[block_id] == 0:
                if self._hashes[block_id] is None:
                    self._free_uncached.append(block_id)
                else:
                    self._free_cached[block_id] = None

    # -- views ---------------------------------------------------------------

    def block_table(self, seq_id: str) -> KVBlocks:
        return KVBlocks(tuple(self._tables.get(seq_id, ())))

    def owned_block_ids(self) -> dict[str, tuple[int, ...]]:
        """Every table, for invariant checks in tests."""
        return {seq_id: tuple(table) for seq_id, table in self._tables.items()}

    def state(self) -> BlockPoolState:
        return BlockPoolState(
            ref_counts=tuple(self._ref_counts),
            cached_block_ids=frozenset(self._cached.values()),
            free_uncached=tuple(self._free_uncached),
            free_cached_lru=tuple(self._free_cached),
            tables=MappingProxyType(self.owned_block_ids()),
        )

    # -- internals -----------------------------------------------------------

    def _blocks_needed(self, seq_id: str, num_tokens: int, prefix: CachedPrefix | None) -> int:
        """Free blocks the allocation would take: new ones plus cached-free
        blocks of the prefix that it brings back into use."""
        table = self._tables.get(seq_id, ())
        if prefix is None:
            return max(self.blocks_for(num_tokens) - len(table), 0)
        if table:
            raise ValueError(f"sequence {seq_id} already has blocks; a cached prefix only starts a table")
        for block_id, block_hash in zip(prefix.block_ids, prefix.block_hashes, strict=True):
            if self._hashes[block_id] != block_hash:
                raise ValueError(f"stale cached prefix for {seq_id}: look it up again before allocating")
        revived = sum(1 for block_id in prefix.block_ids if self._ref_counts[block_id] == 0)
        return max(self.blocks_for(num_tokens) - len(prefix.block_ids), 0) + revived

    def _num_released_by(self, seq_ids: Collection[str], keep: CachedPrefix | None) -> int:
        """Blocks that freeing the tables of `seq_ids` would return to the free
        pools. Blocks of `keep` are left out: an allocation that takes `keep`
        over would only revive them, so they free nothing for it."""
        holders = Counter(block_id for seq_id in seq_ids for block_id in self._tables.get(seq_id, ()))
        kept = frozenset(keep.block_ids) if keep is not None else frozenset()
        return sum(1 for block_id, count in holders.items()
                   if self._ref_counts[block_id] == count and block_id not in kept)

    def _acquire(self, block_id: int) -> None:
        if self._ref_counts[block_id] == 0:
            del self._free_cached[block_id]
        self._ref_counts[block_id] += 1

    def _note_cache_change(self, block_hash: BlockHash, kind: CacheEventKind) -> None:
        pending = self._cache_changes.pop(block_hash, None)
        if pending is None or pending is kind:
            self._cache_changes[block_hash] = kind
        # else the opposite change was pending: together they change nothing.

    def _take_free_block(self) -> int:
        if self._free_uncached:
            block_id = self._free_uncached.pop()
        else:
            block_id, _ = self._free_cached.popitem(last=False)
            evicted = self._hashes[block_id]
            # Evict: the block's old content is about to be overwritten.
            del self._cached[evicted]  # type: ignore[arg-type]
            self._note_cache_change(evicted, CacheEventKind.EVICTED)  # type: ignore[arg-type]
            self._hashes[block_id] = None
        self._ref_counts[block_id] = 1
        return block_id
