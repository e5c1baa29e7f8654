"""Replica metrics: gauges and counters read from the engine snapshot at
scrape time, the engine's own histograms (engine_metrics), and the process."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from sluice.replica.engine_loop import EngineSnapshot


@dataclass(slots=True)
class ReplicaCounters:
    """Counted on the event loop: by the servicer (cancels) and the canary."""

    cancelled_total: int = 0
    canary_failures_total: int = 0  # probes that failed or timed out


class ReplicaCollector(Collector):
    def __init__(
        self,
        replica_id: str,
        model_version: str,
        snapshot: Callable[[], EngineSnapshot],
        counters: ReplicaCounters,
        is_ready: Callable[[], bool],
    ) -> None:
        self._labels = {"replica": replica_id, "model": model_version}
        self._snapshot = snapshot
        self._counters = counters
        self._is_ready = is_ready

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._snapshot()
        names, values = list(self._labels), list(self._labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        kv = GaugeMetricFamily("sluice_kv_blocks", "KV blocks by state", labels=[*names, "state"])
        kv.add_metric([*values, "free"], s.free_kv_blocks)
        kv.add_metric([*values, "used"], s.total_kv_blocks - s.free_kv_blocks)
        yield kv
        yield gauge("sluice_kv_cached_free_blocks", "Free KV blocks still holding a cached prefix",
                    s.cached_free_kv_blocks)
        yield gauge("sluice_num_requests_running", "Sequences in the running batch", s.num_running)
        yield gauge("sluice_num_requests_waiting", "Sequences waiting for KV or budget", s.num_waiting)
        yield gauge("sluice_engine_step_time_seconds", "Moving average of one engine step", s.step_time_s)
        yield gauge("sluice_replica_ready", "1 when the canary forward passes in time", float(self._is_ready()))
        yield counter("sluice_engine_steps", "Engine steps run", s.steps_total)
        yield counter("sluice_replica_generation_tokens", "Tokens sampled on this replica", s.generated_tokens_total)
        yield counter("sluice_num_preemptions", "Sequences preempted by recompute", s.preemptions_total)
        # Tokens, as vLLM counts them: hit rate = hits / queries.
        yield counter("sluice_prefix_cache_queries", "Tokens looked up in the prefix cache at admission",
                      s.prefix_cache_queried_tokens_total)
        yield counter("sluice_prefix_cache_hits", "Tokens found in the prefix cache at admission",
                      s.prefix_cache_hit_tokens_total)
        yield counter("sluice_replica_requests_cancelled", "Requests whose caller went away", self._counters.cancelled_total)
        yield counter("sluice_replica_canary_failures", "Canary probes that failed or timed out",
                      self._counters.canary_failures_total)


def create_registry(*collectors: Collector) -> CollectorRegistry:
    """The replica's /metrics: `collectors` plus the process's CPU, memory
    and file descriptors (process_*) and the Python version (python_info)."""
    registry = CollectorRegistry()
    for collector in collectors:
        registry.register(collector)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    return registry
