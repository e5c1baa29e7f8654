"""Scheduler.Place: a thin adapter between router streams and the policy
core (sluice.placement.cluster.ClusterScheduler).

    router stream ──Enqueue──▶ core.enqueue ──▶ Reject now, or queued
                  ──Started──▶ core.started
                  ──Release──▶ core.release  (finished, failed, or left the queue)
    replica state, a Release, a new entry, a tick ──▶ core.schedule ──▶ Dispatch / Reject
                                                          to the owning stream

Everything runs on the event loop thread, so the core needs no locks. A
router stream that breaks takes its queue entries and reservations with it.
"""

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable

import grpc

from sluice.admission.overload import STAGE_NAMES
from sluice.outcomes import OUTCOMES
from sluice.placement.asks import Ask, Dispatched, Queued, Refused, ServiceClass
from sluice.placement.cluster import ClusterScheduler
from sluice.placement.replica_choice import ReplicaView
from sluice.scheduler.metrics import CLASS_NAMES, SchedulerMetrics
from sluice.scheduler.queue_spans import QueueSpans
from sluice.v1 import common_pb2, replica_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 0.25
CLASSES = {common_pb2.SERVICE_CLASS_BATCH: ServiceClass.BATCH}  # anything else is interactive


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(
        self,
        core: ClusterScheduler,
        metrics: SchedulerMetrics,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        queue_spans: QueueSpans | None = None,
    ) -> None:
        self._core = core
        self._metrics = metrics
        self._clock = clock
        self._wall_clock = wall_clock
        self._outboxes: dict[str, asyncio.Queue[scheduler_pb2.Placement | None]] = {}
        self._stream_ids = itertools.count(1)
        self._kicked = False
        self._published_at_s = 0.0
        # request id -> (model version, class) of what is queued, for metric labels
        self._labels: dict[str, tuple[str, ServiceClass]] = {}
        self._spans = queue_spans or QueueSpans()

    # -- replica state (from the watcher) ------------------------------------

    def on_replica_state(self, view: ReplicaView, state: replica_pb2.ReplicaState) -> None:
        self._core.observe_replica(view)
        if state.cache_snapshot or state.cache_stored_block_hashes or state.cache_evicted_block_hashes:
            self._core.observe_cache(
                view.replica_id, list(state.cache_stored_block_hashes), list(state.cache_evicted_block_hashes),
                state.cache_snapshot,
            )
        self.kick()

    def on_replica_lost(self, replica_id: str) -> None:
        self._core.forget_replica(replica_id)
        self.kick()

    # -- scheduling passes ---------------------------------------------------

    def kick(self) -> None:
        """Run one scheduling pass soon; many kicks in one loop turn run one."""
        if not self._kicked:
            self._kicked = True
            asyncio.get_running_loop().call_soon(self._schedule)

    async def sweep_forever(self, interval_s: float) -> None:
        """Deadlines pass without any message arriving: look regularly."""
        while True:
            await asyncio.sleep(interval_s)
            self._schedule()

    def _schedule(self) -> None:
        self._kicked = False
        now_s = self._clock()
        for decision in self._core.schedule(now_s):
            self._deliver(decision)
        for version, change in self._core.stage_changes:
            signals = change.signals
            log.warning(
                "overload stage of %s: %s -> %s (oldest interactive queued %.2fs, predicted start %.2fs, "
                "interactive KV %.0f%%)", version, STAGE_NAMES[change.previous], STAGE_NAMES[change.current],
                signals.interactive_queue_age_s, signals.predicted_start_s, 100 * signals.kv_occupancy,
            )
            self._metrics.overload_stage.labels(version).set(change.current)
        self._core.stage_changes.clear()
        if now_s - self._published_at_s >= PUBLISH_INTERVAL_S:
            self._published_at_s = now_s
            self._metrics.publish(self._core, self._core.replicas(), now_s)

    def _deliver(self, decision: Dispatched | Refused) -> None:
        outbox = self._outboxes.get(decision.owner)
        model, service_class = self._labels.pop(decision.request_id, ("", ServiceClass.INTERACTIVE))
        if isinstance(decision, Refused):
            self._count_refusal(decision, service_class)
            self._spans.refused(decision.request_id, decision.reason.value)
            placement = _reject(decision)
        else:
            self._spans.dispatched(decision.request_id, decision.replica_id, decision.reserved_kv_blocks,
                                   decision.model_version)
            self._metrics.placements_total.labels(decision.replica_id).inc()
            self._metrics.queue_time_seconds.labels(model, CLASS_NAMES[service_class]).observe(decision.queued_s)
            if decision.output_cap_tokens:
                self._metrics.overload_levers_total.labels(decision.model_version, "output_capped").inc()
            if model and decision.model_version != model:
                self._metrics.overload_levers_total.labels(decision.model_version, "fallback").inc()
            placement = self._dispatch(decision)
        if outbox is not None:
            outbox.put_nowait(placement)

    def _dispatch(self, decision: Dispatched) -> scheduler_pb2.Placement:
        lease = common_pb2.Lease(
            lease_id=decision.request_id,
            replica_id=decision.replica_id,
            reserved_kv_blocks=decision.reserved_kv_blocks,
            expires_at_unix_s=self._wall_clock() + self._core.config.lease_ttl_s,
        )
        return scheduler_pb2.Placement(
            request_id=decision.request_id,
            dispatch=scheduler_pb2.Dispatch(
                replica_id=decision.replica_id, replica_address=decision.address, lease=lease,
                model_version=decision.model_version, output_cap_tokens=decision.output_cap_tokens,
            ),
        )

    def _count_refusal(self, refused: Refused, service_class: ServiceClass) -> None:
        self._metrics.rejections_total.labels(refused.reason.value, CLASS_NAMES[service_class]).inc()

    # -- the Place stream ----------------------------------------------------

    async def Place(
        self, request_iterator: AsyncIterator[scheduler_pb2.PlacementRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[scheduler_pb2.Placement]:
        owner = f"{context.peer()}#{next(self._stream_ids)}"
        outbox: asyncio.Queue[scheduler_pb2.Placement | None] = asyncio.Queue()
        self._outboxes[owner] = outbox
        self._metrics.router_streams_active.inc()
        reader = asyncio.create_task(self._read(request_iterator, owner, outbox))
        try:
            while (placement := await outbox.get()) is not None:
                yield placement
        finally:
            reader.cancel()
            del self._outboxes[owner]
            dropped = self._core.drop_owner(owner)
            self._spans.drop_owner(owner)
            if dropped:
                log.info("router stream %s closed; dropped %d queued or placed requests", owner, dropped)
            self._metrics.router_streams_active.dec()
            self.kick()

    async def _read(
        self,
        request_iterator: AsyncIterator[scheduler_pb2.PlacementRequest],
        owner: str,
        outbox: "asyncio.Queue[scheduler_pb2.Placement | None]",
    ) -> None:
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("kind")
                now_s = self._clock()
                if kind == "enqueue":
                    self._enqueue(message.enqueue, owner, outbox, now_s)
                elif kind == "started":
                    self._core.started(message.started.request_id, now_s)
                elif kind == "release":
                    self._labels.pop(message.release.request_id, None)
                    self._spans.left(message.release.request_id)
                    self._core.release(message.release.request_id, message.release.output_tokens, now_s, owner)
                self.kick()
        except grpc.aio.AioRpcError as error:
            log.info("router stream %s broke: %s", owner, error.code().name)
        finally:
            outbox.put_nowait(None)

    def _enqueue(
        self, enqueue: scheduler_pb2.Enqueue, owner: str, outbox: "asyncio.Queue[scheduler_pb2.Placement | None]",
        now_s: float,
    ) -> None:
        service_class = CLASSES.get(enqueue.service_class, ServiceClass.INTERACTIVE)
        deadline_s = 0.0
        if enqueue.deadline_unix_s:
            deadline_s = now_s + (enqueue.deadline_unix_s - self._wall_clock())
        ask = Ask(
            request_id=enqueue.request_id,
            owner=owner,
            tenant=enqueue.tenant,
            model_version=enqueue.model_version,
            service_class=service_class,
            prompt_tokens=enqueue.prompt_tokens,
            requested_output_tokens=enqueue.requested_output_tokens,
            max_output_tokens=enqueue.max_output_tokens,
            prompt_block_hashes=tuple(enqueue.prompt_block_hashes),
            block_size_tokens=enqueue.block_size_tokens,
            deadline_s=deadline_s,
            critical=enqueue.critical,
            degradable=enqueue.degradable,
            fallback_model_version=enqueue.fallback_model_version,
        )
        self._spans.enqueued(enqueue, CLASS_NAMES[service_class], owner)
        outcome = self._core.enqueue(ask, now_s)
        labels = (enqueue.model_version, CLASS_NAMES[service_class])
        if isinstance(outcome, Queued):
            self._labels[enqueue.request_id] = (enqueue.model_version, service_class)
            self._metrics.admissions_total.labels(*labels).inc()
            self._metrics.predicted_start_seconds.labels(*labels).observe(outcome.predicted_start_s)
            return
        if outcome.predicted_start_s is not None:
            self._metrics.predicted_start_seconds.labels(*labels).observe(outcome.predicted_start_s)
        self._count_refusal(outcome, service_class)
        self._spans.refused(enqueue.request_id, outcome.reason.value)
        outbox.put_nowait(_reject(outcome))


def _reject(refused: Refused) -> scheduler_pb2.Placement:
    assert refused.reason in OUTCOMES  # the vocabulary is the contract with the router
    return scheduler_pb2.Placement(
        request_id=refused.request_id,
        reject=scheduler_pb2.Reject(
            reason=refused.reason.value, message=refused.message, retry_after_s=refused.retry_after_s
        ),
    )
