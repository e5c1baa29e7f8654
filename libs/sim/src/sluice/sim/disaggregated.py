"""Disaggregated serving, simulated: a prefill pool and a decode pool of one
model, the prompt's KV carried between them over a link.

    arrival ─▶ prefill pool's ClusterScheduler ─▶ refused | prefill replica
    prefill replica: the prompt, one output token (the TTFT) ─▶ release
    ─▶ the source replica's link: FIFO, one transfer at a time,
       prompt tokens x KV bytes per token / (bandwidth x efficiency)
    ─▶ decode pool's ClusterScheduler ─▶ refused | decode replica
    decode replica: the same prompt with all but its last token's KV
       transferred (EngineRequest.external_prefix_tokens), the rest of the
       output ─▶ release

Each pool is its own production ClusterScheduler and its replicas are the
co-located simulator's SimReplica, so the policies are the same code on
both sides; `DisaggregatedSimulation.run()` returns the same SimResults and
`summarize()` reads it unchanged, so the two deployments compare directly.
What a client sees is recorded as it would see it: the first token from the
prefill replica, and the gap to the second (transfer, decode queue and the
decode replica's first step) counted as an inter-token gap like any other.

Simplifications, each a choice:
  - One transfer at a time per source replica's link, FIFO: a KV connector
    pushes one request's blocks over the link at full rate rather than
    sharing it; the total time is the same, and FIFO finishes the oldest
    first. Transfers into a decode replica are not contended.
  - The link is `bandwidth_bytes_per_s` for the whole replica. The default
    (the hardware's link, NVLink within a node) treats it as one GPU's
    link; a tensor-parallel group whose GPUs each send their own KV shard
    would be up to tp times faster. Across nodes, RDMA gives ~50 GB/s.
  - The prefill replica frees the KV when its step ends (as its engine
    does), not when the transfer ends: its KV holds while transfers queue
    are not modelled (prefill replicas rarely run short of KV).
"""

import heapq
import itertools
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, replace

from sluice.outcomes import Reason
from sluice.placement.asks import Dispatched, Queued, Refused

from sluice.sim.cost_model import StepShape
from sluice.sim.replica import SimReplica
from sluice.sim.results import ReplicaSample, RequestRecord, SimResults
from sluice.sim.simulator import ROUTER, FleetSpec, SimPool, engine_request_for
from sluice.sim.workload import SimRequest

# Cross-node RDMA (400 Gb/s InfiniBand or RoCE per node, roughly): what
# `--transfer-gbps 50` models against the NVLink default.
RDMA_BANDWIDTH_BYTES_PER_S = 50e9


@dataclass(frozen=True, slots=True)
class KvLink:
    """The path a prompt's KV takes from a prefill replica to a decode one."""

    kv_bytes_per_token: int
    bandwidth_bytes_per_s: float
    efficiency: float = 0.7  # the share of the link rate a transfer reaches (as Efficiency.link)

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token < 1 or self.bandwidth_bytes_per_s <= 0:
            raise ValueError("a KV link needs kv_bytes_per_token >= 1 and a positive bandwidth")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"link efficiency must be in (0, 1], got {self.efficiency}")

    def transfer_s(self, num_tokens: int) -> float:
        return num_tokens * self.kv_bytes_per_token / (self.bandwidth_bytes_per_s * self.efficiency)


@dataclass(frozen=True, slots=True)
class DisaggregatedSpec:
    """`prefill` and `decode` are the two pools (their own replica counts,
    KV and policy); `link` carries the KV between them."""

    prefill: FleetSpec
    decode: FleetSpec
    link: KvLink

    def __post_init__(self) -> None:
        if self.prefill.model_version != self.decode.model_version:
            raise ValueError("both pools serve one model version")


@dataclass(slots=True)
class TransferRecord:
    """One request's hand-off; only the simulation writes it."""

    request_id: str
    ready_s: float            # the prefill replica finished the prompt
    started_s: float          # the link was free
    transfer_s: float         # on the link
    decode_dispatched_s: float | None = None

    @property
    def queue_s(self) -> float:
        return self.started_s - self.ready_s

    @property
    def done_s(self) -> float:
        return self.started_s + self.transfer_s


# Events: (at_s, seq, kind, pool, replica index); seq breaks ties in push order.
STEP_DONE, REPORT, SWEEP, TRANSFER_DONE = 0, 1, 2, 3
PREFILL, DECODE = 0, 1


