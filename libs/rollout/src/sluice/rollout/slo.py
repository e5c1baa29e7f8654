"""Judging one step's metrics against the SLO gates (pure).

A sample is what Prometheus says about one version over the step so far;
None for a quantity it has no data for (no request in the window gives
NaN from histogram_quantile, which the reader turns into None).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.rollout.plan import SloThresholds


@dataclass(frozen=True, slots=True)
class VersionSample:
    requests: float  # finished + failed responses in the window (client cancels not counted)
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None
    error_rate: float | None = None  # 0..1


@dataclass(frozen=True, slots=True)
class MetricSample:
    """Both versions over the same window, the candidate's step so far."""

    candidate: VersionSample
    serving: VersionSample


def breaches(thresholds: SloThresholds, candidate: VersionSample, serving: VersionSample | None) -> tuple[str, ...]:
    """Every gate the candidate fails, in words (empty: it passes).

    `serving` is None when there is no serving traffic to compare with (at
    100 % with no baseline): the relative gates are then not judged. A
    quantity without data is not a breach by itself: `min_requests`
    decides whether there was enough traffic to judge at all.
    """
    found: list[str] = []
    t = thresholds
    _above(found, "TTFT p99", candidate.ttft_p99_s, t.max_ttft_p99_s, "s")
    _above(found, "ITL p99", candidate.itl_p99_s, t.max_itl_p99_s, "s")
    _above(found, "error rate", candidate.error_rate, t.max_error_rate, "")
    if serving is None:
        return tuple(found)
    slack = t.relative_slack_s
    for name, mine, theirs, ratio in (
        ("TTFT p99", candidate.ttft_p99_s, serving.ttft_p99_s, t.max_ttft_p99_ratio),
        ("ITL p99", candidate.itl_p99_s, serving.itl_p99_s, t.max_itl_p99_ratio),
    ):
        if ratio is not None and mine is not None and theirs is not None and mine > theirs * ratio + slack:
            found.append(f"{name} {mine:.3f}s is over {ratio:g}x the serving version's {theirs:.3f}s"
                         f" (+{slack:g}s slack)")
    increase = t.max_error_rate_increase
    if (increase is not None and candidate.error_rate is not None and serving.error_rate is not None
            and candidate.error_rate > serving.error_rate + increase):
        found.append(f"error rate {candidate.error_rate:.4f} is over the serving version's "
                     f"{serving.error_rate:.4f} + {increase:g}")
    return tuple(found)


def _above(found: list[str], name: str, value: float | None, limit: float | None, unit: str) -> None:
    if limit is not None and value is not None and value > limit:
        found.append(f"{name} {value:.4g}{unit} is over the limit {limit:g}{unit}")
