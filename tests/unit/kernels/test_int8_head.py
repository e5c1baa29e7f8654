"""The int8 screen of the LM head (sluice.kernels.int8_head): the packed
layout the kernels read, the same scores on every instruction set this CPU
runs, each score within its row's margin of the exact logit, a margin small
enough to screen with, the one-pass screened argmax giving what the scores
and screened_argmax give, and clear refusals of bad input."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest
import torch

from sluice.kernels import int8_head
from sluice.kernels.argmax import screen_blocks, screened_argmax
from sluice.kernels.int8_head import (ISA_AVX2, ISA_AVX512_VNNI, ISA_AVX_VNNI, ISA_SCALAR, LANE_BYTES, VOCAB_BLOCK, best_isa,
                                      int8_head_scores, int8_screened_argmax, pack_int8_head, supported_isas)


def _weight(vocab: int, hidden: int, seed: int, std: float = 0.02) -> torch.Tensor:
    return torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(seed)) * std


def _normed(rows: int, hidden: int, seed: int) -> torch.Tensor:
    x = torch.randn(rows, hidden, generator=torch.Generator().manual_seed(seed))
    return x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True))  # as a final RMSNorm leaves it


def _scores(hidden: torch.Tensor, head, isa: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.full((hidden.shape[0], head.padded_vocab), float("nan"))
    margins = int8_head_scores(hidden, head, out, isa=isa)
    return out[:, :head.vocab], margins


def test_the_kernel_is_built_and_runs_its_scalar_path_anywhere():
    assert int8_head.int8_head_available()
    assert {(ISA_SCALAR, 7), (ISA_SCALAR, 8)} <= set(supported_isas())
    assert best_isa() in supported_isas()


def test_the_packed_layout_puts_four_k_of_one_row_in_each_lane():
    weight = _weight(37, 10, seed=0)  # neither dimension a multiple of its block
    head = pack_int8_head(weight)
    assert (head.vocab, head.hidden, head.padded_vocab, head.padded_hidden) == (37, 10, 48, 12)
    assert head.packed.shape == (48 // VOCAB_BLOCK, 12 // LANE_BYTES, VOCAB_BLOCK, LANE_BYTES)
    codes = torch.zeros(48, 12, dtype=torch.int8)
    for b in range(3):
        for k4 in range(3):
            codes[b * 16:(b + 1) * 16, k4 * 4:(k4 + 1) * 4] = head.packed[b, k4]
    assert codes[37:].abs().sum() == 0 and codes[:, 10:].abs().sum() == 0  # padding is zero
    assert codes[:37, :10].abs().amax(dim=1).tolist() == [127] * 37  # each row uses its full range
    dequantized = codes[:37, :10].double() * head.scales[:37, None].double()
    assert (dequantized - weight.double()).abs().max() <= head.scales.max() / 2 * (1 + 1e-6)
    assert head.row_sums.tolist() == codes.int().sum(dim=1).tolist()


@pytest.mark.parametrize("bits", [7, 8])
@pytest.mark.parametrize("shape", [(13, 70, 1000), (64, 256, 4000), (1, 8, 16)])
def test_every_instruction_set_gives_the_same_scores_each_within_its_margin(shape, bits):
    rows, hidden_size, vocab = shape
    weight = _weight(vocab, hidden_size, seed=rows)
    head = pack_int8_head(weight)
    hidden = _normed(rows, hidden_size, seed=vocab)
    exact = hidden.double() @ weight.double().t()  # [rows, vocab]
    reference, margins = _scores(hidden, head, isa=(ISA_SCALAR, bits))
    assert (reference.double() - exact).abs().le(margins.double()[:, None]).all()
    # Not a vacuous bound: a fraction of the logits' spread (~0.02 sqrt(hidden)), halved by the 8th bit.
    assert margins.max() < {7: 0.6, 8: 0.4}[bits] * exact.std()
    paths = [isa for isa in supported_isas() if isa[1] == bits]
    for isa in paths:
        scores, isa_margins = _scores(hidden, head, isa=isa)
        assert torch.equal(scores, reference), isa
        assert torch.equal(isa_margins, margins)
    if best_isa()[1] == bits:
        with torch.inference_mode():
            auto, _ = _scores(hidden, head)
        assert torch.equal(auto, reference)


def test_the_eighth_bit_narrows_the_margin():
    head = pack_int8_head(_weight(2000, 256, seed=1))
    hidden = _normed(8, 256, seed=2)
    _, seven = _scores(hidden, head, isa=(ISA_SCALAR, 7))
    _, eight = _scores(hidden, head, isa=(ISA_SCALAR, 8))
    assert (eight < 0.8 * seven).all()


@pytest.mark.skipif(platform.machine() != "x86_64", reason="the vector paths are x86's")
def test_x86_builds_run_the_vector_paths_this_cpu_has():
    flags_line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    flags = set(flags_line.split(":", 1)[1].split())
    assert ((ISA_AVX2, 7) in supported_isas()) == ({"avx2", "fma"} <= flags)
    assert (ISA_AVX2, 8) not in supported_isas()  # vpmaddubsw would saturate
    vnni = {"avx512f", "avx512bw", "avx512_vnni"} <= flags
    assert ((ISA_AVX512_VNNI, 7) in supported_isas()) == ((ISA_AVX512_VNNI, 8) in supported_isas()) == vnni
    avx_vnni = {"avx2", "avx_vnni"} <= flags
    assert ((ISA_AVX_VNNI, 7) in supported_isas()) == ((ISA_AVX_VNNI, 8) in supported_isas()) == avx_vnni
    expected = ((ISA_AVX512_VNNI, 8) if vnni else (ISA_AVX_VNNI, 8) if avx_vnni
                else (ISA_AVX2, 7) if {"avx2", "fma"} <= flags else (ISA_SCALAR, 8))
    assert best_isa() == expected


@pytest.mark.parametrize("isa", [pytest.param(isa, id=f"{isa[0]}-{isa[1]}bit") for isa in supported_isas()])
def test_each_screen_blocks_maximum_comes_with_the_scores_padding_excluded(isa):
    # Every logit negative: the padding rows' zero scores would win any maximum that counted them.
    weight = -_weight(1000, 24, seed=12).abs() - 0.01  # vocab 1000: the last screen block is partial
    head = pack_int8_head(weight)
    hidden = _normed(5, 24, seed=13).abs()
    out = torch.full((5, head.padded_vocab), float("nan"))
    block_max = torch.full((5, screen_blocks(1000)), float("nan"))
    int8_head_scores(hidden, head, out, isa=isa, block_max=block_max)
    scores = out[:, :1000]
    assert (scores < 0).all()
    expected = torch.stack([scores[:, start:start + 256].amax(dim=1) for start in range(0, 1000, 256)], dim=1)
    assert torch.equal(block_max, expected)
    margins = int8_head_scores(hidden, head, out, isa=isa)
    given = screened_argmax(scores, margins, hidden, weight, 256, block_max)
    assert torch.equal(given, screened_argmax(scores, margins, hidden, weight, 256))
    assert given.tolist() == (hidden.double() @ weight.double().t()).argmax(dim=1).tolist()


def test_large_activations_and_weights_stay_within_the_margin():
    # Outliers set each row's scale: the rest of the row quantizes coarsely, and the margin must say so.
    weight = _weight(500, 64, seed=3)
    weight[::7, 5] = 3.0
    hidden = _normed(9, 64, seed=4)
    hidden[:, 11] = 40.0
    head = pack_int8_head(weight)
    scores, margins = _scores(hidden, head)
    exact = hidden.double() @ weight.double().t()
    assert (scores.double() - exact).abs().le(margins.double()[:, None]).all()


def test_a_non_finite_row_gets_no_margin_and_a_zero_row_scores_zero():
    head = pack_int8_head(_weight(40, 16, seed=5))
    hidden = _normed(3, 16, seed=6)
    hidden[0, 3] = float("nan")
    hidden[1] = 0.0
    hidden[2, 0] = float("inf")
    scores, margins = _scores(hidden, head)
    assert margins[0].isnan() and margins[2].isnan()
    assert scores[1].abs().max() == 0 and 0 < margins[1] < 1e-20


def test_a_non_finite_weight_leaves_every_row_to_the_full_head():
    weight = _weight(5000, 16, seed=10)  # past one packing chunk
    weight[4500, 3] = float("nan")
    head = pack_int8_head(weight)
    _, margins = _scores(_normed(3, 16, seed=11), head)
    assert margins.isnan().all()


def test_a_zero_weight_row_scores_zero():
    weight = _weight(20, 12, seed=7)
    weight[4] = 0.0
    head = pack_int8_head(weight)
    scores, _ = _scores(_normed(2, 12, seed=8), head)
    assert scores[:, 4].abs().max() == 0


def test_bad_input_is_refused_clearly():
    head = pack_int8_head(_weight(40, 16, seed=9))
    with pytest.raises(ValueError, match="float32 CPU"):
        pack_int8_head(torch.zeros(4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="int8_head_scores"):
        int8_head_scores(torch.zeros(2, 15), head, torch.empty(2, head.padded_vocab))  # wrong hidden size
    with pytest.raises(ValueError, match="int8_head_scores"):
        int8_head_scores(torch.zeros(2, 16), head, torch.empty(2, head.vocab))  # narrower than the padding
    with pytest.raises(ValueError, match="instruction set 9"):
        int8_head_scores(torch.zeros(2, 16), head, torch.empty(2, head.padded_vocab), isa=(9, 8))
    with pytest.raises(ValueError, match="block_max"):
        int8_head_scores(torch.zeros(2, 16), head, torch.empty(2, head.padded_vocab), block_max=torch.empty(2, 2))
    with pytest.raises(ValueError, match="6-bit"):
        int8_head_scores(torch.zeros(2, 16), head, torch.empty(2, head.padded_vocab), isa=(ISA_SCALAR, 6))
    with pytest.raises(ValueError, match="int8_screened_argmax"):
        int8_screened_argmax(torch.zeros(2, 16), head, torch.zeros(41, 16), 8)  # not the packed weight's shape
    with pytest.raises(ValueError, match="max_candidates"):
        int8_screened_argmax(torch.zeros(2, 16), head, _weight(40, 16, seed=9), 0)


def _two_step_tokens(hidden: torch.Tensor, head, weight: torch.Tensor, max_candidates: int,
                     isa: tuple[int, int]) -> torch.Tensor:
    """What the screen gives through stored scores: int8_head_scores, then screened_argmax."""
    scores, margins = _scores(hidden, head, isa)
    return screened_argmax(scores.contiguous(), margins, hidden, weight, max_candidates)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("isa", [pytest.param(isa, id=f"{isa[0]}-{isa[1]}bit") for isa in supported_isas()])
def test_the_one_pass_screen_gives_the_stored_scores_tokens(isa, threads):
    # Rows not a multiple of the kernels' 4 or 8, a vocab ending in a partial block and
    # a partial screen block, logits all negative (padding lanes score 0: never a token).
    weight = -(_weight(4001, 72, seed=20).abs()) - 0.001
    weight[:2000] = _weight(2000, 72, seed=21)
    head = pack_int8_head(weight)
    hidden = _normed(37, 72, seed=22)
    hidden[5] = hidden[5].abs() * 0.0 + 1.0  # one row whose logits favour the all-negative tail less
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        given = int8_screened_argmax(hidden, head, weight, 256, isa=isa)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(given, _two_step_tokens(hidden, head, weight, 256, isa))
    exact = (hidden.double() @ weight.double().t()).argmax(dim=1)
    assert torch.equal(given, exact)


@pytest.mark.parametrize("isa", [pytest.param(isa, id=f"{isa[0]}-{isa[1]}bit") for isa in supported_isas()])
def test_the_one_pass_screen_leaves_what_it_cannot_settle_to_the_full_head(isa):
    weight = _weight(3000, 32, seed=23)
    weight[1700:1900] = weight[1700]  # 200 identical rows: a row favouring them has 200 candidates
    head = pack_int8_head(weight)
    hidden = _normed(4, 32, seed=24)
    hidden[0] = weight[1700] / weight[1700].norm() * 32**0.5  # its best logits are the 200 copies
    hidden[1, 7] = float("nan")
    hidden[2] = 0.0  # every score 0: every token a candidate
    given = int8_screened_argmax(hidden, head, weight, 64, isa=isa)
    assert given[:3].tolist() == [-1, -1, -1]
    assert given[3] == (hidden[3].double() @ weight.double().t()).argmax()
    assert torch.equal(given, _two_step_tokens(hidden, head, weight, 64, isa))
    # With room for the 200, the tie goes to the lowest index, as argmax's.
    assert int8_screened_argmax(hidden[:1], head, weight, 256, isa=isa).tolist() == [1700]


def test_a_non_finite_weight_leaves_the_one_pass_screen_to_the_full_head():
    weight = _weight(300, 16, seed=25)
    weight[123, 4] = float("inf")
    head = pack_int8_head(weight)
    assert int8_screened_argmax(_normed(3, 16, seed=26), head, weight, 256).tolist() == [-1, -1, -1]
