"""argmax_rows gives torch's argmax: same indices, ties to the lowest index."""

import pytest
import torch

from sluice.kernels import argmax as argmax_module
from sluice.kernels.argmax import argmax_rows


def test_native_argmax_is_built():
    assert argmax_module._native is not None


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (64, 32000), (5, 129)])
def test_matches_torch(shape):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))
    assert torch.equal(argmax_rows(x), x.argmax(dim=-1))


def test_ties_go_to_the_lowest_index_and_infinities_count():
    x = torch.zeros(4, 10)
    x[0, [3, 7]] = 5.0
    x[1] = float("-inf")
    x[1, 9] = -1e30
    x[2, [2, 8]] = float("inf")
    assert argmax_rows(x).tolist() == [3, 9, 2, 0]


def test_row_strided_views_and_other_dtypes():
    base = torch.randn(6, 50)
    view = base[::2, 5:45]  # row stride 100, unit column stride
    assert torch.equal(argmax_rows(view), view.argmax(dim=-1))
    half = base.half()
    assert torch.equal(argmax_rows(half), half.argmax(dim=-1))  # torch path
    with pytest.raises(ValueError):
        argmax_rows(torch.randn(3))


# screened_argmax: the exact argmax from bf16 scores and a margin (sluice.model.greedy_head).

def _screen_inputs(rows: int, vocab: int, hidden_size: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, hidden_size, generator=g)  # [rows, H]
    weight = torch.randn(vocab, hidden_size, generator=g) * 0.02  # [V, H]
    scores = hidden.bfloat16() @ weight.bfloat16().t()  # bf16 [rows, V]
    # generous: bf16 inputs and output, over sum |h_i w_i| <= ||h|| ||w||
    margins = 0.02 * hidden.norm(dim=1) * weight.norm(dim=1).max()  # [rows]
    return scores, margins, hidden, weight


def _exact_argmax(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hidden.double() @ weight.double().t()).argmax(dim=1)


def test_screened_argmax_is_the_exact_argmax():
    scores, margins, hidden, weight = _screen_inputs(64, 5000, 64, seed=1)
    got = argmax_module.screened_argmax(scores, margins, hidden, weight, max_candidates=64)
    assert torch.equal(got, _exact_argmax(hidden, weight))


def test_screened_argmax_resolves_near_ties_that_the_bf16_scores_get_wrong():
    scores, margins, hidden, weight = _screen_inputs(8, 300, 32, seed=2)
    # Rows 100 and 200 point along each hidden row (far above the rest) and
    # differ by a nudge that bf16 cannot represent: equal bf16 scores, so the
    # scores' own argmax is the lower index, though 200 is larger exactly
    # wherever hidden[:, 0] > 0.
    top = hidden[0] / hidden[0].norm()
    weight[100] = top
    weight[200] = top
    weight[200, 0] += 1e-5 * top[0].sign()
    hidden = hidden[[0] * 8] * torch.tensor([1.0, 2, 3, 4, 5, 6, 7, 8])[:, None]
    scores = hidden.bfloat16() @ weight.bfloat16().t()
    margins = 0.02 * hidden.norm(dim=1) * weight.norm(dim=1).max()
    exact = _exact_argmax(hidden, weight)
    assert set(exact.tolist()) == {200}
    assert set(scores.float().argmax(dim=1).tolist()) == {100}  # the naive screen is wrong here
    got = argmax_module.screened_argmax(scores, margins, hidden, weight, max_candidates=8)
    assert got.tolist() == exact.tolist()


def test_screened_argmax_gives_up_on_too_many_candidates_and_non_finite_rows():
    scores, margins, hidden, weight = _screen_inputs(4, 100, 16, seed=3)
    weight[:] = weight[0]  # every token ties: 100 candidates per row
    scores = hidden.bfloat16() @ weight.bfloat16().t()
    assert argmax_module.screened_argmax(scores, margins, hidden, weight, max_candidates=99).tolist() == [-1] * 4
    # with room for all of them, the tie goes to the lowest index
    assert argmax_module.screened_argmax(scores, margins, hidden, weight, max_candidates=100).tolist() == [0] * 4
    margins[1] = float("nan")
    scores[2, 5] = float("inf")
    got = argmax_module.screened_argmax(scores, margins, hidden, weight, max_candidates=100).tolist()
    assert got[1] == -1 and got[2] == -1 and got[0] == got[3] == 0


def test_screened_argmax_takes_float32_scores_in_rows_of_a_wider_buffer():
    scores, margins, hidden, weight = _screen_inputs(16, 1000, 32, seed=5)
    wider = torch.full((16, 1024), float("nan"))  # the padding past the vocab is never read
    wider[:, :1000] = scores.float()
    got = argmax_module.screened_argmax(wider[:, :1000], margins, hidden, weight, max_candidates=64)
    assert torch.equal(got, _exact_argmax(hidden, weight))


def test_screened_argmax_checks_its_inputs():
    scores, margins, hidden, weight = _screen_inputs(2, 10, 4, seed=4)
    with pytest.raises(ValueError):
        argmax_module.screened_argmax(scores.double(), margins, hidden, weight, 4)
    with pytest.raises(ValueError, match="block_max"):
        argmax_module.screened_argmax(scores, margins, hidden, weight, 4, torch.zeros(2, 3))
    with pytest.raises(ValueError):
        argmax_module.screened_argmax(scores, margins, hidden, weight[:9], 4)
