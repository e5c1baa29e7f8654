"""The discrete-event simulation: a fleet of replicas of one model version,
the cluster scheduler in front of them, a workload arriving, all on a
virtual clock.

    arrival ─▶ ClusterScheduler.enqueue ─▶ refused (recorded) | queued
    any event ─▶ ClusterScheduler.schedule(now) ─▶ dispatched ─▶ SimReplica.add
    replica step ends ─▶ IterationScheduler.update ─▶ first token: started()
                                                 ─▶ finished: release()
    every state_interval_s ─▶ each replica's ReplicaView ─▶ observe_replica

The policy objects are the production ones, built from their own configs
(PlacementConfig, SchedulerConfig); nothing here reaches inside them, and
they import nothing from here. The simulator plays the parts the services
play around them: the router (turning a request into an Ask and a
dispatch into an EngineRequest), the replica's engine loop (one step at a
time, the cost model's duration in place of the forward pass), and the
scheduler service's event loop (a scheduling pass on every message, a sweep
every schedule_interval_s while anything is queued or a pool is
overloaded). Messages between them are instant: on one machine they take
milliseconds against steps of tens.
"""

import heapq
import itertools
import time
import zlib
from array import array
from collections.abc import Callable
from dataclasses import dataclass

from sluice.admission.overload import STAGE_NAMES, OverloadStage
from sluice.outcomes import Reason
from sluice.engine.request import EngineRequest, ServiceClass as EngineClass, StopPolicy
from sluice.placement.asks import Ask, Dispatched, Queued, Refused, ServiceClass
from sluice.placement.cluster import ClusterScheduler

from sluice.sim.cost_model import StepShape
from sluice.sim.policies import Policy
from sluice.sim.replica import SimReplica
from sluice.sim.results import ReplicaSample, RequestRecord, SimResults
from sluice.sim.workload import SimRequest

ROUTER = "sim-router"  # the owner of every Ask: one router stream


@dataclass(frozen=True, slots=True)
class FleetSpec:
    num_replicas: int
    kv_blocks_per_replica: int
    policy: Policy
    model_version: str = "sim-v1"
    block_size_tokens: int = 16
    max_context_tokens: int = 8192
    # The replicas' WatchState interval and the scheduler's sweep, as deployed.
    state_interval_s: float = 0.25
    schedule_interval_s: float = 0.05
    # Where in a step the replica checks whether to give it up for a chat
    # (the engine's yield_to_chats): the model's layers + 1, in equal parts
    # of the step; 0 = not modelled (the engine config's flag is then moot).
    step_segments: int = 0

    def __post_init__(self) -> None:
        if self.num_replicas < 1 or self.kv_blocks_per_replica < 1:
            raise ValueError("a fleet needs at least one replica with at least one KV block")


class SimPool:
    """One model-version pool as the services around the policies see it:
    its cluster scheduler, its replicas, and how the fleet's policy names a
    request to them (its class and tenant for scheduling). The co-located
    simulation has one; the disaggregated one a prefill and a decode pool."""

    def __init__(self, index: int, name: str, fleet: FleetSpec, step_time_s: Callable[[StepShape], float]) -> None:
        self.index = index
        self.fleet = fleet
        self.cluster = ClusterScheduler(fleet.policy.placement)
        self.replicas = [
            SimReplica(i, f"{name}-{i}", fleet.model_version, fleet.kv_blocks_per_replica,
                       fleet.block_size_tokens, fleet.policy.engine, step_time_s, fleet.step_segments)
            for i in range(fleet.num_replicas)
        ]
        self.by_id = {replica.replica_id: replica for replica in self.replicas}
        self.sweep_pending = False  # a SWEEP event for this pool is on the heap

    def is_batch(self, request: SimRequest) -> bool:
        return request.service_class == "batch" and not self.fleet.policy.single_class

    def tenant(self, request: SimRequest) -> str:
        """The tenant the scheduler and the engine's prefill rotation see."""
        return "all" if self.fleet.policy.single_tenant else request.tenant

    def ask(self, request: SimRequest, prompt_tokens: int, requested_tokens: int, room_tokens: int) -> Ask:
        """The router's Enqueue for the request."""
        return Ask(
            request_id=request.request_id, owner=ROUTER, tenant=self.tenant(request),
            model_version=self.fleet.model_version,
            service_class=ServiceClass.BATCH if self.is_batch(request) else ServiceClass.INTERACTIVE,
            prompt_tokens=prompt_tokens, requested_output_tokens=requested_tokens,
            max_output_tokens=max(1, room_tokens),
        )

    def report(self, index: int, now_s: float) -> ReplicaSample:
        """Replica `index`'s state report to the scheduler, and the sample of it kept."""
        replica = self.replicas[index]
        factor = self.fleet.policy.reported_kv_factor
        reported = None if factor == 1.0 else int(replica.core.blocks.num_blocks * factor)
        self.cluster.observe_replica(replica.view(now_s, reported))
        return ReplicaSample(
            now_s, replica.replica_id, replica.kv_occupancy, replica.core.num_running, replica.core.num_waiting)

    def needs_sweep(self) -> bool:
        if any(len(queue) for queue in self.cluster.queues().values()):
            return True
        return self.cluster.overload_stage(self.fleet.model_version) > OverloadStage.NORMAL

    def take_stage_changes(self, now_s: float) -> list[tuple[float, str, str]]:
        changes = [(now_s, STAGE_NAMES[c.previous], STAGE_NAMES[c.current]) for _, c in self.cluster.stage_changes]
        self.cluster.stage_changes.clear()
        return changes


