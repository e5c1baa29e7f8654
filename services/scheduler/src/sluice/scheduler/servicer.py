"""Scheduler.Place: a thin adapter from the placement stream to the policy."""

import itertools
import logging
import time
from collections.abc import AsyncIterator

import grpc

from sluice.placement.replica_choice import DispatchDecision, PlacementAsk, choose_replica
from sluice.placement.reservations import Reservation, ReservationLedger
from sluice.scheduler.metrics import SchedulerMetrics
from sluice.scheduler.replica_watch import ReplicaWatcher
from sluice.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

# A lease is advisory: the replica admits the request either way; the
# scheduler's ledger is what bounds commitments. Expiry lets a replica drop a
# request whose router vanished without cancelling.
LEASE_TTL_S = 3600.0


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, watcher: ReplicaWatcher, metrics: SchedulerMetrics, clock=time.monotonic) -> None:
        self._watcher = watcher
        self._metrics = metrics
        self._clock = clock
        self._ledger = ReservationLedger()
        self._stream_ids = itertools.count(1)

    async def Place(
        self, request_iterator: AsyncIterator[scheduler_pb2.PlacementRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[scheduler_pb2.Placement]:
        owner = f"{context.peer()}#{next(self._stream_ids)}"
        self._metrics.router_streams_active.inc()
        try:
            async for message in request_iterator:
                kind = message.WhichOneof("kind")
                if kind == "enqueue":
                    yield self._place(message.enqueue, owner)
                elif kind == "release":
                    self._ledger.release(message.release.request_id, owner)
                self._publish()
        finally:
            dropped = self._ledger.release_owner(owner)
            if dropped:
                log.info("router stream %s closed; dropped %d reservations", owner, len(dropped))
            self._metrics.router_streams_active.dec()
            self._publish()

    def _place(self, enqueue: scheduler_pb2.Enqueue, owner: str) -> scheduler_pb2.Placement:
        now_s = self._clock()
        if enqueue.request_id in self._ledger:
            return _reject(enqueue.request_id, "duplicate_request", "request id already placed", 0.0)
        ask = PlacementAsk(
            request_id=enqueue.request_id,
            tenant=enqueue.tenant,
            model_version=enqueue.model_version,
            prompt_tokens=enqueue.prompt_tokens,
            max_output_tokens=enqueue.max_output_tokens,
        )
        decision = choose_replica(ask, self._watcher.views(), self._ledger.reserved_kv_blocks(), now_s)
        if not isinstance(decision, DispatchDecision):
            self._metrics.rejections_total.labels(decision.reason).inc()
            return _reject(enqueue.request_id, decision.reason, decision.message, decision.retry_after_s)
        self._ledger.reserve(Reservation(enqueue.request_id, owner, decision.replica_id, decision.reserved_kv_blocks, now_s))
        self._metrics.placements_total.labels(decision.replica_id).inc()
        lease = common_pb2.Lease(
            lease_id=enqueue.request_id,
            replica_id=decision.replica_id,
            reserved_kv_blocks=decision.reserved_kv_blocks,
            expires_at_unix_s=time.time() + LEASE_TTL_S,
        )
        return scheduler_pb2.Placement(
            request_id=enqueue.request_id,
            dispatch=scheduler_pb2.Dispatch(
                replica_id=decision.replica_id, replica_address=decision.address, lease=lease
            ),
        )

    def _publish(self) -> None:
        self._metrics.reservations_active.set(len(self._ledger))
        reserved = self._ledger.reserved_kv_blocks()
        for view in self._watcher.views():
            self._metrics.reserved_kv_blocks.labels(view.replica_id).set(reserved.get(view.replica_id, 0))


def _reject(request_id: str, reason: str, message: str, retry_after_s: float) -> scheduler_pb2.Placement:
    return scheduler_pb2.Placement(
        request_id=request_id,
        reject=scheduler_pb2.Reject(reason=reason, message=message, retry_after_s=retry_after_s),
    )
