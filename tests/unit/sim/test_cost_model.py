"""The step cost model against hand-computed rooflines, and the properties
a simulator relies on: never under the roofline, monotone in work."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.sim.cost_model import CostModel, Efficiency, StepShape
from sluice.sim.hardware import GIB_BYTES, HARDWARE, MIB_BYTES
from sluice.sim.model_spec import MODELS

H100, H200 = HARDWARE["h100"], HARDWARE["h200"]
LLAMA_3_70B, LLAMA_3_8B = MODELS["llama-3-70b"], MODELS["llama-3-8b"]

# Llama-3-8B per layer: 4,096 x (2 x 4,096 + 2 x 1,024) + 3 x 4,096 x 14,336 = 218,103,808 matmul
# parameters, plus 8,192 of RMSNorm weights; lm head 128,256 x 4,096 = 525,336,576.
LLAMA_3_8B_LINEAR_PARAMS_PER_LAYER = 218_103_808
LLAMA_3_8B_LAYER_BYTES_BF16 = (218_103_808 + 8192) * 2
LLAMA_3_8B_HEAD_BYTES_BF16 = (525_336_576 + 4096) * 2  # with the final norm
# 2 (K, V) x 8 KV heads x 128 x 2 bytes, per layer
LLAMA_3_8B_KV_BYTES_PER_TOKEN_LAYER = 4096


def make_cost_model(hardware=H200, model=LLAMA_3_8B, **kwargs) -> CostModel:
    return CostModel(hardware, model, **kwargs)


def decodes(batch_size: int, context_tokens: int) -> list[tuple[int, int]]:
    return [(1, context_tokens)] * batch_size


def test_step_shape_counts_tokens_and_sequences():
    shape = StepShape.of([[1, 100], (1, 7), (512, 0)])
    assert shape.chunks == ((1, 100), (1, 7), (512, 0))
    assert (shape.num_tokens, shape.num_sequences) == (514, 3)


def test_a_chunk_needs_a_token_and_non_negative_context():
    with pytest.raises(ValueError, match="chunk"):
        StepShape.of([(0, 5)])
    with pytest.raises(ValueError, match="chunk"):
        StepShape(((3, -1),))


def test_an_empty_step_costs_nothing():
    cost = make_cost_model(tp=1)
    empty = StepShape(())
    assert cost.step_time_s(empty) == cost.roofline_floor_s(empty) == 0.0


def test_decode_floor_at_batch_one_is_the_weights_over_hbm_bandwidth():
    cost = make_cost_model(H200, LLAMA_3_8B)
    # 32 layers of weights and the lm head; the embedding is only looked up.
    # KV: the new token's K, V written and read back, in each of 32 layers.
    streamed_bytes = 32 * LLAMA_3_8B_LAYER_BYTES_BF16 + LLAMA_3_8B_HEAD_BYTES_BF16 + 2 * 32 * 4096
    assert streamed_bytes == 15_010_111_488
    assert cost.decode_floor_s() == pytest.approx(streamed_bytes / 4.8e12, rel=1e-12)
    # ~ the whole checkpoint over bandwidth; short by the embedding table, 6.5% of it.
    assert cost.decode_floor_s() == pytest.approx(LLAMA_3_8B.weight_bytes("bf16") / 4.8e12, rel=0.07)


def test_decode_floor_adds_each_sequences_kv_read():
    cost = make_cost_model(H200, LLAMA_3_8B)
    extra_bytes = 64 * 4000 * 32 * LLAMA_3_8B_KV_BYTES_PER_TOKEN_LAYER  # 64 sequences, 4,000 more tokens each
    assert cost.decode_floor_s(64, 4000) - cost.decode_floor_s(64, 0) == pytest.approx(extra_bytes / 4.8e12)


def test_decode_floor_is_under_the_roofline_and_the_step_time():
    cost = make_cost_model(H200, LLAMA_3_8B)
    shape = StepShape.of(decodes(8, 2000))
    assert cost.decode_floor_s(8, 2000) <= cost.roofline_floor_s(shape) <= cost.step_time_s(shape)
    # At batch 8 a decode is bandwidth-bound, so the roofline adds only the lm head's compute.
    assert cost.roofline_floor_s(shape) == pytest.approx(cost.decode_floor_s(8, 2000), rel=1e-3)


def test_prefill_flops_are_the_linears_plus_the_attention():
    cost = make_cost_model(H200, LLAMA_3_70B, tp=8)
    prompt_tokens = 32 * 1024
    # Llama-3-70B: 855,654,400 parameters a layer, 16,384 of them RMSNorm weights.
    linear_flops = 2 * 855_638_016 * prompt_tokens * 80
    # Causal: token i attends to i + 1 keys, 32,768 x 32,769 / 2 pairs; 4 x 64 heads x 128 FLOPs each, 80 layers.
    attention_flops = 4 * 64 * 128 * (32_768 * 32_769 // 2) * 80
    lm_head_flops = 2 * 128_256 * 8192  # the first output token only
    assert cost.attention_flops(prompt_tokens) == attention_flops == pytest.approx(1.407e15, rel=1e-3)
    assert cost.linear_flops(prompt_tokens) == linear_flops
    assert cost.prefill_flops(prompt_tokens) == linear_flops + attention_flops + lm_head_flops
    # The familiar 2 x params x tokens, less the embedding and lm head no prompt token multiplies through.
    assert linear_flops == pytest.approx(2 * LLAMA_3_70B.num_parameters() * prompt_tokens, rel=0.035)
    # At 32K the attention is about a quarter of the work.
    assert 0.2 < attention_flops / cost.prefill_flops(prompt_tokens) < 0.3


def test_ideal_prefill_is_the_flops_at_the_groups_peak():
    cost = make_cost_model(H200, LLAMA_3_70B, tp=8)
    assert cost.ideal_prefill_s(4096) == pytest.approx(cost.prefill_flops(4096) / (989e12 * 8))
    assert cost.ideal_prefill_s(0) == 0.0


def test_a_later_chunk_of_a_prompt_attends_to_the_earlier_ones():
    cost = make_cost_model()
    # Two chunks of 512 attend to as many pairs as one of 1,024.
    assert cost.attention_flops(512, 0) + cost.attention_flops(512, 512) == cost.attention_flops(1024, 0)


def test_tensor_parallelism_halves_compute_and_weight_reads_and_adds_the_all_reduce():
    one, two = make_cost_model(H100, tp=1), make_cost_model(H100, tp=2)
    for shape in (StepShape.of([(4096, 0)]), StepShape.of(decodes(4, 1000))):  # compute-bound, bandwidth-bound
        single, split = one.step_breakdown(shape), two.step_breakdown(shape)
        assert split.linear_s == pytest.approx(single.linear_s / 2)
        assert split.attention_s == pytest.approx(single.attention_s / 2)
        assert split.lm_head_s == pytest.approx(single.lm_head_s / 2)
        assert single.all_reduce_s == 0.0
        # 2 all-reduces x 32 layers of tokens x 4,096 x 2 bytes; a ring of 2 sends half of it each way, 2 hops.
        message_bytes = shape.num_tokens * 4096 * 2
        ring_s = 2 * (1 / 2) * message_bytes / (450e9 * 0.7) + 2 * 1.5e-6
        assert split.all_reduce_s == pytest.approx(2 * 32 * ring_s)
        assert split.total_s == pytest.approx(two.step_time_s(shape))


def test_a_large_prefill_is_compute_bound_and_a_small_decode_bandwidth_bound():
    cost = make_cost_model(H200, LLAMA_3_8B, efficiency=Efficiency(step_overhead_s=0.0))
    prefill = cost.step_breakdown(StepShape.of([(4096, 0)]))
    assert prefill.linear_s == pytest.approx(32 * 2 * LLAMA_3_8B_LINEAR_PARAMS_PER_LAYER * 4096 / (989e12 * 0.5))
    decode = cost.step_breakdown(StepShape.of(decodes(1, 0)))
    assert decode.linear_s == pytest.approx(32 * LLAMA_3_8B_LAYER_BYTES_BF16 / (4.8e12 * 0.8))


def test_attention_can_have_its_own_efficiency_and_each_sequence_a_cost():
    """A CPU's calibration: attention at a fifth of peak beside linears at
    half, and 0.1 ms per sequence on top of the step's own overhead."""
    base = Efficiency(step_overhead_s=0.001)
    cpu_like = replace(base, attention_compute=0.1, sequence_overhead_s=0.0001)
    prefill = StepShape.of([(4096, 0)])  # compute-bound attention: 4096 x 4097 / 2 pairs
    pairs = 4096 * 4097 // 2
    attention_s = make_cost_model(efficiency=cpu_like).step_breakdown(prefill).attention_s
    assert attention_s == pytest.approx(32 * 4 * 4096 * pairs / (989e12 * 0.1))
    assert attention_s == pytest.approx(5 * make_cost_model(efficiency=base).step_breakdown(prefill).attention_s)
    shape = StepShape.of(decodes(64, 1000))
    plain, calibrated = (make_cost_model(efficiency=e).step_breakdown(shape) for e in (base, cpu_like))
    assert calibrated.overhead_s == pytest.approx(0.001 + 64 * 0.0001)
    assert calibrated.linear_s == plain.linear_s
    with pytest.raises(ValueError, match="attention_compute"):
        Efficiency(attention_compute=1.5)
    with pytest.raises(ValueError, match="sequence_overhead_s"):
        Efficiency(sequence_overhead_s=-0.001)


