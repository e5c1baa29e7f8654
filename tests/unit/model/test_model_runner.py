from __future__ import annotations

import pytest
import torch

from sluice.model import (
    LlamaModel,
    ModelInput,
    ModelRunner,
    SampleRequest,
    SamplingParams,
    SequenceInput,
    allocate_kv_caches,
)

GREEDY = SampleRequest(SamplingParams(temperature=0.0))
BLOCK = 4


@pytest.fixture
def make_runner(make_config):
    def make(num_blocks: int = 16) -> ModelRunner:
        config = make_config()
        torch.manual_seed(0)
        model = LlamaModel(config).eval()
        return ModelRunner(model, allocate_kv_caches(config, num_blocks, BLOCK, torch.float32, "cpu"))

    return make


def test_prepare_flattens_the_batch(make_runner):
    runner = make_runner()
    batch = ModelInput((
        SequenceInput([10, 11, 12, 13], 4, [3, 5], None),  # chunk at positions 4..7
        SequenceInput([20], 12, [1, 2, 0, 7], GREEDY),  # decode at position 12
        SequenceInput([30, 31], 8, [6, 9, 8], GREEDY),  # last chunk at 8..9
    ))
    step = runner.prepare(batch)
    assert step.input_ids.tolist() == [10, 11, 12, 13, 20, 30, 31]
    assert step.positions.tolist() == [4, 5, 6, 7, 12, 8, 9]
    # position p -> block_table[p // 4] * 4 + p % 4
    assert step.attn.slot_mapping.tolist() == [20, 21, 22, 23, 28, 32, 33]
    assert step.attn.query_start_loc.tolist() == [0, 4, 5, 7]
    assert step.attn.seq_lens.tolist() == [8, 13, 10]
    assert step.attn.block_tables.tolist() == [[3, 5, 0, 0], [1, 2, 0, 7], [6, 9, 8, 0]]
    assert step.attn.max_query_len == 4 and step.attn.max_seq_len == 13
    assert step.logits_indices.tolist() == [4, 6]
    assert step.sample_seq_indices == (1, 2)


def test_a_decode_step_is_prepared_as_the_general_path_prepares_it(make_runner):
    runner = make_runner()
    seqs = (
        SequenceInput([20], 12, [1, 2, 0, 7], GREEDY),  # position 12: its 4th block (7), slot 0
        SequenceInput([21], 3, [6], None),              # a decode that samples nothing
        SequenceInput([22], 7, [9, 8], GREEDY),
    )
    fast, general = runner.prepare(ModelInput(seqs)), runner._prepare_any(seqs)
    for name in ("input_ids", "positions", "logits_indices"):
        got, expected = getattr(fast, name), getattr(general, name)
        assert got.dtype == expected.dtype and got.tolist() == expected.tolist(), name
    for name in ("slot_mapping", "block_tables", "seq_lens", "query_start_loc"):
        got, expected = getattr(fast.attn, name), getattr(general.attn, name)
        assert got.dtype == expected.dtype and got.tolist() == expected.tolist(), name
    assert fast.attn.slot_mapping.tolist() == [28, 27, 35]
    assert (fast.attn.max_query_len, fast.attn.max_seq_len) == (general.attn.max_query_len, general.attn.max_seq_len)
    assert fast.sample_seq_indices == general.sample_seq_indices == (0, 2)


def test_batch_composition_does_not_change_results(make_runner):
    """A sequence's logits are the same alone or batched with others' chunks."""
    prompt = list(range(5, 18))
    alone = make_runner().execute(
        ModelInput((SequenceInput(prompt, 0, [0, 1, 2, 3], GREEDY),), return_logits=True)
    )
    runner = make_runner()
    runner.execute(ModelInput((SequenceInput([40, 41, 42, 43, 44, 45], 0, [9, 10], None),)))
    batched = runner.execute(ModelInput((
        SequenceInput([46, 47], 6, [9, 10], None),
        SequenceInput(prompt, 0, [4, 5, 6, 7], GREEDY),
        SequenceInput(list(range(60, 65)), 0, [11, 12], GREEDY),
    ), return_logits=True))
    assert batched.sampled_token_ids[0] is None
    assert batched.sampled_token_ids[1] == alone.sampled_token_ids[0]
    assert batched.logits.shape == (2, 128)
    torch.testing.assert_close(batched.logits[0], alone.logits[0], atol=1e-5, rtol=1e-5)


