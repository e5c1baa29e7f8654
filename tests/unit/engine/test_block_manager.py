import pytest

from sluice.engine.block_manager import BlockManager


def test_allocate_grows_a_table_to_cover_tokens():
    blocks = BlockManager(num_blocks=8, block_size_tokens=4)
    first = blocks.allocate("a", 5)
    assert first is not None and len(first.block_ids) == 2
    grown = blocks.allocate("a", 8)
    assert grown.block_ids == first.block_ids  # 8 tokens still fit in 2 blocks
    assert len(blocks.allocate("a", 9).block_ids) == 3
    assert blocks.num_free_blocks == 5


def test_allocation_answers_none_and_changes_nothing_when_full():
    blocks = BlockManager(num_blocks=3, block_size_tokens=4)
    blocks.allocate("a", 8)
    assert not blocks.can_allocate("b", 8)
    assert blocks.allocate("b", 8) is None
    assert blocks.num_free_blocks == 1
    assert "b" not in blocks.owned_block_ids()


def test_free_returns_every_block_and_no_block_is_owned_twice():
    blocks = BlockManager(num_blocks=6, block_size_tokens=2)
    blocks.allocate("a", 5)
    blocks.allocate("b", 3)
    owned = [b for table in blocks.owned_block_ids().values() for b in table]
    assert len(owned) == len(set(owned)) == 5
    blocks.free("a")
    blocks.free("b")
    blocks.free("unknown")  # harmless
    assert blocks.num_free_blocks == 6


def test_rejects_nonsense_sizes():
    with pytest.raises(ValueError):
        BlockManager(num_blocks=0, block_size_tokens=16)


# -- prefix cache --------------------------------------------------------------

from sluice.engine.block_hash import ROOT_BLOCK_HASH, extend_block_hashes, hash_block_tokens  # noqa: E402


def _hashes(tokens, block_size):
    hashes = []
    extend_block_hashes(hashes, tokens, block_size)
    return hashes


def _computed(blocks, seq_id, tokens, prefix=None):
    """Allocate for all tokens, then register them as computed."""
    hashes = _hashes(tokens, blocks.block_size_tokens)
    kv = blocks.allocate(seq_id, len(tokens), prefix)
    assert kv is not None
    blocks.cache_full_blocks(seq_id, hashes, len(tokens))
    return kv


