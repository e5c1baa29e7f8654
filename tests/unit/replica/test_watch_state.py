"""Replica.WatchState over a real gRPC server on loopback, a real engine loop
and the tiny checkpoint: the prefix-cache deltas a subscriber reads add up
to what the engine caches, under the hashes the router computes itself from
token ids (sluice.engine.block_hash)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest
import torch

from sluice.engine.block_hash import BlockHash, extend_block_hashes
from sluice.engine.block_manager import BlockManager
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig
from sluice.model import ModelRunner, allocate_kv_caches, load_llama
from sluice.replica.cache_events import CacheEventLog
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.executor import StepExecutor
from sluice.replica.metrics import ReplicaCounters
from sluice.replica.servicer import ReplicaServicer
from sluice.v1 import common_pb2, replica_pb2, replica_pb2_grpc

# 8 blocks of 8 tokens: two requests of the sizes below need an eviction.
NUM_BLOCKS, BLOCK_SIZE, MAX_SEQS = 8, 8, 16
STATE_INTERVAL_S = 0.02
FIRST = list(range(1, 21))       # 20 tokens: 2 full blocks cached after it runs
SECOND = list(range(60, 110))    # 50 tokens + 4 outputs: 7 blocks, one of FIRST's evicted


def hashes_of(token_ids: list[int]) -> list[BlockHash]:
    """What the router computes: chained hashes of the full blocks."""
    hashes: list[BlockHash] = []
    extend_block_hashes(hashes, token_ids, BLOCK_SIZE)
    return hashes


class Replica:
    def __init__(self, checkpoint_path, cache_events: CacheEventLog | None = None) -> None:
        model = load_llama(checkpoint_path, dtype=torch.float32)
        caches = allocate_kv_caches(model.config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, "cpu")
        self.core = IterationScheduler(
            SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=MAX_SEQS,
                            max_model_len_tokens=model.config.max_position_embeddings),
            BlockManager(NUM_BLOCKS, BLOCK_SIZE),
        )
        self.engine = EngineLoop(self.core, StepExecutor(ModelRunner(model, caches)), cache_events=cache_events)
        self.servicer = servicer = ReplicaServicer(self.engine, model.config, "r0", "tiny@1", lambda: True,
                                                   ReplicaCounters(), STATE_INTERVAL_S)
        self.server = grpc.aio.server()
        replica_pb2_grpc.add_ReplicaServicer_to_server(servicer, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")

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

    async def generate(self, request_id: str, prompt: list[int], max_tokens: int = 4) -> list[int]:
        request = replica_pb2.TokenRequest(
            request_id=request_id, prompt_token_ids=prompt, max_output_tokens=max_tokens,
            sampling=common_pb2.SamplingParams(temperature=0.0, ignore_eos=True))
        tokens = []
        async for event in self.stub.Generate(request):
            if event.WhichOneof("event") == "tokens":
                tokens += event.tokens.token_ids
        return tokens

    async def wait_idle(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            snap = self.engine.snapshot
            if snap.num_running == 0 and snap.num_waiting == 0 and snap.free_kv_blocks == NUM_BLOCKS:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"engine not idle: {self.engine.snapshot}")

    def true_cached_set(self) -> set[bytes]:
        """The block manager's own answer; read only while the engine is idle."""
        return set(self.core.blocks.cached_block_hashes())