def test_a_kernel_that_waits_for_its_kv_adds_the_reads_to_the_arithmetic():
    shape = StepShape.of(decodes(64, 4000))  # decodes: bandwidth-bound attention
    overlapped = make_cost_model(efficiency=Efficiency()).step_breakdown(shape)
    waiting = make_cost_model(efficiency=Efficiency(attention_overlaps_kv=False)).step_breakdown(shape)
    pairs, kv_moved = 64 * 4001, 64 * (4000 + 2)
    compute_s = 32 * 4 * 4096 * pairs / (989e12 * 0.5)
    kv_s = 32 * kv_moved * LLAMA_3_8B_KV_BYTES_PER_TOKEN_LAYER / (4.8e12 * 0.8)
    assert overlapped.attention_s == pytest.approx(max(compute_s, kv_s))
    assert waiting.attention_s == pytest.approx(compute_s + kv_s)
    assert waiting.linear_s == overlapped.linear_s


def test_the_breakdown_sums_to_the_step_time():
    cost = make_cost_model(H200, LLAMA_3_70B, tp=8)
    shape = StepShape.of([*decodes(64, 1500), (512, 2048)])
    assert cost.step_breakdown(shape).total_s == pytest.approx(cost.step_time_s(shape), rel=1e-12)


def test_fp8_halves_the_weight_reads_of_a_decode():
    bf16, fp8 = make_cost_model(dtype="bf16"), make_cost_model(dtype="fp8")
    shape = StepShape.of(decodes(1, 0))
    assert fp8.step_breakdown(shape).linear_s == pytest.approx(bf16.step_breakdown(shape).linear_s / 2)
    assert fp8.kv_bytes_per_token_per_gpu() * 2 == bf16.kv_bytes_per_token_per_gpu()
    assert make_cost_model(dtype="fp8", kv_dtype="bf16").kv_bytes_per_token_per_gpu() == (
        bf16.kv_bytes_per_token_per_gpu())