class DisaggregatedSimulation:
    """One run. Not reusable: build, `run()`, read `results` and `transfers`."""

    def __init__(self, spec: DisaggregatedSpec, step_time_s: Callable[[StepShape], float],
                 requests: list[SimRequest]) -> None:
        self.spec = spec
        self.pools = (SimPool(PREFILL, "prefill", spec.prefill, step_time_s),
                      SimPool(DECODE, "decode", spec.decode, step_time_s))
        self._requests = sorted(requests, key=lambda r: r.arrival_s)
        self._records: dict[str, RequestRecord] = {}
        self.transfers: dict[str, TransferRecord] = {}
        self._sim_requests: dict[str, SimRequest] = {}
        self._serials: dict[str, int] = {}  # the prompt ids' serial: the decode side sees the same prompt
        self._gaps: dict[str, array] = {"interactive": array("d"), "batch": array("d")}
        self._samples: list[ReplicaSample] = []
        self._events: list[tuple[float, int, int, int, int]] = []
        self._seq = itertools.count()
        # Per prefill replica: when its link finishes the transfers queued on it.
        self._link_free_at_s = [0.0] * spec.prefill.num_replicas
        self._transfer_ids: list[str] = []  # an event carries an index into it
        self._in_flight = 0
        self._stage_changes: list[tuple[float, str, str]] = []
        self._prompt_ids = itertools.count(1)

    # -- the loop --------------------------------------------------------------

    def run(self) -> SimResults:
        wall_started_s = time.perf_counter()
        now_s = 0.0
        for pool in self.pools:
            for index, _ in enumerate(pool.replicas):
                self._report(pool, index, 0.0)
                self._push(pool.fleet.state_interval_s, REPORT, pool.index, index)
        next_arrival = 0
        while next_arrival < len(self._requests) or self._in_flight:
            arrival_s = self._requests[next_arrival].arrival_s if next_arrival < len(self._requests) else None
            event = self._events[0] if self._events else None
            if arrival_s is not None and (event is None or arrival_s <= event[0]):
                now_s = arrival_s
                self._arrive(self._requests[next_arrival], now_s)
                next_arrival += 1
                changed: SimPool | None = self.pools[PREFILL]
            elif event is not None:
                heapq.heappop(self._events)
                now_s, _, kind, pool_index, index = event
                pool = self.pools[pool_index]
                changed = pool
                if kind == STEP_DONE:
                    if not self._step_done(pool, pool.replicas[index], now_s):
                        changed = None
                elif kind == REPORT:
                    self._report(pool, index, now_s)
                    self._push(now_s + pool.fleet.state_interval_s, REPORT, pool_index, index)
                elif kind == SWEEP:
                    pool.sweep_pending = False
                else:
                    self._transfer_done(self.transfers[self._transfer_ids[index]], now_s)
                    changed = self.pools[DECODE]
            else:
                break
            if changed is not None:
                self._schedule(changed, now_s)
        replicas = [replica for pool in self.pools for replica in pool.replicas]
        return SimResults(
            records=list(self._records.values()), duration_s=now_s, gaps_by_class=self._gaps,
            samples=self._samples, decode_tokens=sum(r.decode_tokens_total for r in replicas),
            prefill_tokens=sum(r.prefill_tokens_total for r in replicas),
            steps=sum(r.steps_total for r in replicas), busy_s=sum(r.busy_s for r in replicas),
            num_replicas=len(replicas), stage_changes=self._stage_changes,
            wall_s=time.perf_counter() - wall_started_s,
        )

    def _push(self, at_s: float, kind: int, pool: int, index: int = 0) -> None:
        heapq.heappush(self._events, (at_s, next(self._seq), kind, pool, index))

    # -- the router's part -------------------------------------------------------

    def _arrive(self, request: SimRequest, now_s: float) -> None:
        record = RequestRecord(request.request_id, request.tenant, request.service_class, request.arrival_s,
                               request.prompt_tokens, request.output_tokens)
        self._records[request.request_id] = record
        if request.prompt_tokens >= self.spec.prefill.max_context_tokens:
            record.outcome, record.reason = "refused", Reason.CONTEXT_LENGTH_EXCEEDED.value
            return
        self._sim_requests[request.request_id] = request
        self._serials[request.request_id] = next(self._prompt_ids)
        # The prefill pool reserves for the prompt and the one token it samples.
        prefill = self.pools[PREFILL]
        answer = prefill.cluster.enqueue(prefill.ask(request, request.prompt_tokens, 1, 1), now_s)
        if isinstance(answer, Refused):
            self._refused(record, answer)
        elif isinstance(answer, Queued):
            self._in_flight += 1

    def _refused(self, record: RequestRecord, refused: Refused) -> None:
        record.outcome, record.reason = "refused", refused.reason.value
        self._sim_requests.pop(record.request_id, None)

    def _dispatch(self, pool: SimPool, dispatched: Dispatched, now_s: float) -> None:
        request = self._sim_requests[dispatched.request_id]
        record = self._records[dispatched.request_id]
        replica = pool.by_id[dispatched.replica_id]
        is_batch, fairness_key = pool.is_batch(request), pool.tenant(request)
        serial = self._serials[request.request_id]
        if pool.index == PREFILL:
            record.dispatched_s, record.replica = now_s, dispatched.replica_id
            engine_request = engine_request_for(request, 1, serial, is_batch, fairness_key)
        else:
            self.transfers[request.request_id].decode_dispatched_s = now_s
            record.replica = f"{record.replica}>{dispatched.replica_id}"
            remaining = request.output_tokens - 1
            cap = dispatched.output_cap_tokens
            engine_request = engine_request_for(request, 0, serial, is_batch, fairness_key)
            stop = replace(engine_request.stop, max_output_tokens=min(remaining, cap) if cap else remaining)
            engine_request = replace(engine_request, stop=stop, external_prefix_tokens=request.prompt_tokens - 1)
        replica.add(engine_request, now_s)
        if replica.idle:
            self._start_step(pool, replica, now_s)

    # -- the hand-off ------------------------------------------------------------

    def _start_transfer(self, request: SimRequest, source: SimReplica, now_s: float) -> None:
        started_s = max(now_s, self._link_free_at_s[source.index])
        transfer = TransferRecord(request.request_id, now_s, started_s, self.spec.link.transfer_s(request.prompt_tokens))
        self._link_free_at_s[source.index] = transfer.done_s
        self.transfers[request.request_id] = transfer
        self._transfer_ids.append(request.request_id)
        self._push(transfer.done_s, TRANSFER_DONE, DECODE, len(self._transfer_ids) - 1)

    def _transfer_done(self, transfer: TransferRecord, now_s: float) -> None:
        request = self._sim_requests[transfer.request_id]
        record = self._records[transfer.request_id]
        decode = self.pools[DECODE]
        requested = max(1, request.requested_max_tokens - 1)
        room = decode.fleet.max_context_tokens - request.prompt_tokens - 1
        answer = decode.cluster.enqueue(decode.ask(request, request.prompt_tokens, requested, room), now_s)
        if isinstance(answer, Refused):
            self._refused(record, answer)
            self._in_flight -= 1

    # -- the replicas' engine loops ----------------------------------------------

    def _start_step(self, pool: SimPool, replica: SimReplica, now_s: float) -> None:
        duration_s = replica.start_step(now_s)
        if duration_s is not None:
            self._push(now_s + duration_s, STEP_DONE, pool.index, replica.index)

    def _step_done(self, pool: SimPool, replica: SimReplica, now_s: float) -> bool:
        """True if the step told its pool's scheduler something."""
        told = False
        for output in replica.finish_step():
            record = self._records[output.request_id]
            if output.new_token_ids:
                if pool.index == PREFILL or output.num_output_tokens == 1:
                    pool.cluster.started(output.request_id, now_s)
                    told = True
                if record.first_token_s is None:
                    record.first_token_s = now_s
                else:
                    gap_s = now_s - record.last_token_s
                    self._gaps[record.service_class].append(gap_s)
                    record.max_gap_s = max(record.max_gap_s, gap_s)
                record.last_token_s = now_s
                # The decode side's outputs follow the prefill side's one token.
                record.tokens = output.num_output_tokens + (1 if pool.index == DECODE else 0)
            if output.finished:
                pool.cluster.release(output.request_id, output.num_output_tokens, now_s, ROUTER)
                told = True
                request = self._sim_requests[output.request_id]
                if pool.index == PREFILL and request.output_tokens > 1:
                    self._start_transfer(request, replica, now_s)
                else:
                    record.outcome, record.finished_s = "finished", now_s
                    self._sim_requests.pop(output.request_id, None)
                    self._in_flight -= 1
        self._start_step(pool, replica, now_s)
        return told

    def _report(self, pool: SimPool, index: int, now_s: float) -> None:
        self._samples.append(pool.report(index, now_s))

    # -- the scheduler services' loops -------------------------------------------

    def _schedule(self, pool: SimPool, now_s: float) -> None:
        for decision in pool.cluster.schedule(now_s):
            if isinstance(decision, Dispatched):
                self._dispatch(pool, decision, now_s)
            else:  # refused from the queue (its deadline passed)
                self._refused(self._records[decision.request_id], decision)
                self._in_flight -= 1
        self._stage_changes.extend(pool.take_stage_changes(now_s))
        if not pool.sweep_pending and pool.needs_sweep():
            pool.sweep_pending = True
            self._push(now_s + pool.fleet.schedule_interval_s, SWEEP, pool.index)