class Watcher:
    """A WatchState subscriber applying deltas the way the cluster scheduler will."""

    def __init__(self, stub, min_interval_s: float = 0.0) -> None:
        self.call = stub.WatchState(replica_pb2.WatchStateRequest(min_interval_s=min_interval_s))
        self.view: set[bytes] = set()
        self.stored: set[bytes] = set()   # every hash a delta reported stored
        self.evicted: set[bytes] = set()  # every hash a delta reported evicted

    async def read(self) -> replica_pb2.ReplicaState:
        state = await asyncio.wait_for(self.call.read(), timeout=10)
        stored, evicted = set(state.cache_stored_block_hashes), set(state.cache_evicted_block_hashes)
        if state.cache_snapshot:
            assert not evicted
            self.view = stored
        else:
            assert not stored & evicted, "a hash in both lists of one message"
            self.view = (self.view | stored) - evicted
            self.stored |= stored
            self.evicted |= evicted
        return state

    async def read_until(self, view: set[bytes], timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.view != view:
            assert time.monotonic() < deadline, f"view never became the cached set: {len(self.view)} vs {len(view)}"
            await self.read()


@pytest.fixture
async def replica(tiny_checkpoint):
    async with Replica(tiny_checkpoint.path) as r:
        yield r


async def test_the_stream_reports_stored_then_evicted_prompt_blocks(replica):
    watcher = Watcher(replica.stub)
    first = await watcher.read()
    assert first.cache_snapshot and not first.cache_stored_block_hashes
    assert first.max_num_seqs == MAX_SEQS and first.total_kv_blocks == NUM_BLOCKS

    await replica.generate("first", FIRST)
    await replica.wait_idle()
    first_hashes = hashes_of(FIRST)
    assert len(first_hashes) == 2  # 20 prompt + 3 computed outputs: 2 full blocks
    await watcher.read_until(set(first_hashes))
    assert watcher.stored == set(first_hashes) == replica.true_cached_set()
    assert not watcher.evicted

    outputs = await replica.generate("second", SECOND)
    await replica.wait_idle()
    # 54 tokens, the last never computed: 6 full blocks, outputs included.
    second_hashes = hashes_of(SECOND + outputs[:-1])
    assert len(second_hashes) == 6
    # 7 blocks for "second", 6 free uncached: FIRST's tail block (freed
    # first, so least recently used) is evicted; its head stays cached.
    expected = {first_hashes[0], *second_hashes}
    assert replica.true_cached_set() == expected
    await watcher.read_until(expected)
    assert watcher.evicted == {first_hashes[1]}
    assert watcher.stored == set(first_hashes) | set(second_hashes)
    watcher.call.cancel()


async def test_a_second_subscriber_starts_from_a_snapshot(replica):
    await replica.generate("first", FIRST)
    await replica.wait_idle()
    late = Watcher(replica.stub)
    state = await late.read()
    assert state.cache_snapshot and set(state.cache_stored_block_hashes) == set(hashes_of(FIRST))
    state = await late.read()
    assert not state.cache_snapshot and not state.cache_stored_block_hashes
    late.call.cancel()


async def test_a_subscriber_that_falls_behind_gets_a_snapshot_of_the_true_set(tiny_checkpoint):
    # A history of 4 events; the two requests cause 2 + 1 + 6 of them.
    async with Replica(tiny_checkpoint.path, cache_events=CacheEventLog(max_events=4)) as replica:
        slow = Watcher(replica.stub, min_interval_s=2.0)
        started_s = time.monotonic()
        assert (await slow.read()).cache_snapshot
        await replica.generate("first", FIRST)
        await replica.generate("second", SECOND)
        await replica.wait_idle()
        assert time.monotonic() - started_s < 2.0, "too slow to test: the subscriber's next message went out mid-run"
        state = await slow.read()
        assert state.cache_snapshot
        assert set(state.cache_stored_block_hashes) == replica.true_cached_set()
        assert len(replica.true_cached_set()) == 7
        slow.call.cancel()


async def test_closing_the_watches_ends_each_stream_with_ok_at_once(replica):
    # A long interval: the stream would otherwise sit in its wait for 30 s.
    watchers = [Watcher(replica.stub, min_interval_s=30.0) for _ in range(2)]
    for watcher in watchers:
        assert (await watcher.read()).cache_snapshot
    replica.servicer.close_watches()
    for watcher in watchers:
        assert await asyncio.wait_for(watcher.call.read(), timeout=5) is grpc.aio.EOF
        assert await watcher.call.code() == grpc.StatusCode.OK
    # A stream opened after the close gets one report, then ends too.
    late = Watcher(replica.stub, min_interval_s=30.0)
    assert (await late.read()).cache_snapshot
    assert await asyncio.wait_for(late.call.read(), timeout=5) is grpc.aio.EOF
