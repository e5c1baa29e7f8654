"""The relay ends a stream whose replica stopped making progress (nothing
for the stall timeout: `replica_lost`, retryable) or whose request's
deadline passed (`deadline_exceeded`), in-band after the stream started;
either way the replica's call is cancelled and the scheduler gets the
reservation back.

The real Relay, model registry (the tiny model's tokenizer) and replica
session run against a fake Replica (a grpc.aio server on loopback, since
the engine needs torch) and a fake placement client (the scheduler's
stream is not what is tested here)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from sluice.router.catalog import single_model_catalog
from sluice.router.metrics import RouterMetrics
from sluice.router.models import ModelRegistry
from sluice.router.relay import Relay
from sluice.router.replica_channels import ReplicaChannels
from sluice.v1 import common_pb2, replica_pb2, replica_pb2_grpc, router_pb2, scheduler_pb2

STALL_TIMEOUT_S = 0.2
WAIT_S = 10.0  # a bound on each whole stream, far above the timeouts it exercises


class FakeReplica(replica_pb2_grpc.ReplicaServicer):
    """Sends each request `tokens` single-token deltas, `interval_s` apart
    (`tokens` None: forever), then its finish (`finish`) or nothing more
    with the call still open (a stalled replica). Records what it was asked
    to cancel."""

    def __init__(self, tokens: int | None, interval_s: float = 0.0, finish: bool = False) -> None:
        self.tokens = tokens
        self.interval_s = interval_s
        self.finish = finish
        self.cancelled: list[str] = []
        self._outbox: asyncio.Queue[replica_pb2.TokenEventBatch] = asyncio.Queue()

    async def _stream(self, request_id: str) -> None:
        sent = 0
        while self.tokens is None or sent < self.tokens:
            if request_id in self.cancelled:
                return
            self._outbox.put_nowait(replica_pb2.TokenEventBatch(events=[replica_pb2.RequestEvent(
                request_id=request_id,
                token=replica_pb2.TokenEvent(tokens=replica_pb2.TokenDelta(token_ids=[100 + sent])))]))
            sent += 1
            await asyncio.sleep(self.interval_s)
        if self.finish:
            self._outbox.put_nowait(replica_pb2.TokenEventBatch(events=[replica_pb2.RequestEvent(
                request_id=request_id, token=replica_pb2.TokenEvent(finished=replica_pb2.TokenFinished(
                    finish_reason=common_pb2.FINISH_REASON_LENGTH, usage=common_pb2.Usage(output_tokens=sent))))]))

    async def GenerateMany(self, request_iterator, context):
        streams: list[asyncio.Task[None]] = []

        async def read_commands() -> None:
            async for command in request_iterator:
                if command.WhichOneof("command") == "submit":
                    streams.append(asyncio.create_task(self._stream(command.submit.request_id)))
                else:
                    self.cancelled.append(command.cancel_request_id)

        reader = asyncio.create_task(read_commands())
        try:
            while True:
                yield await self._outbox.get()
        finally:
            reader.cancel()
            for stream in streams:
                stream.cancel()


class FakePlacement:
    """Dispatches everything to the fake replica; records releases."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.released: list[tuple[str, int]] = []

    async def place(self, enqueue: scheduler_pb2.Enqueue, timeout_s: float) -> scheduler_pb2.Dispatch:
        return scheduler_pb2.Dispatch(replica_id="replica-0", replica_address=self.address)

    def started(self, request_id: str) -> None:
        pass

    def release(self, request_id: str, output_tokens: int = 0) -> None:
        self.released.append((request_id, output_tokens))


@pytest.fixture(scope="module")
def registry(tiny_model_dir) -> ModelRegistry:
    return ModelRegistry(single_model_catalog("tiny", "tiny-v1", tiny_model_dir), created_unix_s=0.0)


