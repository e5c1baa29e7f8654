"""Follows every replica's WatchState stream and hands each report to a
callback (the scheduler feeds its policy core from it)."""

import asyncio
import logging
import time
from collections.abc import Callable

import grpc

from sluice.placement.replica_choice import ReplicaView
from sluice.rpc.channels import insecure_channel
from sluice.v1 import replica_pb2, replica_pb2_grpc

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)

OnState = Callable[[ReplicaView, replica_pb2.ReplicaState], None]
OnLost = Callable[[str], None]


def view_of(address: str, state: replica_pb2.ReplicaState, seen_at_s: float) -> ReplicaView:
    return ReplicaView(
        replica_id=state.replica_id,
        address=address,
        model_version=state.model_version,
        total_kv_blocks=state.total_kv_blocks,
        free_kv_blocks=state.free_kv_blocks,
        block_size_tokens=state.block_size_tokens,
        num_running=state.num_running,
        num_waiting=state.num_waiting,
        ready=state.ready,
        seen_at_s=seen_at_s,
        max_num_seqs=state.max_num_seqs,
        step_time_s=state.step_time_s,
    )


class ReplicaWatcher:
    """One task per replica address. Only the watch tasks write `_views`;
    a broken stream removes the view (and tells `on_lost`) so no request is
    placed on a replica we cannot see."""

    def __init__(
        self, addresses: list[str], on_state: OnState, on_lost: OnLost, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._addresses = addresses
        self._on_state = on_state
        self._on_lost = on_lost
        self._clock = clock
        self._views: dict[str, ReplicaView] = {}
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch(address)) for address in self._addresses]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def views(self) -> list[ReplicaView]:
        return list(self._views.values())

    async def _watch(self, address: str) -> None:
        attempt = 0
        while True:
            channel = insecure_channel(address)
            try:
                stub = replica_pb2_grpc.ReplicaStub(channel)
                async for state in stub.WatchState(replica_pb2.WatchStateRequest()):
                    attempt = 0
                    view = view_of(address, state, self._clock())
                    self._views[address] = view
                    self._on_state(view, state)
            except grpc.aio.AioRpcError as error:
                log.info("replica %s state stream broke: %s", address, error.code().name)
            finally:
                lost = self._views.pop(address, None)
                if lost is not None:
                    self._on_lost(lost.replica_id)
                await channel.close()
            await asyncio.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
            attempt += 1
