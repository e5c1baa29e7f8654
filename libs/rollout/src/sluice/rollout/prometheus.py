"""Per-version SLO signals from Prometheus's HTTP API (`/api/v1/query`).

The gateway labels its latency histograms and its response outcomes with
the model version that served (sluice.gateway.metrics), so one version's
share of an alias can be judged on its own:

    TTFT p99    histogram_quantile(0.99, sum by (le) (rate(sluice_time_to_first_token_seconds_bucket{version=V, class=C}[W])))
    ITL p99     the same over sluice_inter_token_latency_seconds_bucket
    error rate  rate(sluice_version_responses_total{outcome="error"}) / rate(outcome=~"finished|error")
    requests    increase(sluice_version_responses_total{outcome=~"finished|error"}[W])

Client cancels are neither errors nor requests: a caller who leaves says
nothing about the version. The window W is the step's age, so a step is
judged on its own traffic only, floored at `min_window_s` (rate() needs two
scrapes inside its window).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import httpx

from sluice.rollout.slo import MetricSample, VersionSample

TTFT = "sluice_time_to_first_token_seconds"
ITL = "sluice_inter_token_latency_seconds"
RESPONSES = "sluice_version_responses_total"
JUDGED_OUTCOMES = "finished|error"


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or answered something else than a vector."""


@dataclass(frozen=True, slots=True)
class VersionQueries:
    ttft_p99: str
    itl_p99: str
    error_rate: str
    requests: str


def version_queries(version: str, window_s: float, service_class: str | None) -> VersionQueries:
    """PromQL for one version over the last `window_s` (whole seconds).
    `service_class` None: every class (batch TTFT includes queueing, so
    the default gates only interactive traffic)."""
    window = f"{max(1, math.ceil(window_s))}s"
    selector = f'version="{_escape(version)}"'
    if service_class:
        selector += f', class="{_escape(service_class)}"'

    def p99(metric: str) -> str:
        return f"histogram_quantile(0.99, sum by (le) (rate({metric}_bucket{{{selector}}}[{window}])))"

    judged = f'{RESPONSES}{{{selector}, outcome=~"{JUDGED_OUTCOMES}"}}'
    errors = f'{RESPONSES}{{{selector}, outcome="error"}}'
    return VersionQueries(
        ttft_p99=p99(TTFT),
        itl_p99=p99(ITL),
        # No error series yet is a rate of 0, not "no data" (that is for no requests).
        error_rate=f"(sum(rate({errors}[{window}])) or vector(0)) / sum(rate({judged}[{window}]))",
        requests=f"sum(increase({judged}[{window}]))",
    )


class PrometheusReader:
    def __init__(self, base_url: str, *, service_class: str | None = "interactive", min_window_s: float = 30.0,
                 timeout_s: float = 10.0, client: httpx.Client | None = None) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"the Prometheus URL must start with http:// or https://, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.service_class = service_class
        self.min_window_s = min_window_s
        self._client = client or httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def sample(self, serving: str, candidate: str, window_s: float) -> MetricSample:
        window_s = max(window_s, self.min_window_s)
        return MetricSample(candidate=self.version_sample(candidate, window_s),
                            serving=self.version_sample(serving, window_s))

    def version_sample(self, version: str, window_s: float) -> VersionSample:
        queries = version_queries(version, window_s, self.service_class)
        return VersionSample(
            requests=self.scalar(queries.requests) or 0.0,
            ttft_p99_s=self.scalar(queries.ttft_p99),
            itl_p99_s=self.scalar(queries.itl_p99),
            error_rate=self.scalar(queries.error_rate),
        )

    def scalar(self, query: str) -> float | None:
        """The single value of an instant query; None for no series or NaN
        (no traffic in the window)."""
        try:
            response = self._client.get(f"{self.base_url}/api/v1/query", params={"query": query})
        except httpx.HTTPError as error:
            raise PrometheusError(f"cannot reach Prometheus at {self.base_url}: {error}") from None
        try:
            body = response.json()
        except ValueError:
            raise PrometheusError(f"Prometheus answered HTTP {response.status_code} without JSON") from None
        if response.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(f"Prometheus refused {query!r}: HTTP {response.status_code} "
                                  f"{body.get('errorType', '')} {body.get('error', '')}".rstrip())
        return _single_value(body.get("data"), query)


def _single_value(data: object, query: str) -> float | None:
    if not isinstance(data, dict) or data.get("resultType") not in ("vector", "scalar"):
        raise PrometheusError(f"Prometheus answered {query!r} with no vector")
    result = data.get("result")
    if data["resultType"] == "scalar":
        result = [{"value": result}]
    if not isinstance(result, list):
        raise PrometheusError(f"Prometheus answered {query!r} with a malformed result")
    if not result:
        return None
    if len(result) > 1:
        raise PrometheusError(f"{query!r} gave {len(result)} series, expected one")
    try:
        value = float(result[0]["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        raise PrometheusError(f"Prometheus answered {query!r} with a malformed sample") from None
    return None if math.isnan(value) else value


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')
