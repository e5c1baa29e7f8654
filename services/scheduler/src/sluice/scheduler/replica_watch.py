"""Keeps a fresh `ReplicaView` per replica from its WatchState stream."""

import asyncio
import logging
import time

import grpc

from sluice.placement.replica_choice import ReplicaView
from sluice.rpc.channels import insecure_channel
from sluice.v1 import replica_pb2, replica_pb2_grpc

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)


class ReplicaWatcher:
    """One task per replica address; `views()` is read by the servicer.

    Only the watch tasks write `_views`; a broken stream removes the view
    so no request is placed on a replica we cannot see.
    """

    def __init__(self, addresses: list[str], clock=time.monotonic) -> None:
        self._addresses = addresses
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
                    self._views[address] = ReplicaView(
                        replica_id=state.replica_id,
                        address=address,
                        model_version=state.model_version,
                        total_kv_blocks=state.total_kv_blocks,
                        free_kv_blocks=state.free_kv_blocks,
                        block_size_tokens=state.block_size_tokens,
                        num_running=state.num_running,
                        num_waiting=state.num_waiting,
                        ready=state.ready,
                        seen_at_s=self._clock(),
                    )
            except grpc.aio.AioRpcError as error:
                log.info("replica %s state stream broke: %s", address, error.code().name)
            finally:
                self._views.pop(address, None)
                await channel.close()
            await asyncio.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
            attempt += 1
