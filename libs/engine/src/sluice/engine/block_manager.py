"""Paged KV bookkeeping: fixed-size blocks, one block table per sequence.

    block_size = 4, sequence of 10 tokens:
    tokens  [t0 t1 t2 t3][t4 t5 t6 t7][t8 t9 __ __]
    table   [   17      ][    3      ][    42     ]   -> slots 17*4+0 .. 42*4+1

Free blocks are reused last-freed-first (their memory is warm). The prefix
cache (hashes of full blocks, ref counts, LRU eviction) extends this class.
"""

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVBlocks:
    """An opaque, read-only view of one sequence's block table."""

    block_ids: tuple[int, ...]


class BlockManager:
    def __init__(self, num_blocks: int, block_size_tokens: int) -> None:
        if num_blocks < 1 or block_size_tokens < 1:
            raise ValueError("num_blocks and block_size_tokens must be >= 1")
        self.num_blocks = num_blocks
        self.block_size_tokens = block_size_tokens
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() takes block 0 first
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size_tokens)

    def _missing_blocks(self, seq_id: str, num_tokens: int) -> int:
        return max(self.blocks_for(num_tokens) - len(self._tables.get(seq_id, ())), 0)

    def can_allocate(self, seq_id: str, num_tokens: int) -> bool:
        """Whether the sequence's table can grow to hold `num_tokens` in total."""
        return self._missing_blocks(seq_id, num_tokens) <= len(self._free)

    def allocate(self, seq_id: str, num_tokens: int) -> KVBlocks | None:
        """Grow the table to hold `num_tokens`; None (and no change) if it cannot."""
        missing = self._missing_blocks(seq_id, num_tokens)
        if missing > len(self._free):
            return None
        table = self._tables.setdefault(seq_id, [])
        for _ in range(missing):
            table.append(self._free.pop())
        return KVBlocks(tuple(table))

    def free(self, seq_id: str) -> None:
        # Reverse so the sequence's first block is the next one reused.
        self._free.extend(reversed(self._tables.pop(seq_id, [])))

    def block_table(self, seq_id: str) -> KVBlocks:
        return KVBlocks(tuple(self._tables.get(seq_id, ())))

    def owned_block_ids(self) -> dict[str, tuple[int, ...]]:
        """Every table, for invariant checks in tests."""
        return {seq_id: tuple(table) for seq_id, table in self._tables.items()}
