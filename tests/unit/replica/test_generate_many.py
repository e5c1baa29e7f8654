"""Replica.GenerateMany and the router's replica session over a real gRPC server
on loopback, a real engine loop and the tiny checkpoint.

Many requests share one call: each gets exactly the tokens a call of its own
gives, the events of one engine step travel together, a refused request or a
cancel touches no other request, and the call ending frees every block.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import grpc
import pytest
import torch

from sluice.engine.block_manager import BlockManager
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig
from sluice.model import ModelRunner, allocate_kv_caches, load_llama
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.executor import StepExecutor
from sluice.engine.plan import RequestOutput
from sluice.engine.request import FinishReason
from sluice.replica.metrics import ReplicaCounters
from sluice.replica.multiplex import MultiplexedRequests
from sluice.replica.servicer import ReplicaServicer
from sluice.router.replica_session import replica_session
from sluice.rpc.errors import ServiceError
from sluice.v1 import common_pb2, replica_pb2, replica_pb2_grpc

NUM_BLOCKS = 64


class Replica:
    """EngineLoop + ReplicaServicer behind a grpc.aio server on 127.0.0.1."""

    def __init__(self, checkpoint_path) -> None:
        model = load_llama(checkpoint_path, dtype=torch.float32)
        caches = allocate_kv_caches(model.config, NUM_BLOCKS, 16, torch.float32, "cpu")
        core = IterationScheduler(
            SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=16,
                            max_model_len_tokens=model.config.max_position_embeddings),
            BlockManager(NUM_BLOCKS, 16),
        )
        self.engine = EngineLoop(core, StepExecutor(ModelRunner(model, caches)))
        self.counters = ReplicaCounters()
        self.servicer = ReplicaServicer(self.engine, model.config, "r0", "tiny@1", lambda: True, self.counters, 1.0)
        self.server = grpc.aio.server()
        replica_pb2_grpc.add_ReplicaServicer_to_server(self.servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.channel: grpc.aio.Channel | None = None

    async def __aenter__(self) -> "Replica":
        self.engine.start()
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.port}")
        self.stub = replica_pb2_grpc.ReplicaStub(self.channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.channel.close()
        await self.server.stop(0)
        self.engine.stop()

    async def wait_idle(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            snap = self.engine.snapshot
            if snap.num_running == 0 and snap.num_waiting == 0 and snap.free_kv_blocks == NUM_BLOCKS:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"engine not idle: {self.engine.snapshot}")


def token_request(request_id: str, prompt: list[int], max_tokens: int = 12) -> replica_pb2.TokenRequest:
    return replica_pb2.TokenRequest(
        request_id=request_id, prompt_token_ids=prompt, max_output_tokens=max_tokens,
        sampling=common_pb2.SamplingParams(temperature=0.0, ignore_eos=True),
    )


PROMPTS = {"a": [5, 6, 7, 8], "b": [9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26], "c": [30]}


async def single_call_tokens(stub, request_id: str, prompt: list[int]) -> list[int]:
    tokens = []
    async for event in stub.Generate(token_request(request_id, prompt)):
        if event.WhichOneof("event") == "tokens":
            tokens += event.tokens.token_ids
    return tokens


@pytest.fixture
async def replica(tiny_checkpoint):
    async with Replica(tiny_checkpoint.path) as r:
        yield r


async def test_requests_on_one_call_get_what_a_call_of_their_own_gives(replica):
    expected = {rid: await single_call_tokens(replica.stub, f"solo-{rid}", p) for rid, p in PROMPTS.items()}
    commands: asyncio.Queue = asyncio.Queue()

    async def command_stream():
        while (command := await commands.get()) is not None:
            yield command

    for rid, prompt in PROMPTS.items():
        commands.put_nowait(replica_pb2.GenerateCommand(submit=token_request(rid, prompt)))
    tokens = {rid: [] for rid in PROMPTS}
    finished: dict[str, replica_pb2.TokenFinished] = {}
    multi_request_messages = 0
    async for batch in replica.stub.GenerateMany(command_stream()):
        multi_request_messages += len({e.request_id for e in batch.events}) > 1
        for event in batch.events:
            assert event.WhichOneof("event") == "token"
            if event.token.WhichOneof("event") == "tokens":
                assert event.request_id not in finished, "tokens after finished"
                tokens[event.request_id] += event.token.tokens.token_ids
            else:
                finished[event.request_id] = event.token.finished
        if len(finished) == len(PROMPTS):
            commands.put_nowait(None)  # close our side: the call ends
    assert tokens == expected
    assert all(f.usage.output_tokens == 12 and f.finish_reason == common_pb2.FINISH_REASON_LENGTH
               for f in finished.values())
    assert multi_request_messages > 0, "steps of several requests never shared a message"
    await replica.wait_idle()


async def test_refused_and_cancelled_requests_leave_the_others_alone(replica):
    session = replica_session(replica.stub)
    try:
        bad = session.open(token_request("bad", [10_000]))  # outside the 128-token vocabulary
        slow = session.open(token_request("slow", PROMPTS["b"], max_tokens=200))
        good = session.open(token_request("good", PROMPTS["a"]))
        with pytest.raises(ServiceError) as refused:
            async for _ in bad:
                pass
        assert refused.value.info.status == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.info.reason == "invalid_request"

        first = await slow.__anext__()
        assert first.WhichOneof("event") == "tokens"
        slow.cancel()  # as a relay does on a stop string or a disconnect

        events = [event async for event in good]
        assert events[-1].WhichOneof("event") == "finished"
        assert sum(len(e.tokens.token_ids) for e in events[:-1]) == 12
        await replica.wait_idle()  # the cancelled request's blocks came back
        assert replica.counters.cancelled_total == 1
    finally:
        await session.close()


async def test_the_call_failing_fails_every_request_on_it_and_frees_their_blocks(replica):
    session = replica_session(replica.stub)
    try:
        streams = [session.open(token_request(f"r{i}", PROMPTS["b"], max_tokens=200)) for i in range(3)]
        for stream in streams:
            await stream.__anext__()  # all running
        await replica.server.stop(0)  # the replica goes away mid-stream
        for stream in streams:
            with pytest.raises(ServiceError) as failed:
                async for _ in stream:
                    pass
            assert failed.value.info.status in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
        await replica.wait_idle()
        assert replica.counters.cancelled_total == 3  # the servicer cancelled them on the engine
    finally:
        await session.close()


async def test_a_new_request_after_a_failed_call_opens_a_new_call(tiny_checkpoint):
    async with Replica(tiny_checkpoint.path) as first:
        session = replica_session(first.stub)
        stream = session.open(token_request("x", PROMPTS["a"]))
        events = [event async for event in stream]
        assert events[-1].WhichOneof("event") == "finished"
        broken = session._current
        broken.call.cancel()  # the call breaks (as on a network failure)
        await asyncio.gather(broken.reader, return_exceptions=True)
        again = session.open(token_request("y", PROMPTS["a"]))
        assert session._current is not broken
        events = [event async for event in again]
        assert events[-1].WhichOneof("event") == "finished"
        await session.close()


class RecordingEngine:
    def __init__(self) -> None:
        self.sinks = {}
        self.flushes = {}
        self.cancelled = []

    def submit(self, request, sink, flush=None) -> None:
        self.sinks[request.request_id] = sink
        self.flushes[request.request_id] = flush

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def output(request_id, tokens, finish=None, produced=0):
    return RequestOutput(request_id, tuple(tokens), finish, 4, 0, produced)


async def test_outputs_waiting_for_a_slow_reader_leave_as_one_delta_per_request(tiny_checkpoint):
    from sluice.model.config import LlamaConfig

    engine = RecordingEngine()
    requests = MultiplexedRequests(engine, tiny_checkpoint.model.config, ReplicaCounters())
    for rid in ("a", "b"):
        requests.submit(token_request(rid, [5, 6, 7, 8]))
    # Three steps pass before the event loop gets to read (the model thread's sinks).
    engine.sinks["a"](output("a", [1]))
    engine.sinks["b"](output("b", [7]))
    engine.sinks["a"](output("a", [2]))
    engine.sinks["a"](output("a", [3], FinishReason.LENGTH, produced=3))
    engine.sinks["b"](ValueError("cannot fit"))
    engine.flushes["b"]()  # the engine loop flushes a failure at once
    batch = await requests.next_batch()
    events = [(e.request_id, e.WhichOneof("event")) for e in batch.events]
    assert events == [("b", "token"), ("b", "failed"), ("a", "token"), ("a", "token")]
    assert list(batch.events[0].token.tokens.token_ids) == [7]
    assert batch.events[1].failed.reason == "invalid_request"
    assert list(batch.events[2].token.tokens.token_ids) == [1, 2, 3]
    assert batch.events[3].token.finished.usage.output_tokens == 3
    requests.close()
    assert await requests.next_batch() is None  # nothing left running: the call may end
    assert engine.cancelled == []


async def test_a_steps_outputs_wake_the_reader_once_at_the_engines_flush(tiny_checkpoint):
    engine = RecordingEngine()
    requests = MultiplexedRequests(engine, tiny_checkpoint.model.config, ReplicaCounters())
    for rid in ("a", "b"):
        requests.submit(token_request(rid, [5, 6, 7, 8]))
    assert engine.flushes["a"] is not None and engine.flushes["a"] == engine.flushes["b"]  # one per call
    engine.sinks["a"](output("a", [1]))
    engine.sinks["b"](output("b", [7]))
    reader = asyncio.ensure_future(requests.next_batch())
    await asyncio.sleep(0.05)
    assert not reader.done()  # sunk, but the step's outputs are not all in yet
    engine.flushes["a"]()
    engine.flushes["b"]()  # the engine calls each distinct flush once; a second call adds no message
    batch = await asyncio.wait_for(reader, 2)
    assert [(e.request_id, list(e.token.tokens.token_ids)) for e in batch.events] == [("a", [1]), ("b", [7])]
    assert requests._pending == deque()