def test_block_hashes_chain_through_the_parent_and_are_stable():
    a = _hashes([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(a) == 2  # the partial third block is never hashed
    assert a[0] == hash_block_tokens(ROOT_BLOCK_HASH, [1, 2, 3, 4])
    assert a[1] == hash_block_tokens(a[0], [5, 6, 7, 8])
    # Same block tokens after a different prefix: a different key.
    assert _hashes([9, 9, 9, 9, 5, 6, 7, 8], 4)[1] != a[1]
    # A fixed digest: the key must not change between processes or releases.
    assert hash_block_tokens(ROOT_BLOCK_HASH, [1, 2, 3, 4]).hex() == "12346182e687d83476ada6caf607d613"


def test_lookup_finds_the_longest_cached_prefix_and_leaves_one_token():
    blocks = BlockManager(num_blocks=8, block_size_tokens=4)
    tokens = list(range(10, 22))  # 12 tokens, 3 full blocks
    kv = _computed(blocks, "a", tokens)
    hit = blocks.lookup_prefix(_hashes(tokens, 4), len(tokens))
    # All three blocks are cached, but a hit must leave a token to compute.
    assert hit.block_ids == kv.block_ids[:2] and hit.num_tokens == 8
    longer = tokens + [99, 98, 97]
    assert blocks.lookup_prefix(_hashes(longer, 4), len(longer)).num_tokens == 12
    diverging = tokens[:4] + [0] * 8
    assert blocks.lookup_prefix(_hashes(diverging, 4), len(diverging)).num_tokens == 4


def test_blocks_are_cached_only_once_computed():
    blocks = BlockManager(num_blocks=8, block_size_tokens=4)
    tokens = list(range(1, 10))
    hashes = _hashes(tokens, 4)
    blocks.allocate("a", len(tokens))
    assert blocks.lookup_prefix(hashes, 9).num_tokens == 0  # allocated is not computed
    blocks.cache_full_blocks("a", hashes, num_computed_tokens=6)
    assert blocks.lookup_prefix(hashes, 9).num_tokens == 4
    blocks.cache_full_blocks("a", hashes, num_computed_tokens=9)
    assert blocks.lookup_prefix(hashes, 9).num_tokens == 8


def test_a_hit_shares_blocks_with_ref_counts_and_counts_tokens():
    blocks = BlockManager(num_blocks=8, block_size_tokens=4)
    prompt = list(range(1, 9))
    kv_a = _computed(blocks, "a", prompt + [50])
    b_tokens = prompt + [60, 61]
    hit = blocks.lookup_prefix(_hashes(b_tokens, 4), len(b_tokens))
    kv_b = blocks.allocate("b", len(b_tokens), hit)
    assert kv_b.block_ids[:2] == kv_a.block_ids[:2] and kv_b.block_ids[2] != kv_a.block_ids[2]
    state = blocks.state()
    assert [state.ref_counts[b] for b in kv_a.block_ids[:2]] == [2, 2]
    assert blocks.num_used_blocks == 4
    assert (blocks.prefix_cache_queried_tokens_total, blocks.prefix_cache_hit_tokens_total) == (10, 8)
    blocks.free("a")
    assert [blocks.state().ref_counts[b] for b in kv_a.block_ids[:2]] == [1, 1]


def test_freed_cached_blocks_stay_findable_until_evicted_lru():
    blocks = BlockManager(num_blocks=4, block_size_tokens=2)
    _computed(blocks, "a", [1, 2, 3, 4])  # two cached blocks
    blocks.free("a")
    assert blocks.num_free_blocks == 4 and blocks.num_cached_free_blocks == 2
    # Two uncached blocks are free: a new sequence takes those first.
    blocks.allocate("b", 4)
    assert blocks.lookup_prefix(_hashes([1, 2, 3, 4, 5], 2), 5).num_tokens == 4
    # One more block must evict: the tail of "a" goes first (freed first).
    blocks.allocate("c", 2)
    assert blocks.lookup_prefix(_hashes([1, 2, 3, 4, 5], 2), 5).num_tokens == 2
    blocks.allocate("d", 2)
    assert blocks.lookup_prefix(_hashes([1, 2, 3, 4, 5], 2), 5).num_tokens == 0
    assert blocks.num_free_blocks == 0 and not blocks.state().cached_block_ids


def test_reviving_cached_free_blocks_counts_against_free_space():
    blocks = BlockManager(num_blocks=4, block_size_tokens=2)
    _computed(blocks, "a", [1, 2, 3, 4])
    blocks.free("a")
    blocks.allocate("x", 2)  # free now: 1 uncached + 2 cached
    tokens = [1, 2, 3, 4, 5, 6, 7]  # hit 2 blocks (both cached-free), needs 2 new
    hit = blocks.lookup_prefix(_hashes(tokens, 2), len(tokens))
    assert hit.num_tokens == 4
    assert not blocks.can_allocate("b", 7, hit)
    assert blocks.allocate("b", 7, hit) is None
    assert blocks.can_allocate("b", 5, hit)  # revive 2 + 1 new = 3 free; the new one must not evict the hit
    assert blocks.allocate("b", 5, hit).block_ids[:2] == hit.block_ids
    assert blocks.num_free_blocks == 0


def test_a_stale_prefix_is_refused():
    blocks = BlockManager(num_blocks=2, block_size_tokens=2)
    _computed(blocks, "a", [1, 2])
    blocks.free("a")
    hit = blocks.lookup_prefix(_hashes([1, 2, 3], 2), 3)
    blocks.allocate("x", 4)  # evicts the cached block
    blocks.free("x")
    with pytest.raises(ValueError, match="stale"):
        blocks.allocate("b", 3, hit)


def test_duplicate_content_stays_private_and_returns_uncached():
    blocks = BlockManager(num_blocks=4, block_size_tokens=2)
    _computed(blocks, "a", [1, 2, 3])
    _computed(blocks, "b", [1, 2, 3])  # computed side by side, both missed
    assert len(blocks.state().cached_block_ids) == 1
    blocks.free("b")
    blocks.free("a")
    state = blocks.state()
    assert len(state.free_cached_lru) == 1 and len(state.free_uncached) == 3


def test_can_allocate_after_freeing_counts_only_blocks_that_would_come_free():
    blocks = BlockManager(num_blocks=6, block_size_tokens=2)
    shared = [1, 2, 3, 4]
    _computed(blocks, "a", shared + [5])  # 3 blocks, 2 of them cached
    hit = blocks.lookup_prefix(_hashes(shared + [6], 2), 5)
    blocks.allocate("b", 5, hit)  # shares a's 2 cached blocks, 1 new
    blocks.allocate("c", 4)       # 2 blocks: 0 free now
    assert not blocks.can_allocate("x", 2)
    # Freeing b alone frees only its private block (a still holds the rest).
    assert blocks.can_allocate("x", 2, after_freeing=["b"])
    assert not blocks.can_allocate("x", 4, after_freeing=["b"])
    assert blocks.can_allocate("x", 8, after_freeing=["a", "b"])  # 4 blocks: 2 private + 2 shared
    # Blocks the allocation takes over as its prefix free nothing for it.
    hit_x = blocks.lookup_prefix(_hashes(shared + [7, 8, 9], 2), 7)
    assert hit_x.num_tokens == 4
    assert not blocks.can_allocate("x", 9, hit_x, after_freeing=["a", "b"])  # needs 3 new, 2 come free
    assert blocks.can_allocate("x", 9, hit_x, after_freeing=["a", "b", "c"])
    for seq_id in ("a", "b", "c"):
        blocks.free(seq_id)
    assert blocks.allocate("x", 9, hit_x) is not None  # what the check promised


# -- cache events ----------------------------------------------------------------

from sluice.engine.block_manager import CacheEvent, CacheEventKind  # noqa: E402

STORED, EVICTED = CacheEventKind.STORED, CacheEventKind.EVICTED


def test_registration_is_stored_and_eviction_is_evicted_once_each():
    blocks = BlockManager(num_blocks=3, block_size_tokens=2)
    hashes = _hashes([1, 2, 3, 4, 5], 2)
    assert blocks.drain_cache_events() == ()
    _computed(blocks, "a", [1, 2, 3, 4, 5])
    assert blocks.drain_cache_events() == (CacheEvent(STORED, hashes[0]), CacheEvent(STORED, hashes[1]))
    assert blocks.drain_cache_events() == ()  # drained
    assert blocks.cached_block_hashes() == frozenset(hashes)
    blocks.cache_full_blocks("a", hashes, 5)  # already registered: nothing new
    assert blocks.drain_cache_events() == ()
    blocks.free("a")  # freed cached blocks stay cached: no event
    assert blocks.drain_cache_events() == ()
    blocks.allocate("b", 4)  # 1 uncached + the LRU cached block (a's tail, freed first)
    assert blocks.drain_cache_events() == (CacheEvent(EVICTED, hashes[1]),)
    assert blocks.cached_block_hashes() == frozenset(hashes[:1])


def test_cache_events_are_the_net_change_between_drains():
    blocks = BlockManager(num_blocks=2, block_size_tokens=2)
    one = _hashes([1, 2], 2)
    _computed(blocks, "a", [1, 2])
    blocks.free("a")
    blocks.allocate("x", 4)  # evicts it again before anyone drained
    assert blocks.drain_cache_events() == ()  # stored then evicted: no net change
    blocks.free("x")
    _computed(blocks, "a", [1, 2])
    blocks.free("a")
    assert blocks.drain_cache_events() == (CacheEvent(STORED, one[0]),)
    blocks.allocate("x", 4)  # evicted...
    blocks.free("x")
    _computed(blocks, "b", [1, 2])  # ...and stored again (in another block)
    assert blocks.drain_cache_events() == ()  # still cached, as at the last drain
    assert blocks.cached_block_hashes() == frozenset(one)


def test_free_blocks_are_handed_out_in_the_given_order_then_as_freed():
    """A pool whose blocks come out scattered, as a long-serving replica's
    do (the calibration times steps in that state); by default 0, 1, 2, ..."""
    assert BlockManager(num_blocks=4, block_size_tokens=2).allocate("a", 8).block_ids == (0, 1, 2, 3)
    blocks = BlockManager(num_blocks=6, block_size_tokens=2, free_order=[4, 0, 5, 2, 1, 3])
    assert blocks.allocate("a", 6).block_ids == (4, 0, 5)
    blocks.free("a")  # freed blocks come back first (warm), last freed first
    assert blocks.allocate("b", 4).block_ids[0] in {4, 0, 5}
    assert blocks.num_free_blocks == 4
    with pytest.raises(ValueError, match="permutation"):
        BlockManager(num_blocks=3, free_order=[0, 1, 1])
    with pytest.raises(ValueError, match="permutation"):
        BlockManager(num_blocks=3, free_order=[0, 1])
