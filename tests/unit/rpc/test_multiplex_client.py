"""The caller's side of a multiplexed call bounds each request's unread
events: a request whose reader falls past the bound is cancelled at the
peer (as its own cancel would), its queue dropped, and its reader gets
`slow_reader`; every other request on the call keeps getting everything.

A fake Replica (a grpc.aio server on loopback) stands in for the engine,
which needs torch; it takes one step each time the test says so, so what
is queued where is exact, not a matter of timing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc
import pytest

from sluice.config import SluiceSettings
from sluice.outcomes import Reason
from sluice.router.replica_session import replica_session
from sluice.rpc.errors import ServiceError
from sluice.rpc.multiplex_client import DEFAULT_MAX_UNDELIVERED_EVENTS, MultiplexClient
from sluice.v1 import replica_pb2, replica_pb2_grpc

BOUND = 4


class SteppedReplica(replica_pb2_grpc.ReplicaServicer):
    """Each `step()` sends one batch: for every live request its next token
    (the step's number), or its finish once it has `tokens_per_request`.
    Records submits and cancels; a cancelled request gets nothing more."""

    def __init__(self, tokens_per_request: int) -> None:
        self.tokens_per_request = tokens_per_request
        self.submitted: list[str] = []
        self.cancelled: list[str] = []
        self._sent: dict[str, int] = {}
        self._steps: asyncio.Queue[None] = asyncio.Queue()

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            self._steps.put_nowait(None)

    async def GenerateMany(self, request_iterator, context):
        async def read_commands() -> None:
            async for command in request_iterator:
                if command.WhichOneof("command") == "submit":
                    self.submitted.append(command.submit.request_id)
                    self._sent[command.submit.request_id] = 0
                else:
                    self.cancelled.append(command.cancel_request_id)
                    self._sent.pop(command.cancel_request_id, None)

        reader = asyncio.create_task(read_commands())
        try:
            step = 0
            while True:
                await self._steps.get()
                events = []
                for request_id, sent in list(self._sent.items()):
                    if sent < self.tokens_per_request:
                        token = replica_pb2.TokenEvent(tokens=replica_pb2.TokenDelta(token_ids=[step]))
                        self._sent[request_id] = sent + 1
                    else:
                        token = replica_pb2.TokenEvent(finished=replica_pb2.TokenFinished())
                        del self._sent[request_id]
                    events.append(replica_pb2.RequestEvent(request_id=request_id, token=token))
                yield replica_pb2.TokenEventBatch(events=events)
                step += 1
        finally:
            reader.cancel()


async def until(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    async def poll() -> None:
        while not check():
            await asyncio.sleep(0.005)

    await asyncio.wait_for(poll(), timeout_s)


class Harness:
    def __init__(self, tokens_per_request: int) -> None:
        self.replica = SteppedReplica(tokens_per_request)
        self.server = grpc.aio.server()
        replica_pb2_grpc.add_ReplicaServicer_to_server(self.replica, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def __aenter__(self) -> Harness:
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.session: MultiplexClient[replica_pb2.TokenEvent] = replica_session(
            replica_pb2_grpc.ReplicaStub(self.channel), max_undelivered_events=BOUND)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.close()
        await self.channel.close()
        await self.server.stop(0)

    async def open(self, *request_ids: str):
        expected = self.replica.submitted + list(request_ids)
        streams = [self.session.open(replica_pb2.TokenRequest(request_id=rid)) for rid in request_ids]
        await until(lambda: self.replica.submitted == expected)
        return streams


def token_of(event: replica_pb2.TokenEvent) -> int:
    assert event.WhichOneof("event") == "tokens"
    return event.tokens.token_ids[0]


async def test_a_reader_past_the_bound_is_cancelled_upstream_and_the_others_get_everything():
    tokens = 3 * BOUND
    async with Harness(tokens_per_request=tokens) as harness:
        stalled, reading = await harness.open("stalled", "reading")
        received = []
        for step in range(tokens):
            harness.replica.step()
            # Read one event per step: "reading" never has more than one waiting.
            received.append(token_of(await asyncio.wait_for(reading.__anext__(), 5)))
            if step < BOUND:
                assert harness.replica.cancelled == []  # at the bound, not cut yet
        # The step after the bound cut "stalled" off: the replica heard a cancel...
        await until(lambda: harness.replica.cancelled == ["stalled"])
        harness.replica.step()
        finished = await asyncio.wait_for(reading.__anext__(), 5)
        # ...and the other request got every token, in order, and its finish.
        assert received == list(range(tokens))
        assert finished.WhichOneof("event") == "finished"
        with pytest.raises(StopAsyncIteration):
            await reading.__anext__()
        # The stalled reader's queued events were dropped: the reason comes first.
        with pytest.raises(ServiceError) as cut:
            await asyncio.wait_for(stalled.__anext__(), 5)
        info = cut.value.info
        assert info.reason == "slow_reader" and info.status == grpc.StatusCode.DEADLINE_EXCEEDED
        assert info.outcome.http_status == 408 and str(BOUND) in info.message
        with pytest.raises(StopAsyncIteration):
            await stalled.__anext__()
        stalled.cancel()  # a no-op now: no second cancel goes out
        (late,) = await harness.open("late")  # the call itself is fine
        harness.replica.step()
        assert token_of(await asyncio.wait_for(late.__anext__(), 5)) == tokens + 1
        assert harness.replica.cancelled == ["stalled"]


async def test_a_reader_exactly_at_the_bound_still_gets_the_whole_answer():
    # The last event may go one past the bound: nothing is left to stop.
    async with Harness(tokens_per_request=BOUND) as harness:
        (unread,) = await harness.open("unread")
        harness.replica.step(BOUND + 1)  # BOUND tokens, then the finish
        await until(lambda: not harness.replica._sent)
        events = [event async for event in unread]
        assert [e.WhichOneof("event") for e in events] == ["tokens"] * BOUND + ["finished"]
        assert harness.replica.cancelled == []


def test_the_bound_is_at_least_one_and_the_shared_setting_defaults_to_the_librarys(monkeypatch):
    monkeypatch.delenv("SLUICE_STREAM_BUFFER_EVENTS", raising=False)
    assert SluiceSettings().stream_buffer_events == DEFAULT_MAX_UNDELIVERED_EVENTS
    with pytest.raises(ValueError):
        MultiplexClient(None, lost=Reason.REPLICA_LOST, max_undelivered_events=0)


async def test_wake_ends_a_pending_read_with_none_and_never_piles_up_behind_events():
    async with Harness(tokens_per_request=3) as harness:
        (stream,) = await harness.open("woken")
        pending = asyncio.ensure_future(stream.__anext__())
        await asyncio.sleep(0.01)
        assert not pending.done()
        stream.wake()
        assert await asyncio.wait_for(pending, 5) is None
        harness.replica.step(2)
        await until(lambda: harness.replica._sent.get("woken") == 2)
        await until(lambda: stream._queue.qsize() == 2)
        for _ in range(5):
            stream.wake()  # events are waiting: no marker joins them
        assert [token_of(await stream.__anext__()) for _ in range(2)] == [0, 1]
        assert stream._queue.empty()
        harness.replica.step(2)  # the last token, then the finish
        events = [event async for event in stream]
        assert [e.WhichOneof("event") for e in events] == ["tokens", "finished"]
        stream.wake()  # after the end: nothing to wake
        with pytest.raises(StopAsyncIteration):
            await stream.__anext__()