def test_no_sampling_rows_and_empty_batch(make_runner):
    runner = make_runner()
    out = runner.execute(ModelInput((SequenceInput([1, 2, 3], 0, [0], None),), return_logits=True))
    assert out.sampled_token_ids == (None,) and out.logits is None
    assert runner.execute(ModelInput(())).sampled_token_ids == ()


@pytest.mark.parametrize(
    "seq, match",
    [
        (SequenceInput([1, 2, 3, 4, 5], 0, [0], GREEDY), "cannot hold"),
        (SequenceInput([1], 0, [99], GREEDY), "block id"),
        (SequenceInput([], 0, [0], GREEDY), "empty"),
        (SequenceInput([500], 0, [0], GREEDY), "token id"),
        (SequenceInput([1], 256, list(range(16)), GREEDY), "max_position_embeddings"),
    ],
)
def test_rejects_bad_input(make_runner, seq, match):
    with pytest.raises(ValueError, match=match):
        make_runner().execute(ModelInput((seq,)))


def test_attention_backend_is_injectable(make_config):
    """A backend is any callable with the AttentionBackend signature (Triton plugs in here)."""
    from sluice.model import reference_attention

    calls = []

    def counting_backend(query, key, value, kv_cache, attn, scale):
        calls.append((tuple(query.shape), attn.max_query_len))
        return reference_attention(query, key, value, kv_cache, attn, scale)

    config = make_config()
    torch.manual_seed(0)
    model = LlamaModel(config, attention_backend=counting_backend).eval()
    runner = ModelRunner(model, allocate_kv_caches(config, 4, BLOCK, torch.float32, "cpu"))
    runner.execute(ModelInput((SequenceInput([1, 2, 3], 0, [0], GREEDY),)))
    assert calls == [((3, 4, 16), 3)] * config.num_hidden_layers


def test_runs_in_bfloat16(make_config):
    config = make_config()
    torch.manual_seed(0)
    model = LlamaModel(config).to(torch.bfloat16).eval()
    assert model.rotary_emb.inv_freq.dtype == torch.float32
    runner = ModelRunner(model, allocate_kv_caches(config, 4, BLOCK, torch.bfloat16, "cpu"))
    out = runner.execute(ModelInput((SequenceInput([1, 2, 3], 0, [0], GREEDY),), return_logits=True))
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()


def test_small_steps_run_on_one_thread_and_large_ones_on_all(make_config):
    config = make_config()
    torch.manual_seed(0)
    model = LlamaModel(config).eval()
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runner = ModelRunner(model, allocate_kv_caches(config, 16, BLOCK, torch.float32, "cpu"),
                             single_thread_step_tokens=4)
        small = ModelInput((SequenceInput([5, 6, 7, 8], 0, [0], GREEDY),))  # 4 tokens: one thread
        large = ModelInput((SequenceInput(list(range(5, 10)), 0, [1, 2], GREEDY),))  # 5 tokens: both
        small_out = runner.execute(ModelInput(small.sequences, return_logits=True))
        assert torch.get_num_threads() == 1
        runner.execute(large)
        assert torch.get_num_threads() == 2
        # The thread count changes the schedule of the work, not its result.
        on_both = ModelRunner(model, allocate_kv_caches(config, 16, BLOCK, torch.float32, "cpu"))
        both_out = on_both.execute(ModelInput(small.sequences, return_logits=True))
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)  # without the rule the runner leaves the process's count alone
        on_both.execute(large)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(2)
        torch.testing.assert_close(both_out.logits, small_out.logits, atol=1e-5, rtol=1e-5)
        with pytest.raises(ValueError, match="single_thread_step_tokens"):
            ModelRunner(model, allocate_kv_caches(config, 16, BLOCK, torch.float32, "cpu"),
                        single_thread_step_tokens=-1)
    finally:
        torch.set_num_threads(before)
