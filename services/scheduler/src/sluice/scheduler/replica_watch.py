"""Follows every replica's WatchState stream and hands each report to a
callback (the scheduler feeds its policy core from it)."""

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

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
    """One task per replica address; the set of addresses changes with
    `set_addresses` (discovery calls it on the loop). Only `set_addresses`
    and the watch tasks write `_views` and `_tasks`: a broken stream removes
    the view (and tells `on_lost`), and so does an address discovery
    dropped, at once, so no request is placed on a replica we cannot see or
    that Kubernetes took out of its Service."""

    def __init__(self, on_state: OnState, on_lost: OnLost, clock: Callable[[], float] = time.monotonic) -> None:
        self._on_state = on_state
        self._on_lost = on_lost
        self._clock = clock
        self._views: dict[str, ReplicaView] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def set_addresses(self, addresses: Iterable[str]) -> None:
        wanted = frozenset(addresses)
        for address in sorted(self._tasks.keys() - wanted):
            task = self._tasks.pop(address)
            task.cancel()
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)
            lost = self._views.pop(address, None)
            if lost is not None:
                self._on_lost(lost.replica_id)
            log.info("stopped watching replica %s (%s)", address,
                     f"replica {lost.replica_id} leaves placement" if lost else "it was not connected")
        for address in sorted(wanted - self._tasks.keys()):
            self._tasks[address] = asyncio.create_task(self._watch(address), name=f"watch-replica {address}")
            log.info("watching replica %s", address)

    def addresses(self) -> frozenset[str]:
        return frozenset(self._tasks)

    async def stop(self) -> None:
        tasks = [*self._tasks.values(), *self._stopping]
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def views(self) -> list[ReplicaView]:
        return list(self._views.values())

    def _current(self, address: str) -> bool:
        # False once set_addresses dropped (or replaced) this task: it must not touch the views any more.
        return self._tasks.get(address) is asyncio.current_task()

    async def _watch(self, address: str) -> None:
        attempt = 0
        while True:
            channel = insecure_channel(address)
            try:
                stub = replica_pb2_grpc.ReplicaStub(channel)
                async for state in stub.WatchState(replica_pb2.WatchStateRequest()):
                    if not self._current(address):
                        return
                    attempt = 0
                    view = view_of(address, state, self._clock())
                    self._views[address] = view
                    self._on_state(view, state)
            except grpc.aio.AioRpcError as error:
                log.info("replica %s state stream broke: %s", address, error.code().name)
            finally:
                lost = self._views.pop(address, None) if self._current(address) else None
                if lost is not None:
                    self._on_lost(lost.replica_id)
                await channel.close()
            await asyncio.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
            attempt += 1
