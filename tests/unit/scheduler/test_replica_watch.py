"""ReplicaWatcher.set_addresses: discovery adds and removes replicas while
the scheduler runs; a removed one leaves placement at once (on_lost before
set_addresses returns), without waiting for its stream to break. A small
grpc.aio WatchState server on loopback stands in for a replica (the real
one needs the engine; tests/integration/test_scheduler_discovery.py runs
real replica processes)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from sluice.scheduler.replica_watch import ReplicaWatcher
from sluice.v1 import replica_pb2, replica_pb2_grpc


class StateOnly(replica_pb2_grpc.ReplicaServicer):
    """Reports one ready state every 20 ms until the call is cancelled."""

    def __init__(self, replica_id: str) -> None:
        self.replica_id = replica_id
        self.streams_open = 0

    async def WatchState(self, request, context):
        self.streams_open += 1
        try:
            while True:
                yield replica_pb2.ReplicaState(replica_id=self.replica_id, model_version="v1", total_kv_blocks=64,
                                               free_kv_blocks=64, block_size_tokens=16, ready=True, max_num_seqs=4)
                await asyncio.sleep(0.02)
        finally:
            self.streams_open -= 1


@pytest.fixture
async def replicas():
    started = []
    for replica_id in ("r0", "r1"):
        server = grpc.aio.server()
        servicer = StateOnly(replica_id)
        replica_pb2_grpc.add_ReplicaServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        started.append((f"127.0.0.1:{port}", servicer, server))
    yield [(address, servicer) for address, servicer, _ in started]
    for _, _, server in started:
        await server.stop(0)


async def until(check, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_added_replicas_are_watched_and_a_removed_one_is_lost_at_once(replicas):
    (a0, s0), (a1, s1) = replicas
    lost: list[str] = []
    watcher = ReplicaWatcher(lambda view, state: None, lost.append)
    try:
        watcher.set_addresses([a0])
        await until(lambda: [v.replica_id for v in watcher.views()] == ["r0"])
        watcher.set_addresses([a0, a1])
        await until(lambda: sorted(v.replica_id for v in watcher.views()) == ["r0", "r1"])
        assert watcher.addresses() == {a0, a1}

        watcher.set_addresses([a1])

        assert lost == ["r0"]  # before any await: the pod that left takes no new placement
        assert [v.replica_id for v in watcher.views()] == ["r1"]
        await until(lambda: s0.streams_open == 0)  # and its stream is closed
        await asyncio.sleep(0.1)  # states keep coming from r1 only; r0 does not come back
        assert [v.replica_id for v in watcher.views()] == ["r1"] and lost == ["r0"]

        watcher.set_addresses([a0, a1])  # the pod turns ready again
        await until(lambda: sorted(v.replica_id for v in watcher.views()) == ["r0", "r1"])
    finally:
        await watcher.stop()
    await until(lambda: s0.streams_open == 0 and s1.streams_open == 0)


async def test_an_address_removed_before_it_connected_is_not_reported_lost():
    lost: list[str] = []
    watcher = ReplicaWatcher(lambda view, state: None, lost.append)
    watcher.set_addresses(["127.0.0.1:1"])  # nothing listens: never connects
    await asyncio.sleep(0.05)
    watcher.set_addresses([])
    await watcher.stop()
    assert lost == [] and watcher.views() == [] and watcher.addresses() == frozenset()


async def test_a_broken_stream_still_loses_the_replica():
    lost: list[str] = []
    server = grpc.aio.server()
    replica_pb2_grpc.add_ReplicaServicer_to_server(StateOnly("r9"), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    watcher = ReplicaWatcher(lambda view, state: None, lost.append)
    try:
        watcher.set_addresses([f"127.0.0.1:{port}"])
        await until(lambda: len(watcher.views()) == 1)
        await server.stop(0)
        await until(lambda: lost == ["r9"])
        assert watcher.views() == []
        assert watcher.addresses() == {f"127.0.0.1:{port}"}  # still wanted: it reconnects when the pod is back
    finally:
        await watcher.stop()
