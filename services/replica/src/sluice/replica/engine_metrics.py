"""What the model thread measures: each request's phases and each step's batch.

    arrival (EngineLoop._add)                 sluice_request_queue_time_seconds
      -> first scheduled chunk (step start)   sluice_request_prefill_time_seconds
      -> first token (end of that step)       sluice_request_decode_time_seconds
      -> finished or cancelled

As vLLM's request_queue/prefill/decode_time: a preempted sequence keeps its
first scheduled time, so its recompute counts as prefill; a request with a
single output token observes a decode time of 0; a cancelled request
observes the phases it reached (decode up to the cancel). Canary probes are
not requests: they count in the step tokens (real work), not in the phases.

Cost: a dict lookup per scheduled chunk and per output, two counter
increments and one histogram observation per step; a histogram observation
per request phase. Nothing is allocated per token. Only the model thread
writes; prometheus_client's metrics are safe to read from the scrape thread.
No exemplars: no trace context reaches the model thread (the gateway's TTFT
and ITL histograms carry them).
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import Counter, Histogram, Metric
from prometheus_client.registry import Collector

from sluice.engine.plan import RequestOutput, StepPlan
from sluice.engine.request import EngineRequest, ServiceClass

CLASS_NAMES = {ServiceClass.INTERACTIVE: "interactive", ServiceClass.BATCH: "batch"}
# Queue and decode times span a loaded batch queue (minutes) down to an idle
# replica (milliseconds); prefill spans one step to a long chunked prompt.
PHASE_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


@dataclass(slots=True)
class _RequestTimes:
    service_class: ServiceClass
    arrived_s: float
    scheduled_s: float | None = None
    first_token_s: float | None = None


class EngineMetrics(Collector):
    """Histograms and counters of one replica's engine, updated by the model
    thread; a Collector so the replica's registry exposes them."""

    def __init__(self, model: str, replica: str) -> None:
        labels = ["model", "replica", "class"]
        self._queue = Histogram("sluice_request_queue_time_seconds",
                                "Arrival on the replica to the first scheduled chunk", labels,
                                buckets=PHASE_BUCKETS_S, registry=None)
        self._prefill = Histogram("sluice_request_prefill_time_seconds",
                                  "First scheduled chunk to the first output token", labels,
                                  buckets=PHASE_BUCKETS_S, registry=None)
        self._decode = Histogram("sluice_request_decode_time_seconds",
                                 "First output token to finished (cancelled included)", labels,
                                 buckets=PHASE_BUCKETS_S, registry=None)
        self._step_tokens = Counter("sluice_engine_step_tokens", "Tokens computed by engine steps, by kind: decode "
                                    "(one token of a sequence with output) or prefill (prompt chunks, recomputes)",
                                    ["model", "replica", "kind"], registry=None)
        self._step_duration = Histogram("sluice_engine_step_duration_seconds", "Wall time of one engine step",
                                        ["model", "replica"], buckets=STEP_BUCKETS_S, registry=None)
        self._yielded = Counter("sluice_engine_steps_yielded", "Steps given up part-way for an arriving chat "
                                "(their work is planned again; SLUICE_YIELD_TO_CHATS)", ["model", "replica"],
                                registry=None)
        self._yielded_duration = Counter("sluice_engine_yielded_step_seconds", "Wall time spent in steps "
                                         "given up part-way (computed again later)", ["model", "replica"],
                                         registry=None)
        # Children bound once: the loop does no label lookup.
        self._queue_by_class = {c: self._queue.labels(model, replica, n) for c, n in CLASS_NAMES.items()}
        self._prefill_by_class = {c: self._prefill.labels(model, replica, n) for c, n in CLASS_NAMES.items()}
        self._decode_by_class = {c: self._decode.labels(model, replica, n) for c, n in CLASS_NAMES.items()}
        self._decode_tokens = self._step_tokens.labels(model, replica, "decode")
        self._prefill_tokens = self._step_tokens.labels(model, replica, "prefill")
        self._step_seconds = self._step_duration.labels(model, replica)
        self._yielded_steps = self._yielded.labels(model, replica)
        self._yielded_seconds = self._yielded_duration.labels(model, replica)
        self._requests: dict[str, _RequestTimes] = {}

    # -- the model thread ----------------------------------------------------

    def arrived(self, request: EngineRequest, now_s: float) -> None:
        if not request.probe:
            self._requests[request.request_id] = _RequestTimes(request.service_class, now_s)

    def step(self, plan: StepPlan, outputs: Iterable[RequestOutput], started_s: float, ended_s: float) -> None:
        """One step ran `plan` from `started_s`; its outputs exist at `ended_s`."""
        decode_tokens = prefill_tokens = 0
        for chunk in plan.chunks:
            if len(chunk.token_ids) == 1 and chunk.num_output_tokens > 0:
                decode_tokens += 1
            else:
                prefill_tokens += len(chunk.token_ids)
            times = self._requests.get(chunk.request_id)
            if times is not None and times.scheduled_s is None:
                times.scheduled_s = started_s
                self._queue_by_class[times.service_class].observe(started_s - times.arrived_s)
        self._decode_tokens.inc(decode_tokens)
        self._prefill_tokens.inc(prefill_tokens)
        self._step_seconds.observe(ended_s - started_s)
        for output in outputs:
            times = self._requests.get(output.request_id)
            if times is None:
                continue
            if times.first_token_s is None and output.new_token_ids:
                times.first_token_s = ended_s
                self._prefill_by_class[times.service_class].observe(ended_s - (times.scheduled_s or started_s))
            if output.finished:
                self.ended(output.request_id, ended_s)

    def yielded(self, started_s: float, ended_s: float) -> None:
        """A step begun at `started_s` was given up at `ended_s` for a chat."""
        self._yielded_steps.inc()
        self._yielded_seconds.inc(ended_s - started_s)

    def ended(self, request_id: str, now_s: float) -> None:
        """Finished or cancelled: observes the decode phase if it began."""
        times = self._requests.pop(request_id, None)
        if times is not None and times.first_token_s is not None:
            self._decode_by_class[times.service_class].observe(now_s - times.first_token_s)

    def forget(self, request_id: str) -> None:
        """Failed: its phases are not a latency anyone saw."""
        self._requests.pop(request_id, None)

    # -- the scrape thread ---------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        for metric in (self._queue, self._prefill, self._decode, self._step_tokens, self._step_duration,
                       self._yielded, self._yielded_duration):
            yield from metric.collect()
