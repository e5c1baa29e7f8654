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