# Events on the heap are plain tuples (at_s, seq, kind, replica index):
# compared in C, and seq breaks ties in the order they were pushed.
STEP_DONE, REPORT, SWEEP, YIELD = 0, 1, 2, 3


class Simulation:
    """One run. Not reusable: build, `run()`, read the results."""

    def __init__(
        self, fleet: FleetSpec, step_time_s: Callable[[StepShape], float], requests: list[SimRequest],
        progress: Callable[[float, int], None] | None = None,
        on_token: Callable[[str, float], None] | None = None,
    ) -> None:
        """`on_token(request_id, now_s)` is called for every token a replica
        samples, in order (the results keep only first and last token times
        and the pooled gaps)."""
        self.fleet = fleet
        self._on_token = on_token
        self.pool = SimPool(0, "replica", fleet, step_time_s)
        self.cluster = self.pool.cluster
        self.replicas = self.pool.replicas
        self._requests = sorted(requests, key=lambda r: r.arrival_s)
        self._records: dict[str, RequestRecord] = {}
        self._sim_requests: dict[str, SimRequest] = {}
        self._gaps: dict[str, array] = {"interactive": array("d"), "batch": array("d")}
        self._samples: list[ReplicaSample] = []
        self._events: list[tuple[float, int, int, int]] = []
        # Replica index -> the seq of its step's STEP_DONE: one left on the
        # heap by a step given up for a chat is stale.
        self._step_event: dict[int, int] = {}
        self._seq = itertools.count()
        self._in_flight = 0
        self._progress = progress
        self._stage_changes: list[tuple[float, str, str]] = []
        self._prompt_ids = itertools.count(1)  # each request's own block of synthetic token ids

    # -- the loop --------------------------------------------------------------

    def run(self) -> SimResults:
        wall_started_s = time.perf_counter()
        now_s = 0.0
        for index, _ in enumerate(self.replicas):
            self._report(index, 0.0)
            self._push(self.fleet.state_interval_s, REPORT, index)
        next_arrival = 0
        next_progress_s = 60.0
        while next_arrival < len(self._requests) or self._in_flight:
            arrival_s = self._requests[next_arrival].arrival_s if next_arrival < len(self._requests) else None
            event = self._events[0] if self._events else None
            # A scheduling pass runs where the scheduler service runs one: on a
            # message (an enqueue, a first token, a release), a replica's
            # report, a sweep. A step that only decoded sends it nothing.
            if arrival_s is not None and (event is None or arrival_s <= event[0]):
                now_s = arrival_s
                self._arrive(self._requests[next_arrival], now_s)
                next_arrival += 1
                changed = True
            elif event is not None:
                heapq.heappop(self._events)
                now_s, _, kind, index = event
                if kind == STEP_DONE:
                    changed = self._step_event.get(index) == event[1] and self._step_done(self.replicas[index], now_s)
                elif kind == YIELD:
                    self.replicas[index].abandon_step(now_s)
                    self._start_step(self.replicas[index], now_s)
                    changed = False
                elif kind == REPORT:
                    self._report(index, now_s)
                    self._push(now_s + self.fleet.state_interval_s, REPORT, index)
                    changed = True
                else:
                    self.pool.sweep_pending = False
                    changed = True
            else:
                break  # nothing left that can make progress
            if changed:
                self._schedule(now_s)
            if self._progress is not None and now_s >= next_progress_s:
                self._progress(now_s, next_arrival)
                next_progress_s += 60.0
        return SimResults(
            records=list(self._records.values()), duration_s=now_s, gaps_by_class=self._gaps,
            samples=self._samples, decode_tokens=sum(r.decode_tokens_total for r in self.replicas),
            prefill_tokens=sum(r.prefill_tokens_total for r in self.replicas),
            steps=sum(r.steps_total for r in self.replicas), busy_s=sum(r.busy_s for r in self.replicas),
            num_replicas=len(self.replicas), stage_changes=self._stage_changes,
            wall_s=time.perf_counter() - wall_started_s,
        )

    def _push(self, at_s: float, kind: int, index: int = 0) -> int:
        seq = next(self._seq)
        heapq.heappush(self._events, (at_s, seq, kind, index))
        return seq

    # -- the router's part -------------------------------------------------------

    def _arrive(self, request: SimRequest, now_s: float) -> None:
        record = RequestRecord(
            request.request_id, request.tenant, request.service_class, request.arrival_s,
            request.prompt_tokens, request.output_tokens,
        )
        self._records[request.request_id] = record
        if request.prompt_tokens >= self.fleet.max_context_tokens:
            # The router's check: no room for even one output token.
            record.outcome, record.reason = "refused", Reason.CONTEXT_LENGTH_EXCEEDED.value
            return
        self._sim_requests[request.request_id] = request
        ask = self.pool.ask(request, request.prompt_tokens, request.requested_max_tokens,
                            self.fleet.max_context_tokens - request.prompt_tokens)
        answer = self.cluster.enqueue(ask, now_s)
        if isinstance(answer, Refused):
            self._refused(record, answer)
        elif isinstance(answer, Queued):
            self._in_flight += 1

    def _refused(self, record: RequestRecord, refused: Refused) -> None:
        record.outcome, record.reason = "refused", refused.reason.value
        self._sim_requests.pop(record.request_id, None)

    def _dispatch(self, dispatched: Dispatched, now_s: float) -> None:
        request = self._sim_requests[dispatched.request_id]
        record = self._records[dispatched.request_id]
        record.dispatched_s, record.replica = now_s, dispatched.replica_id
        replica = self.pool.by_id[dispatched.replica_id]
        engine_request = engine_request_for(
            request, dispatched.output_cap_tokens, next(self._prompt_ids), self.pool.is_batch(request),
            self.pool.tenant(request))
        replica.add(engine_request, now_s)
        if replica.idle:
            self._start_step(replica, now_s)
        elif replica.core.config.is_chat(engine_request):
            yield_s = replica.yield_at(now_s)
            if yield_s is not None:
                self._push(yield_s, YIELD, replica.index)

    # -- the replicas' engine loops ----------------------------------------------

    def _start_step(self, replica: SimReplica, now_s: float) -> None:
        duration_s = replica.start_step(now_s)
        if duration_s is not None:
            self._step_event[replica.index] = self._push(now_s + duration_s, STEP_DONE, replica.index)

    def _step_done(self, replica: SimReplica, now_s: float) -> bool:
        """True if the step told the scheduler something (a first token, a finish)."""
        told = False
        for output in replica.finish_step():
            record = self._records[output.request_id]
            if output.new_token_ids:
                if self._on_token is not None:
                    self._on_token(output.request_id, now_s)
                if record.first_token_s is None:
                    record.first_token_s = now_s
                    self.cluster.started(output.request_id, now_s)
                    told = True
                else:
                    gap_s = now_s - record.last_token_s
                    self._gaps[record.service_class].append(gap_s)
                    record.max_gap_s = max(record.max_gap_s, gap_s)
                record.last_token_s = now_s
                record.tokens = output.num_output_tokens
            if output.finished:
                record.outcome, record.finished_s = "finished", now_s
                self.cluster.release(output.request_id, output.num_output_tokens, now_s, ROUTER)
                self._sim_requests.pop(output.request_id, None)
                self._in_flight -= 1
                told = True
        self._start_step(replica, now_s)
        return told

    def _report(self, index: int, now_s: float) -> None:
        self._samples.append(self.pool.report(index, now_s))

    # -- the scheduler service's loop --------------------------------------------

    def _schedule(self, now_s: float) -> None:
        for decision in self.cluster.schedule(now_s):
            if isinstance(decision, Dispatched):
                self._dispatch(decision, now_s)
            else:  # refused from the queue (its deadline passed)
                self._refused(self._records[decision.request_id], decision)
                self._in_flight -= 1
        self._stage_changes.extend(self.pool.take_stage_changes(now_s))
        if not self.pool.sweep_pending and self.pool.needs_sweep():
            self.pool.sweep_pending = True
            self._push(now_s + self.fleet.schedule_interval_s, SWEEP)


def engine_request_for(
    request: SimRequest, output_cap_tokens: int, serial: int, is_batch: bool, fairness_key: str
) -> EngineRequest:
    """The router's TokenRequest as the replica turns it into an engine
    request: synthetic prompt ids (the first `shared_prefix_tokens` the same
    for every request of the tenant, so the prefix cache can hit them; the
    rest unique to the request, from its `serial`), the output forced to
    its length (or the overload cap)."""
    shared = min(request.shared_prefix_tokens, request.prompt_tokens)
    tenant_base = (zlib.crc32(request.tenant.encode()) & 0xFFFF) << 20  # stable across processes, unlike hash()
    unique_base = serial << 36
    prompt = tuple(range(tenant_base, tenant_base + shared)) + tuple(
        range(unique_base, unique_base + request.prompt_tokens - shared))
    output_tokens = request.output_tokens if not output_cap_tokens else min(request.output_tokens, output_cap_tokens)
    return EngineRequest(
        request_id=request.request_id, prompt_token_ids=prompt,
        stop=StopPolicy(max_output_tokens=output_tokens, ignore_eos=True),
        service_class=EngineClass.BATCH if is_batch else EngineClass.INTERACTIVE,
        fairness_key=fairness_key,
    )
