"""Prefix-cache keys: chained hashes of full KV blocks.

    tokens   [t0 t1 t2 t3][t4 t5 t6 t7][t8 t9]
    hashes   h0 = H(root, t0..t3)
             h1 = H(h0,   t4..t7)          (t8 t9: not full, never hashed)

A block's key covers every token before it through the chain, so equal keys
mean equal prefixes, and a hit on block i implies blocks 0..i-1 hit too.
blake2b over little-endian int64s is stable across processes and Python
versions (built-in hash() of a tuple is salted per process for str and
changes between versions); 16 bytes make a collision vanishingly unlikely
(~2^-64 at 2^32 cached blocks).
"""

import hashlib
import struct
from collections.abc import Sequence
from typing import NewType

BlockHash = NewType("BlockHash", bytes)

DIGEST_SIZE_BYTES = 16
# Parent of a sequence's first block when its cache is shared with everyone.
ROOT_BLOCK_HASH = BlockHash(b"sluice-kv-prefix")


def root_block_hash(cache_salt: str) -> BlockHash:
    """The parent of a sequence's first block in the cache scope `cache_salt`
    names ("" = shared by all). Requests with different salts never hit each
    other's blocks, so one tenant cannot learn from a fast first token that
    another sent the same prompt."""
    if not cache_salt:
        return ROOT_BLOCK_HASH
    digest = hashlib.blake2b(ROOT_BLOCK_HASH, digest_size=DIGEST_SIZE_BYTES)
    digest.update(cache_salt.encode("utf-8", "surrogatepass"))
    return BlockHash(digest.digest())


def hash_block_tokens(parent: BlockHash, token_ids: Sequence[int]) -> BlockHash:
    digest = hashlib.blake2b(parent, digest_size=DIGEST_SIZE_BYTES)
    digest.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    return BlockHash(digest.digest())


def extend_block_hashes(hashes: list[BlockHash], token_ids: Sequence[int], block_size_tokens: int,
                        root: BlockHash = ROOT_BLOCK_HASH) -> None:
    """Append the hashes of blocks that became full since `hashes` was last
    extended (the first block's parent is `root`, see root_block_hash).
    Tokens are only ever appended, so earlier hashes stay valid."""
    for start in range(len(hashes) * block_size_tokens, len(token_ids) - block_size_tokens + 1, block_size_tokens):
        parent = hashes[-1] if hashes else root
        hashes.append(hash_block_tokens(parent, token_ids[start : start + block_size_tokens]))
