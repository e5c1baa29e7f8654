"""Quantiles from Prometheus histogram buckets, as PromQL's
`histogram_quantile` computes them.

Buckets are cumulative counts by upper bound `le`:

    le:     0.1   0.25   0.5   +Inf
    count:   2     7      9     10      (observations <= le)

The quantile's rank q*total falls in the first bucket whose count reaches
it; the value is interpolated linearly inside that bucket (its lower bound
is the previous bucket's `le`, or 0 for the first). A rank in the +Inf
bucket answers the highest finite bound, since nothing better is known.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """`buckets`: (le, cumulative count) pairs in any order, +Inf included.
    None when there were no observations (or no +Inf bucket to count them)."""
    ordered = sorted(buckets)
    if not ordered or not math.isinf(ordered[-1][0]):
        return None
    # Counts scraped at slightly different instants can dip; PromQL makes
    # them monotonic the same way.
    counts, highest = [], 0.0
    for _, count in ordered:
        highest = max(highest, count)
        counts.append(highest)
    total = counts[-1]
    if total <= 0:
        return None
    rank = min(max(q, 0.0), 1.0) * total
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(ordered) - 1:  # the +Inf bucket
        return ordered[-2][0] if len(ordered) > 1 else None
    upper = ordered[index][0]
    lower = ordered[index - 1][0] if index > 0 else 0.0
    below = counts[index - 1] if index > 0 else 0.0
    if index == 0 and upper <= 0:
        return upper
    if rank <= below:  # q = 0
        return lower
    inside = counts[index] - below
    return lower + (upper - lower) * (rank - below) / inside
