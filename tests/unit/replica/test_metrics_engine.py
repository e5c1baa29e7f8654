"""The replica's engine metrics: request phases (queue, prefill, decode) by
class, batch composition per step (decode vs prefill tokens), step wall
time, canary failures and the process collectors.

EngineMetrics alone on hand-written plans and times (exact values), then
the real EngineLoop thread over the real core and the tiny checkpoint
(counts that must add up: every prompt token is prefill, every output
token after the first is a decode)."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from prometheus_client import generate_latest

from sluice.engine.block_manager import BlockManager
from sluice.engine.plan import RequestOutput, ScheduledChunk, StepPlan
from sluice.engine.request import EngineRequest, FinishReason, ServiceClass, StopPolicy
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig
from sluice.model import ModelRunner, allocate_kv_caches
from sluice.model.sampler import SamplingParams
from sluice.replica.canary import Canary
from sluice.replica.engine_loop import EngineLoop, EngineSnapshot
from sluice.replica.engine_metrics import EngineMetrics
from sluice.replica.executor import StepExecutor
from sluice.replica.metrics import ReplicaCollector, ReplicaCounters, create_registry

NUM_BLOCKS = 64
LABELS = {"model": "tiny@1", "replica": "r0"}


def request(request_id: str, prompt: tuple[int, ...], *, max_tokens: int = 4,
            service_class: ServiceClass = ServiceClass.INTERACTIVE, probe: bool = False) -> EngineRequest:
    return EngineRequest(
        request_id=request_id, prompt_token_ids=prompt, service_class=service_class, probe=probe,
        stop=StopPolicy(max_output_tokens=max_tokens, ignore_eos=True),
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )


def chunk(request_id: str, tokens: int, num_output_tokens: int = 0) -> ScheduledChunk:
    return ScheduledChunk(request_id, tuple(range(tokens)), 0, (0,), True, num_output_tokens)


def output(request_id: str, finished: bool = False) -> RequestOutput:
    return RequestOutput(request_id, (7,), FinishReason.LENGTH if finished else None, 4, 0, 1)


def sample(registry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, {**LABELS, **labels})


def registry_of(metrics: EngineMetrics):
    snapshot = EngineSnapshot(total_kv_blocks=1, free_kv_blocks=1, block_size_tokens=16, num_running=0,
                              num_waiting=0, step_time_s=0.0, steps_total=0, generated_tokens_total=0,
                              preemptions_total=0, last_step_at_s=0.0)
    collector = ReplicaCollector("r0", "tiny@1", lambda: snapshot, ReplicaCounters(), lambda: True)
    return create_registry(collector, metrics)


def test_phases_and_step_tokens_from_plans_and_times():
    metrics = EngineMetrics("tiny@1", "r0")
    registry = registry_of(metrics)
    metrics.arrived(request("a", (1, 2, 3, 4)), 1.0)
    metrics.arrived(request("b", (1, 2), service_class=ServiceClass.BATCH), 1.5)
    metrics.arrived(request("canary-0", (1,), probe=True), 1.5)
    # Step 1 (2.0 -> 2.5): a's whole prompt samples its first token; b gets
    # a first chunk that does not reach its end; the canary's one token.
    metrics.step(StepPlan((chunk("a", 4), chunk("b", 1), chunk("canary-0", 1))),
                 [output("a"), output("canary-0", finished=True)], 2.0, 2.5)
    # Step 2 (3.0 -> 3.25): a decodes and finishes; b's last prompt token.
    metrics.step(StepPlan((chunk("a", 1, num_output_tokens=1), chunk("b", 1))), [output("a", finished=True),
                                                                                 output("b")], 3.0, 3.25)
    metrics.ended("b", 4.0)  # cancelled while decoding

    interactive, batch = {"class": "interactive"}, {"class": "batch"}
    assert sample(registry, "sluice_request_queue_time_seconds_sum", **interactive) == 1.0
    assert sample(registry, "sluice_request_queue_time_seconds_sum", **batch) == 0.5
    assert sample(registry, "sluice_request_prefill_time_seconds_sum", **interactive) == 0.5
    assert sample(registry, "sluice_request_prefill_time_seconds_sum", **batch) == 1.25  # 2.0 -> 3.25
    assert sample(registry, "sluice_request_decode_time_seconds_sum", **interactive) == 0.75
    assert sample(registry, "sluice_request_decode_time_seconds_sum", **batch) == 0.75  # 3.25 -> cancel at 4.0
    for phase in ("queue", "prefill", "decode"):  # one each: the canary is not a request
        for labels in (interactive, batch):
            assert sample(registry, f"sluice_request_{phase}_time_seconds_count", **labels) == 1
    assert sample(registry, "sluice_engine_step_tokens_total", kind="prefill") == 4 + 1 + 1 + 1
    assert sample(registry, "sluice_engine_step_tokens_total", kind="decode") == 1
    assert sample(registry, "sluice_engine_step_duration_seconds_count") == 2
    assert sample(registry, "sluice_engine_step_duration_seconds_sum") == 0.75
    assert sample(registry, "sluice_engine_step_duration_seconds_bucket", le="0.25") == 1


def test_a_failed_request_observes_no_phase_it_did_not_finish():
    metrics = EngineMetrics("tiny@1", "r0")
    registry = registry_of(metrics)
    metrics.arrived(request("a", (1, 2)), 0.0)
    metrics.step(StepPlan((chunk("a", 2),)), [output("a")], 1.0, 2.0)
    metrics.forget("a")
    metrics.ended("a", 3.0)  # a cancel after the failure: already forgotten
    assert sample(registry, "sluice_request_prefill_time_seconds_count", **{"class": "interactive"}) == 1
    assert sample(registry, "sluice_request_decode_time_seconds_count", **{"class": "interactive"}) == 0


def make_engine(model) -> EngineLoop:
    caches = allocate_kv_caches(model.config, NUM_BLOCKS, 16, torch.float32, "cpu")
    core = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=8, max_num_seqs=16,
                        max_model_len_tokens=model.config.max_position_embeddings),
        BlockManager(NUM_BLOCKS, 16),
    )
    return EngineLoop(core, StepExecutor(ModelRunner(model, caches)), metrics=EngineMetrics("tiny@1", "r0"))


@pytest.fixture
def engine(tiny_checkpoint):
    loop = make_engine(tiny_checkpoint.model)
    loop.start()
    yield loop
    loop.stop()


def test_the_engine_loop_counts_every_scheduled_token_once(engine):
    # Under 16 tokens each: no full block, so no prefix-cache hit, and a
    # budget of 8 tokens a step chunks the 13-token prompt.
    prompts = {"i1": (5, 6, 7, 8), "i2": tuple(range(30, 43)), "b1": (9, 10, 11)}
    max_tokens = {"i1": 5, "i2": 3, "b1": 6}
    outputs: dict[str, list[int]] = {rid: [] for rid in prompts}
    done = threading.Semaphore(0)

    def sink_for(request_id):
        def sink(event):
            assert isinstance(event, RequestOutput), event
            outputs[request_id].extend(event.new_token_ids)
            if event.finished:
                done.release()
        return sink

    for rid, prompt in prompts.items():
        service_class = ServiceClass.BATCH if rid.startswith("b") else ServiceClass.INTERACTIVE
        engine.submit(request(rid, prompt, max_tokens=max_tokens[rid], service_class=service_class), sink_for(rid))
    for _ in prompts:
        assert done.acquire(timeout=60)
    engine.stop()  # no step runs after this, so the snapshot and the metrics agree

    registry = registry_of(engine.metrics)
    assert {rid: len(tokens) for rid, tokens in outputs.items()} == max_tokens
    assert sample(registry, "sluice_engine_step_tokens_total", kind="prefill") == sum(map(len, prompts.values()))
    # The first token of each comes from its prefill's last chunk.
    assert sample(registry, "sluice_engine_step_tokens_total", kind="decode") == sum(max_tokens.values()) - 3
    assert sample(registry, "sluice_engine_step_duration_seconds_count") == engine.snapshot.steps_total
    for phase in ("queue", "prefill", "decode"):
        assert sample(registry, f"sluice_request_{phase}_time_seconds_count", **{"class": "interactive"}) == 2
        assert sample(registry, f"sluice_request_{phase}_time_seconds_count", **{"class": "batch"}) == 1
        assert sample(registry, f"sluice_request_{phase}_time_seconds_sum", **{"class": "interactive"}) >= 0


async def test_a_canary_that_times_out_is_counted(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint.model)
    counters = ReplicaCounters()

    async def on_change(ready: bool) -> None:
        pass

    # The loop is not started: the probe cannot come back.
    canary = Canary(engine, probe_token_id=1, interval_s=1.0, timeout_s=0.05, on_change=on_change, counters=counters)
    assert await canary.probe_once() is False
    assert await canary.probe_once() is False
    collector = ReplicaCollector("r0", "tiny@1", lambda: engine.snapshot, counters, lambda: canary.ready)
    registry = create_registry(collector)
    assert sample(registry, "sluice_replica_canary_failures_total") == 2


def test_the_replica_registry_serves_the_process_collectors():
    text = generate_latest(registry_of(EngineMetrics("tiny@1", "r0"))).decode()
    assert "process_cpu_seconds_total" in text
    assert "process_resident_memory_bytes" in text
    assert "python_info" in text
    assert 'sluice_engine_step_duration_seconds_bucket{le="0.001",model="tiny@1",replica="r0"}' in text
