import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.admission.kv import KVShape, blocks_for

LLAMA_3_70B = {
    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 8192,
}


def test_llama_3_70b_bf16_from_hf_config():
    shape = KVShape.from_hf_config(LLAMA_3_70B, "bfloat16")
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.dtype_bytes) == (80, 8, 128, 2)
    assert shape.bytes_per_token == 327_680
    assert shape.bytes_per_block == 327_680 * 16
    # 32K tokens of context is exactly 10 GiB, i.e. 2048 blocks of 16.
    assert shape.blocks_in(10 * 2**30) == 2048
    assert shape.blocks_for(32 * 1024) == 2048


def test_head_dim_from_config_wins_and_missing_kv_heads_means_mha():
    config = {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 64, "head_dim": 32}
    shape = KVShape.from_hf_config(config, "float32", block_size_tokens=8)
    assert (shape.num_kv_heads, shape.head_dim, shape.dtype_bytes, shape.block_size_tokens) == (4, 32, 4, 8)
    assert shape.bytes_per_token == 2 * 2 * 4 * 32 * 4


def test_rejects_unknown_dtype_and_zero_dimensions():
    with pytest.raises(ValueError, match="unknown KV dtype"):
        KVShape.from_hf_config(LLAMA_3_70B, "int3")
    with pytest.raises(ValueError):
        KVShape(num_layers=0, num_kv_heads=8, head_dim=128, dtype_bytes=2)


@pytest.mark.parametrize(("tokens", "blocks"), [(-5, 0), (0, 0), (1, 1), (15, 1), (16, 1), (17, 2), (32, 2), (33, 3)])
def test_a_partly_filled_block_costs_a_whole_one(tokens, blocks):
    assert blocks_for(tokens, 16) == blocks


def test_blocks_in_rounds_down():
    shape = KVShape(num_layers=1, num_kv_heads=1, head_dim=1, dtype_bytes=1, block_size_tokens=4)  # 8 B per block
    assert [shape.blocks_in(n) for n in (0, 7, 8, 15, 16)] == [0, 0, 1, 1, 2]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 1 << 20), st.integers(1, 256))
def test_blocks_are_the_ceiling(tokens, block_size):
    blocks = blocks_for(tokens, block_size)
    assert blocks * block_size >= tokens > (blocks - 1) * block_size or (tokens == 0 and blocks == 0)