def test_kv_capacity_of_70b_on_8_h200():
    cost = make_cost_model(H200, LLAMA_3_70B, tp=8)
    memory = 143_771 * MIB_BYTES
    weights_per_gpu = 2 * 70_553_706_496 // 8
    free_after_runtime = memory - weights_per_gpu - GIB_BYTES
    kv_budget = memory - weights_per_gpu - (GIB_BYTES + int(free_after_runtime * 0.1))  # the replica keeps 10% back
    block_bytes = (327_680 // 8) * 16  # each GPU holds one of the 8 KV heads
    assert cost.kv_capacity_blocks() == kv_budget // block_bytes == 181_332
    assert cost.kv_capacity_tokens() == 181_332 * 16
    # ~2.9M tokens: some 350 full 8K contexts across the replica.
    assert 2.5e6 < cost.kv_capacity_tokens() < 3.2e6


def test_kv_capacity_with_a_given_reserve():
    cost = make_cost_model(H100, LLAMA_3_8B, activation_reserve_bytes=0)
    free = 81_559 * MIB_BYTES - 2 * 8_030_261_248
    assert cost.kv_capacity_tokens(block_size_tokens=1) == free // 131_072  # 2 x 32 x 8 x 128 x 2
    assert cost.kv_capacity_blocks(32) == free // (131_072 * 32)


def test_70b_in_bf16_does_not_fit_on_one_h100():
    cost = make_cost_model(H100, LLAMA_3_70B, tp=1)
    expected = r"llama-3-70b in bf16 does not fit on 1×h100: needs 131\.4 GiB .* has 79\.6 GiB"
    with pytest.raises(ValueError, match=expected):
        cost.kv_capacity_tokens()
    # In fp8 (weights and KV) it does, with room for some 80K tokens.
    assert 50_000 < make_cost_model(H100, LLAMA_3_70B, dtype="fp8").kv_capacity_tokens() < 100_000


def test_tp_must_split_the_heads():
    with pytest.raises(ValueError, match="tp=3"):
        make_cost_model(tp=3)


def test_past_the_kv_head_count_kv_heads_are_replicated():
    cost = make_cost_model(H200, LLAMA_3_8B, tp=16)
    assert cost.kv_bytes_per_token_per_gpu() == 2 * 32 * 1 * 128 * 2


def test_efficiency_stays_under_the_peak():
    with pytest.raises(ValueError, match="compute"):
        Efficiency(compute=1.2)
    with pytest.raises(ValueError, match="bandwidth"):
        Efficiency(bandwidth=0.0)
    with pytest.raises(ValueError, match="step_overhead_s"):
        Efficiency(step_overhead_s=-1.0)


def test_a_cpu_linear_pays_its_weights_pass_and_then_its_arithmetic():
    """The CPU form: a step's linears cost the weights' pass plus every
    token's FLOPs, and so does the LM head; the GPU form takes the larger."""
    overlapped = make_cost_model(efficiency=Efficiency(step_overhead_s=0.0))
    adding = make_cost_model(efficiency=Efficiency(step_overhead_s=0.0, linear_overlaps_weights=False))
    weights_s = 32 * LLAMA_3_8B_LAYER_BYTES_BF16 / (4.8e12 * 0.8)
    head_weights_s = LLAMA_3_8B_HEAD_BYTES_BF16 / (4.8e12 * 0.8)
    for batch in (1, 64, 4096):
        shape = StepShape.of(decodes(batch, 0))
        flops_s = 32 * 2 * LLAMA_3_8B_LINEAR_PARAMS_PER_LAYER * batch / (989e12 * 0.5)
        head_flops_s = 2 * 525_336_576 * batch / (989e12 * 0.5)
        assert adding.step_breakdown(shape).linear_s == pytest.approx(weights_s + flops_s)
        assert overlapped.step_breakdown(shape).linear_s == pytest.approx(max(weights_s, flops_s))
        assert adding.step_breakdown(shape).lm_head_s == pytest.approx(head_weights_s + head_flops_s)
        assert overlapped.step_breakdown(shape).lm_head_s == pytest.approx(max(head_weights_s, head_flops_s))
        assert adding.step_breakdown(shape).attention_s == overlapped.step_breakdown(shape).attention_s


def test_a_prefill_chunk_pays_its_own_call_and_its_contexts_extra_passes():
    """The CPU's prefill attention: a fixed cost per chunk of more than one
    token, and its cached context moved `prefill_context_passes` times; a
    decode (one token) pays neither, whatever its context."""
    plain = Efficiency(step_overhead_s=0.001, attention_overlaps_kv=False)
    cpu_like = replace(plain, prefill_chunk_overhead_s=0.0007, prefill_context_passes=3.0)
    chunk, decode = (64, 2048), (1, 2048)
    kv_s_per_token = 32 * LLAMA_3_8B_KV_BYTES_PER_TOKEN_LAYER / (4.8e12 * 0.8)

    def extra_s(chunks):
        shape = StepShape.of(chunks)
        return make_cost_model(efficiency=cpu_like).step_time_s(shape) - make_cost_model(efficiency=plain).step_time_s(shape)

    assert extra_s([decode] * 8) == pytest.approx(0.0, abs=1e-15)
    assert extra_s([chunk]) == pytest.approx(0.0007 + 2 * 2048 * kv_s_per_token)
    assert extra_s([decode] * 8 + [chunk, (16, 0)]) == pytest.approx(2 * 0.0007 + 2 * 2048 * kv_s_per_token)
    breakdown = make_cost_model(efficiency=cpu_like).step_breakdown(StepShape.of([decode, chunk]))
    assert breakdown.overhead_s == pytest.approx(0.001 + 0.0007)
    with pytest.raises(ValueError, match="prefill_context_passes"):
        Efficiency(prefill_context_passes=0.5)
    with pytest.raises(ValueError, match="prefill_chunk_overhead_s"):
        Efficiency(prefill_chunk_overhead_s=-1.0)


def test_kv_reads_can_have_a_bandwidth_of_their_own():
    """Scattered KV blocks read slower than the weights stream: only the
    attention's reads change, prefill contexts' extra passes with them."""
    shape = StepShape.of(decodes(64, 4000) + [(512, 8000)])
    waiting = Efficiency(attention_overlaps_kv=False, prefill_context_passes=2.0)
    base = make_cost_model(efficiency=waiting).step_breakdown(shape)
    slow = make_cost_model(efficiency=replace(waiting, kv_bandwidth=0.4)).step_breakdown(shape)
    kv_tokens = 64 * (4000 + 2) + (8000 + 2 * 512) + 8000  # the chunk's context once more
    kv_s = 32 * kv_tokens * LLAMA_3_8B_KV_BYTES_PER_TOKEN_LAYER / 4.8e12
    assert slow.attention_s - base.attention_s == pytest.approx(kv_s / 0.4 - kv_s / 0.8)
    assert (slow.linear_s, slow.lm_head_s) == (base.linear_s, base.lm_head_s)
    with pytest.raises(ValueError, match="kv_bandwidth"):
        Efficiency(kv_bandwidth=1.5)


def test_the_lm_head_can_have_its_own_efficiency():
    """A CPU's greedy head screens in bfloat16: per sequence it runs faster
    than the float32 layers, and only the head's time changes."""
    shape = StepShape.of(decodes(256, 100))
    base = make_cost_model(efficiency=Efficiency(compute=0.1)).step_breakdown(shape)
    fast_head = make_cost_model(efficiency=Efficiency(compute=0.1, lm_head_compute=0.8)).step_breakdown(shape)
    assert base.lm_head_s == pytest.approx(2 * 525_336_576 * 256 / (989e12 * 0.1))
    assert fast_head.lm_head_s == pytest.approx(max(2 * 525_336_576 * 256 / (989e12 * 0.8),
                                                    LLAMA_3_8B_HEAD_BYTES_BF16 / (4.8e12 * 0.8)))
    assert (fast_head.linear_s, fast_head.attention_s) == (base.linear_s, base.attention_s)
    with pytest.raises(ValueError, match="lm_head_compute"):
        Efficiency(lm_head_compute=0.0)


def test_an_unknown_dtype_fails_at_construction():
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        make_cost_model(kv_dtype="int4")


chunk = st.tuples(st.integers(1, 8192), st.integers(0, 131_072))
chunk_lists = st.lists(chunk, min_size=1, max_size=80)
efficiencies = st.builds(
    Efficiency,
    compute=st.floats(0.01, 1.0),
    bandwidth=st.floats(0.01, 1.0),
    link=st.floats(0.01, 1.0),
    step_overhead_s=st.floats(0.0, 0.01),
    attention_compute=st.none() | st.floats(0.01, 1.0),
    sequence_overhead_s=st.floats(0.0, 0.001),
    attention_overlaps_kv=st.booleans(),
    lm_head_compute=st.none() | st.floats(0.01, 1.0),
    kv_bandwidth=st.none() | st.floats(0.01, 1.0),
    linear_overlaps_weights=st.booleans(),
    prefill_chunk_overhead_s=st.floats(0.0, 0.01),
    prefill_context_passes=st.floats(1.0, 4.0),
)
configurations = st.sampled_from([
    (H100, LLAMA_3_8B, 1), (H200, LLAMA_3_8B, 2), (H200, LLAMA_3_70B, 8), (H100, LLAMA_3_70B, 4),
    (HARDWARE["cpu"], MODELS["tiny-llama"], 1), (H200, LLAMA_3_8B, 16),
])


@settings(max_examples=300, deadline=None)
@given(configuration=configurations, efficiency=efficiencies, chunks=chunk_lists)
def test_no_step_is_faster_than_the_roofline(configuration, efficiency, chunks):
    hardware, model, tp = configuration
    cost = CostModel(hardware, model, tp=tp, efficiency=efficiency)
    shape = StepShape.of(chunks)
    floor_s = cost.roofline_floor_s(shape)
    assert floor_s > 0
    assert cost.step_time_s(shape) >= floor_s
    assert cost.step_time_s(shape) == pytest.approx(cost.step_breakdown(shape).total_s, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(configuration=configurations, chunks=chunk_lists, index=st.integers(0, 79),
       more_tokens=st.integers(1, 2048), more_context=st.integers(1, 32_768))
def test_step_time_is_monotone_in_tokens_and_context(configuration, chunks, index, more_tokens, more_context):
    hardware, model, tp = configuration
    cost = CostModel(hardware, model, tp=tp)
    index %= len(chunks)
    num_tokens, context = chunks[index]
    base_s = cost.step_time_s(StepShape.of(chunks))
    longer = [*chunks[:index], (num_tokens + more_tokens, context), *chunks[index + 1:]]
    deeper = [*chunks[:index], (num_tokens, context + more_context), *chunks[index + 1:]]
    assert cost.step_time_s(StepShape.of(longer)) >= base_s
    assert cost.step_time_s(StepShape.of(deeper)) >= base_s
    assert cost.step_time_s(StepShape.of([*chunks, (1, 0)])) >= base_s  # one more sequence


def test_a_model_is_a_value():
    # Equal settings give equal models (the derived rates take no part in equality).
    assert make_cost_model(tp=2) == make_cost_model(tp=2)
    assert replace(make_cost_model(tp=2), tp=4).tp == 4
