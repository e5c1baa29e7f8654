"""histogram_quantile agrees with PromQL's on hand-computed buckets."""

import math

import pytest

from sluice.top.quantile import histogram_quantile

INF = math.inf
BUCKETS = [(0.1, 2), (0.25, 7), (0.5, 9), (INF, 10)]


@pytest.mark.parametrize(("q", "expected"), [
    (0.1, 0.05),  # rank 1 in (0, 0.1], half of its 2
    (0.5, 0.1 + 0.15 * 3 / 5),
    (0.9, 0.5),  # rank 9: the top of (0.25, 0.5]
    (0.99, 0.5),  # in the +Inf bucket: the highest finite bound
    (0.0, 0.0),
])
def test_linear_interpolation_inside_the_bucket(q, expected):
    assert histogram_quantile(q, BUCKETS) == pytest.approx(expected)


def test_bucket_order_does_not_matter():
    assert histogram_quantile(0.5, list(reversed(BUCKETS))) == pytest.approx(0.19)


def test_no_observations_or_no_inf_bucket_is_none():
    assert histogram_quantile(0.5, [(0.1, 0), (INF, 0)]) is None
    assert histogram_quantile(0.5, [(0.1, 3), (0.5, 4)]) is None
    assert histogram_quantile(0.5, []) is None


def test_non_monotonic_counts_are_made_monotonic():
    # A dip (scraped mid-update) is lifted to the count below it.
    assert histogram_quantile(0.5, [(0.1, 6), (0.25, 5), (INF, 10)]) == pytest.approx(0.1 * 5 / 6)
