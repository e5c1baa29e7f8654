"""A rollout's settings: defaults, then a JSON config file (what the chart
renders from its values), then command-line flags, validated once into a
plan and the quality thresholds (pure).

The config file's keys (camelCase, as in the chart's values):

    {"steps": [1, 5, 25, 50, 100], "dwellSeconds": 300, "minRequests": 50, "maxStepSeconds": null,
     "pollSeconds": 10,
     "slo": {"maxTtftP99Seconds": 2.0, "maxItlP99Seconds": 0.2, "maxErrorRate": 0.01,
             "maxTtftP99Ratio": 1.5, "maxItlP99Ratio": 1.5, "maxErrorRateIncrease": 0.01,
             "relativeSlackSeconds": 0.05},
     "quality": {"enabled": true, "minGreedyAgreement": 0.9, "maxLogprobDrop": 0.1, "maxCheckRegressions": 0},
     "prometheus": {"url": "http://prometheus:9090", "class": "interactive", "minWindowSeconds": 60}}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sluice.rollout.plan import DEFAULT_STEPS_PCT, RolloutPlan, SloThresholds
from sluice.rollout.quality.score import QualityThresholds

# The defaults a config file or a flag overrides; each explained where it acts.
DEFAULTS: dict[str, Any] = {
    "steps": list(DEFAULT_STEPS_PCT),
    "dwellSeconds": 300.0,  # five minutes a step: a few scrapes and enough requests for a p99
    "minRequests": 50,
    "maxStepSeconds": None,
    "pollSeconds": 10.0,
    "slo": {
        # Absolute gates at the interactive class's TTFT SLO and a sluggish decode;
        # the relative ones catch a regression well under them.
        "maxTtftP99Seconds": 2.0, "maxItlP99Seconds": 0.25, "maxErrorRate": 0.01,
        "maxTtftP99Ratio": 1.5, "maxItlP99Ratio": 1.5, "maxErrorRateIncrease": 0.01,
        "relativeSlackSeconds": 0.05,
    },
    "quality": {"enabled": True, "minGreedyAgreement": 0.9, "maxLogprobDrop": 0.1, "maxCheckRegressions": 0},
    "prometheus": {"url": "http://127.0.0.1:9090", "class": "interactive",
                   "minWindowSeconds": 60.0},  # rate() wants a few scrapes in its window
}

_SLO_FIELDS = {
    "maxTtftP99Seconds": "max_ttft_p99_s", "maxItlP99Seconds": "max_itl_p99_s", "maxErrorRate": "max_error_rate",
    "maxTtftP99Ratio": "max_ttft_p99_ratio", "maxItlP99Ratio": "max_itl_p99_ratio",
    "maxErrorRateIncrease": "max_error_rate_increase", "relativeSlackSeconds": "relative_slack_s",
}
_QUALITY_FIELDS = {"minGreedyAgreement": "min_greedy_agreement", "maxLogprobDrop": "max_logprob_drop",
                   "maxCheckRegressions": "max_check_regressions"}


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    prometheus_url: str
    service_class: str | None  # None: every class
    min_window_s: float


@dataclass(frozen=True, slots=True)
class RolloutSettings:
    plan: RolloutPlan
    quality: QualityThresholds
    metrics: MetricsSettings
    poll_s: float


def load_config_file(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(Path(path).read_text())
    except OSError as error:
        raise ValueError(f"cannot read the rollout config {path}: {error.strerror or error}") from None
    except ValueError as error:
        raise ValueError(f"the rollout config {path} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise ValueError(f"the rollout config {path} is not a JSON object")
    return document


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """Later layers win, key by key inside the nested blocks (a null turns
    a gate off). Unknown keys are refused: a typo would otherwise silently
    keep a default gate."""
    result = json.loads(json.dumps(DEFAULTS))
    for layer in layers:
        for key, value in layer.items():
            if key not in DEFAULTS:
                raise ValueError(f"unknown rollout setting {key!r} (known: {', '.join(DEFAULTS)})")
            if isinstance(DEFAULTS[key], dict):
                if not isinstance(value, dict):
                    raise ValueError(f"rollout setting {key!r} must be an object")
                unknown = set(value) - set(DEFAULTS[key])
                if unknown:
                    raise ValueError(f"unknown keys in {key!r}: {', '.join(sorted(unknown))}")
                result[key].update(value)
            else:
                result[key] = value
    return result


def build_settings(config: dict[str, Any], *, alias: str, serving: str, candidate: str) -> RolloutSettings:
    """Validated settings; ValueError names the bad one."""
    try:
        slo = SloThresholds(**{field: _optional_float(config["slo"][key]) for key, field in _SLO_FIELDS.items()
                               if not (key == "relativeSlackSeconds" and config["slo"][key] is None)})
        quality_block = config["quality"]
        quality = QualityThresholds(
            min_greedy_agreement=float(quality_block["minGreedyAgreement"]),
            max_logprob_drop=float(quality_block["maxLogprobDrop"]),
            max_check_regressions=int(quality_block["maxCheckRegressions"]),
        )
        plan = RolloutPlan(
            alias=alias, serving=serving, candidate=candidate,
            steps_pct=tuple(_whole(s) for s in config["steps"]), dwell_s=float(config["dwellSeconds"]),
            min_requests=int(config["minRequests"]), max_step_s=_optional_float(config["maxStepSeconds"]),
            slo=slo, quality_gate=bool(quality_block["enabled"]),
        )
        prometheus = config["prometheus"]
        service_class = prometheus["class"]
        if service_class not in ("interactive", "batch", "all"):
            raise ValueError(f"prometheus class must be interactive, batch or all, got {service_class!r}")
        metrics = MetricsSettings(str(prometheus["url"]), None if service_class == "all" else service_class,
                                  float(prometheus["minWindowSeconds"]))
        poll_s = float(config["pollSeconds"])
    except (TypeError, KeyError) as error:
        raise ValueError(f"invalid rollout setting: {error}") from None
    if poll_s <= 0:
        raise ValueError(f"pollSeconds must be > 0, got {poll_s}")
    return RolloutSettings(plan, quality, metrics, poll_s)


def _optional_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value:
        raise ValueError(f"steps must be whole percentages, got {value!r}")
    return int(value)
