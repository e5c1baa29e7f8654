"""The latency metrics of one response: TTFT, the gaps between content
chunks (inter-token latency), end to end, whether TTFT met the class's
SLO (goodput), and how it ended (finished, error, cancelled), all labelled
with the model version that served it. Each TTFT and ITL observation
carries the request's trace id as an exemplar when the request is traced.

Time is passed in (monotonic seconds), so the arithmetic is tested without
a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import Histogram

from sluice.gateway.metrics import RESPONSE_OUTCOMES, GatewayMetrics
from sluice.telemetry.exemplars import current_exemplar


@dataclass(slots=True)
class StreamTiming:
    metrics: GatewayMetrics
    model: str
    service_class: str
    version: str  # a label value already (GatewayMetrics.versions), never a client's string
    arrived_s: float
    ttft_slo_s: float
    exemplar: dict[str, str] | None = None  # the request's trace, taken where its span is current
    first_content_s: float | None = None
    last_content_s: float | None = None
    # This response's ITL series, looked up once at its first chunk: every
    # later chunk observes into it (labels() takes a lock and a dict lookup).
    itl: Histogram | None = None

    @classmethod
    def start(cls, metrics: GatewayMetrics, model: str, service_class: str, version: str, arrived_s: float,
              ttft_slo_s: float) -> StreamTiming:
        """Call where the request's span is current: the exemplar is taken here.
        `version`: the model version the router said serves it."""
        return cls(metrics, model, service_class, metrics.versions.label(version), arrived_s, ttft_slo_s,
                   exemplar=current_exemplar())

    def content(self, now_s: float) -> None:
        """A chunk with content left for the client."""
        if self.first_content_s is None:
            labels = (self.model, self.service_class, self.version)
            self.first_content_s = now_s
            self.metrics.time_to_first_token_seconds.labels(*labels).observe(
                now_s - self.arrived_s, exemplar=self.exemplar)
            self.itl = self.metrics.inter_token_latency_seconds.labels(*labels)
        else:
            self.itl.observe(now_s - self.last_content_s, exemplar=self.exemplar)
        self.last_content_s = now_s

    def finished(self, now_s: float, *, outcome: str) -> None:
        """The response ended: "finished" (stop or length, so it counts
        toward goodput, met or missed), "error", or "cancelled" (the client
        left)."""
        if outcome not in RESPONSE_OUTCOMES:
            raise ValueError(f"unknown response outcome {outcome!r}")
        labels = (self.model, self.service_class, self.version)
        self.metrics.e2e_request_latency_seconds.labels(*labels).observe(now_s - self.arrived_s)
        self.metrics.version_responses_total.labels(*labels, outcome).inc()
        if outcome == "finished":
            first_s = self.first_content_s if self.first_content_s is not None else now_s
            result = "met" if first_s - self.arrived_s <= self.ttft_slo_s else "missed"
            self.metrics.slo_requests_total.labels(*labels, result).inc()
