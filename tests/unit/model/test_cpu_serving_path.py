"""The CPU serving path (oneDNN packed linears swapped in from outside,
cpu_attention, head-major KV cache) produces the logits of the plain path
(nn.Linear, torch reference attention, block-major cache), step after step,
over prefill chunks, a mid-context chunk and batched decodes; the swap keeps
the model's names, parameters and tied weights."""

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
from sluice.model.cpu_fast_path import apply_cpu_fast_path, choose_linears, model_linears
from sluice.model.cpu_linear import PackedLinear, onednn_linear_available
from sluice.model.cpu_tuning import tune_cpu_allocator

ATOL = 1e-4  # fp32 logits; the paths differ only in summation order
GREEDY = SampleRequest(SamplingParams(temperature=0.0))
BLOCK = 4


def runners(config, layout=KVLayout.HEAD_MAJOR, linears="onednn") -> tuple[ModelRunner, ModelRunner]:
    torch.manual_seed(0)
    plain = LlamaModel(config, reference_attention).eval()
    serving = LlamaModel(config, cpu_attention).eval()
    serving.load_state_dict(plain.state_dict())
    apply_cpu_fast_path(serving, choose_linears(serving, linears))
    return (
        ModelRunner(plain, allocate_kv_caches(config, 32, BLOCK, torch.float32, "cpu")),
        ModelRunner(serving, allocate_kv_caches(config, 32, BLOCK, torch.float32, "cpu", layout=layout)),
    )


@pytest.mark.parametrize("linears", ["onednn", "transposed"])
@pytest.mark.parametrize("layout", [KVLayout.HEAD_MAJOR, KVLayout.HEAD_MAJOR_TRANSPOSED_KEYS,
                                    KVLayout.BLOCK_INTERLEAVED])
def test_serving_path_matches_plain_path(make_config, layout, linears):
    config = make_config()
    plain, serving = runners(config, layout, linears)
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


@pytest.mark.parametrize("linears", [
    pytest.param("onednn", marks=pytest.mark.skipif(not onednn_linear_available(torch.float32),
                                                    reason="this torch has no oneDNN")),
    "transposed",
])
def test_the_fast_path_swaps_modules_and_keeps_names_parameters_and_ties(make_config, linears):
    config = make_config(tie_word_embeddings=True)
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    names = sorted(model_linears(model))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    embedding = model.embed_tokens.weight
    apply_cpu_fast_path(model, choose_linears(model, linears))
    assert model_linears(model) == {}  # every nn.Linear swapped
    assert all(isinstance(model.get_submodule(name), PackedLinear) and model.get_submodule(name).layout == linears
               for name in names)
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert model.lm_head.weight is embedding  # still tied
    x = torch.randn(3, config.hidden_size)
    torch.testing.assert_close(model.lm_head(x), x @ embedding.T, atol=1e-5, rtol=0)


def test_choose_linears_forces_a_mode_and_refuses_an_unknown_one(make_config):
    model = LlamaModel(make_config()).eval()
    assert set(choose_linears(model, "torch").values()) == {"torch"}
    assert set(choose_linears(model, "torch")) == set(model_linears(model))
    with pytest.raises(ValueError, match="cpu linear mode 'mkl'"):
        choose_linears(model, "mkl")


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
    assert preferred_kv_layout(torch.device("cpu")) is KVLayout.BLOCK_INTERLEAVED
    assert preferred_kv_layout(torch.device("cpu"), torch.bfloat16) is KVLayout.HEAD_MAJOR
    assert preferred_kv_layout(torch.device("cuda")) is KVLayout.BLOCK_MAJOR
    assert tune_cpu_allocator() in (True, False)  # glibc: True; elsewhere a no-op
