from __future__ import annotations

import pytest
import torch

from sluice.model import LlamaConfig, allocate_kv_caches, kv_bytes_per_token


def test_kv_bytes_per_token_llama3_70b():
    config = LlamaConfig(
        vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
        num_attention_heads=64, num_key_value_heads=8, head_dim=128,
        max_position_embeddings=131072,
    )
    assert kv_bytes_per_token(config, torch.bfloat16) == 2 * 80 * 8 * 128 * 2 == 327_680
    assert kv_bytes_per_token(config, torch.float32) == 655_360


def test_allocate_one_cache_per_layer(make_config):
    config = make_config()
    caches = allocate_kv_caches(config, num_blocks=5, block_size=16, dtype=torch.float16, device="cpu")
    assert len(caches) == config.num_hidden_layers
    for c in caches:
        assert c.key_cache.shape == c.value_cache.shape == (5, 16, 2, 16)
        assert c.key_cache.dtype == torch.float16
        assert c.key_cache.data_ptr() != c.value_cache.data_ptr()
        assert c.num_blocks == 5 and c.block_size == 16


def test_head_major_layout_keeps_the_logical_shape(make_config):
    from sluice.model import KVLayout

    config = make_config()
    caches = allocate_kv_caches(config, num_blocks=5, block_size=16, dtype=torch.float32, device="cpu",
                                layout=KVLayout.HEAD_MAJOR)
    c = caches[0]
    assert c.key_cache.shape == (5, 16, 2, 16) and c.num_blocks == 5 and c.block_size == 16
    assert c.layout is KVLayout.HEAD_MAJOR
    assert c.key_cache.permute(2, 0, 1, 3).is_contiguous()  # storage [kv_heads, blocks, block_size, head_dim]
    assert allocate_kv_caches(config, 5, 16, torch.float32, "cpu")[0].layout is KVLayout.BLOCK_MAJOR


def test_transposed_keys_layout_keeps_the_logical_shape(make_config):
    from sluice.model import KVLayout

    config = make_config()
    c = allocate_kv_caches(config, num_blocks=5, block_size=16, dtype=torch.float32, device="cpu",
                           layout=KVLayout.HEAD_MAJOR_TRANSPOSED_KEYS)[0]
    assert c.key_cache.shape == c.value_cache.shape == (5, 16, 2, 16)
    assert c.layout is KVLayout.HEAD_MAJOR_TRANSPOSED_KEYS
    assert c.key_cache.permute(2, 0, 3, 1).is_contiguous()  # keys [kv_heads, blocks, head_dim, block_size]
    assert c.value_cache.permute(2, 0, 1, 3).is_contiguous()  # values [kv_heads, blocks, block_size, head_dim]
    c.key_cache[3, 7, 1, 5] = 2.5  # written through the logical view, found where the layout says
    assert c.key_cache.permute(2, 0, 3, 1)[1, 3, 5, 7] == 2.5


def test_interleaved_layout_keeps_a_blocks_keys_and_values_in_one_run(make_config):
    from sluice.model import KVLayout

    config = make_config()
    c = allocate_kv_caches(config, num_blocks=5, block_size=16, dtype=torch.float32, device="cpu",
                           layout=KVLayout.BLOCK_INTERLEAVED)[0]
    kv_heads, head_dim = config.num_key_value_heads, config.head_dim
    assert c.key_cache.shape == c.value_cache.shape == (5, 16, kv_heads, head_dim)
    assert c.layout is KVLayout.BLOCK_INTERLEAVED and c.num_blocks == 5 and c.block_size == 16
    run = kv_heads * head_dim * 16  # one block's keys, then its values
    storage = torch.as_strided(c.key_cache, (5, 2 * run), (2 * run, 1))  # [num_blocks, keys + values]
    c.key_cache[3, 7, 1, 5] = 2.5  # keys: [kv_heads, head_dim, block_size] within the block
    c.value_cache[3, 7, 1, 5] = -1.5  # values: [kv_heads, block_size, head_dim], after the keys
    assert storage[3, 1 * head_dim * 16 + 5 * 16 + 7] == 2.5
    assert storage[3, run + 1 * 16 * head_dim + 7 * head_dim + 5] == -1.5
    assert int(torch.count_nonzero(storage)) == 2  # nothing else written: the views do not overlap
    # Two separately allocated tensors with the same strides are not one storage.
    other = allocate_kv_caches(config, 5, 16, torch.float32, "cpu", layout=KVLayout.BLOCK_INTERLEAVED)[0]
    from sluice.model.kv_cache import KVCache

    with pytest.raises(ValueError, match="no known layout"):
        _ = KVCache(c.key_cache, other.value_cache).layout
