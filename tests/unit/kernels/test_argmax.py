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
