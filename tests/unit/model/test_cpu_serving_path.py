"""The CPU serving path (fused projections, cpu_attention, head-major KV cache)
produces the logits of the plain path (separate projections, torch reference
attention, block-major cache), step after step, over prefill chunks, a
mid-context chunk and batched decodes."""

from __future__ import annotations

import pytest
import torch

from sluice.model import (
    KVLayout,
    LlamaModel,
    ModelInput,
    ModelRunner,
    SampleRequest,
    SamplingParams,
    SequenceInput,
    allocate_kv_caches,
)
from sluice.model.attention import cpu_attention, preferred_kv_layout, reference_attention
from sluice.model.cpu_tuning import tune_cpu_allocator

ATOL = 1e-4  # fp32 logits; the paths differ only in summation order
GREEDY = SampleRequest(SamplingParams(temperature=0.0))
BLOCK = 4


def runners(config, layout=KVLayout.HEAD_MAJOR) -> tuple[ModelRunner, ModelRunner]:
    torch.manual_seed(0)
    plain = LlamaModel(config, reference_attention).eval()
    serving = LlamaModel(config, cpu_attention).eval()
    serving.load_state_dict(plain.state_dict())
    serving.fuse_projections()
    serving.pack_for_cpu()
    return (
        ModelRunner(plain, allocate_kv_caches(config, 32, BLOCK, torch.float32, "cpu")),
        ModelRunner(serving, allocate_kv_caches(config, 32, BLOCK, torch.float32, "cpu", layout=layout)),
    )


@pytest.mark.parametrize("layout", [KVLayout.HEAD_MAJOR, KVLayout.HEAD_MAJOR_TRANSPOSED_KEYS])
def test_serving_path_matches_plain_path(make_config, layout):
    config = make_config()
    plain, serving = runners(config, layout)
    assert serving.kv_caches[0].layout is layout
    g = torch.Generator().manual_seed(1)
    a = torch.randint(3, config.vocab_size, (11,), generator=g).tolist()
    b = torch.randint(3, config.vocab_size, (6,), generator=g).tolist()
    table_a, table_b = [5, 1, 9, 12], [7, 3, 20]
    steps = [
        # a: first chunk; b: whole prompt
        (SequenceInput(a[:7], 0, table_a, None), SequenceInput(b, 0, table_b, GREEDY)),
        # a: mid-context last chunk; b: decode
        (SequenceInput(a[7:], 7, table_a, GREEDY), SequenceInput([17], 6, table_b, GREEDY)),
        (SequenceInput([18], 11, table_a, GREEDY), SequenceInput([19], 7, table_b, GREEDY)),
        (SequenceInput([20], 12, table_a, GREEDY), SequenceInput([21], 8, table_b, GREEDY)),
    ]
    for sequences in steps:
        batch = ModelInput(sequences, return_logits=True)
        expected, got = plain.execute(batch), serving.execute(batch)
        torch.testing.assert_close(got.logits, expected.logits, atol=ATOL, rtol=0)
    for ours, theirs in zip(serving.kv_caches, plain.kv_caches):  # same logical cache contents
        torch.testing.assert_close(ours.key_cache, theirs.key_cache, atol=1e-5, rtol=0)


def test_fused_projections_share_storage_and_keep_names(make_config):
    config = make_config()
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.fuse_projections()
    after = model.state_dict()
    assert after.keys() == before.keys()
    assert all(torch.equal(after[k], before[k]) for k in before)
    attn = model.layers[0].self_attn
    qkv_weight = attn._qkv[0]
    assert attn.q_proj.weight.data_ptr() == qkv_weight.data_ptr()
    assert attn.v_proj.weight.untyped_storage().data_ptr() == qkv_weight.untyped_storage().data_ptr()


def test_reference_backend_refuses_head_major_cache(make_config):
    config = make_config()
    cache = allocate_kv_caches(config, 4, BLOCK, torch.float32, "cpu", layout=KVLayout.HEAD_MAJOR)[0]
    q = torch.zeros(1, config.num_attention_heads, config.head_dim)
    kv = torch.zeros(1, config.num_key_value_heads, config.head_dim)
    from sluice.model import AttentionMetadata

    attn = AttentionMetadata(torch.tensor([0]), torch.zeros(1, 1, dtype=torch.int32), torch.tensor([1]),
                             torch.tensor([0, 1]), 1, 1)
    try:
        reference_attention(q, kv, kv, cache, attn, 1.0)
    except ValueError as e:
        assert "block-major" in str(e)
    else:
        raise AssertionError("expected a ValueError")


def test_layout_choice_and_allocator_tuning():
    # float32 on CPU: the native kernel's layout (CI builds it); other dtypes: the torch path's.
    assert preferred_kv_layout(torch.device("cpu")) is KVLayout.HEAD_MAJOR_TRANSPOSED_KEYS
    assert preferred_kv_layout(torch.device("cpu"), torch.bfloat16) is KVLayout.HEAD_MAJOR
    assert preferred_kv_layout(torch.device("cuda")) is KVLayout.BLOCK_MAJOR
    assert tune_cpu_allocator() in (True, False)  # glibc: True; elsewhere a no-op