class Harness:
    def __init__(self, registry: ModelRegistry, replica: FakeReplica, stall_timeout_s: float) -> None:
        self.replica = replica
        self.server = grpc.aio.server()
        replica_pb2_grpc.add_ReplicaServicer_to_server(replica, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.placement = FakePlacement(f"127.0.0.1:{port}")
        self.replicas = ReplicaChannels()
        self.metrics = RouterMetrics.create()
        self.relay = Relay(registry, self.placement, self.replicas, self.metrics, placement_timeout_s=5.0,
                           stall_timeout_s=stall_timeout_s)

    async def __aenter__(self) -> Harness:
        await self.server.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.replicas.close()
        await self.server.stop(0)

    async def run(self, request_id: str, deadline_unix_s: float = 0.0) -> list[router_pb2.GenerateEvent]:
        request = router_pb2.GenerateRequest(
            request_id=request_id, tenant="acme", model="tiny", prompt_text="hello there",
            max_output_tokens=1000, deadline_unix_s=deadline_unix_s,
        )

        async def collect() -> list[router_pb2.GenerateEvent]:
            return [event async for event in self.relay.generate(request)]

        return await asyncio.wait_for(collect(), WAIT_S)

    async def cancelled_at_the_replica(self, request_id: str) -> None:
        async def poll() -> None:
            while request_id not in self.replica.cancelled:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(poll(), WAIT_S)

    def outcomes(self) -> dict[str, float]:
        return {s.labels["outcome"]: s.value for m in self.metrics.registry.collect()
                if m.name == "sluice_router_requests" for s in m.samples if s.name.endswith("_total")}


def kinds(events: list[router_pb2.GenerateEvent]) -> list[str]:
    return [event.WhichOneof("event") for event in events]


async def test_a_replica_that_sends_nothing_more_ends_the_stream_as_replica_lost(registry):
    async with Harness(registry, FakeReplica(tokens=2), STALL_TIMEOUT_S) as harness:
        events = await harness.run("stalled")
        assert kinds(events) == ["admitted", "delta", "delta", "error"]
        error = events[-1].error
        assert error.code == "replica_lost" and "stopped making progress" in error.message
        await harness.cancelled_at_the_replica("stalled")  # its KV comes back at the next step
        assert harness.placement.released == [("stalled", 2)]
        assert harness.outcomes() == {"error": 1.0}


async def test_a_stream_longer_than_the_stall_timeout_that_keeps_making_progress_finishes(registry):
    # 60 tokens 20 ms apart take longer than the timeout; each wait is far shorter.
    async with Harness(registry, FakeReplica(tokens=60, interval_s=0.02, finish=True), 0.5) as harness:
        events = await harness.run("healthy")
        assert kinds(events)[0] == "admitted" and kinds(events)[-1] == "finished"
        assert kinds(events).count("delta") >= 60 and "error" not in kinds(events)
        assert harness.placement.released == [("healthy", 60)]
        assert harness.outcomes() == {"length": 1.0}


@pytest.mark.parametrize("deadline_in_s", [0.3, -1.0], ids=["passes-mid-stream", "already-passed"])
async def test_a_passed_deadline_ends_a_stream_that_still_makes_progress(registry, deadline_in_s):
    # Tokens keep coming every 10 ms, so the stall timeout never fires; the
    # request's own deadline (wall clock) does.
    async with Harness(registry, FakeReplica(tokens=None, interval_s=0.01), stall_timeout_s=30.0) as harness:
        events = await harness.run("late", deadline_unix_s=time.time() + deadline_in_s)
        assert kinds(events)[0] == "admitted" and kinds(events)[-1] == "error"
        assert set(kinds(events)[1:-1]) <= {"delta"}
        error = events[-1].error
        assert error.code == "deadline_exceeded" and "deadline passed" in error.message
        await harness.cancelled_at_the_replica("late")
        assert [request_id for request_id, _ in harness.placement.released] == ["late"]
        assert harness.outcomes() == {"error": 1.0}
