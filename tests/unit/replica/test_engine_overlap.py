"""The engine loop with overlap (async scheduling): the model on its own
thread, step N+1 planned and prepared while step N runs.

The real core, executor, runner and tiny model. A workload with greedy and
seeded sampled requests, stop tokens and a KV pool small enough to preempt
must give every request the tokens and finish reason it gets with one step
at a time, free every block, and a failed step must fail only its own
requests. Either way a submitter's flush follows each step's outputs once,
and without overlap it comes right before the next step runs.
"""

from __future__ import annotations

import threading

import pytest
import torch

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import EngineRequest, FinishReason, ServiceClass, StopPolicy
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig
from sluice.model import ModelRunner, allocate_kv_caches
from sluice.model.sampler import SamplingParams
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.executor import StepExecutor

BLOCK = 4


def workload() -> list[EngineRequest]:
    g = torch.Generator().manual_seed(7)
    requests = []
    for i in range(10):
        prompt = tuple(torch.randint(3, 128, (int(torch.randint(2, 40, (1,), generator=g)),), generator=g).tolist())
        max_tokens = int(torch.randint(3, 16, (1,), generator=g))
        sampled = i % 2 == 1
        # A wide set of stop ids: sampled requests hit one now and then.
        stop_ids = frozenset(range(20, 32)) if i % 3 == 0 else frozenset()
        requests.append(EngineRequest(
            request_id=f"r{i}", prompt_token_ids=prompt,
            stop=StopPolicy(max_output_tokens=max_tokens, stop_token_ids=stop_ids, ignore_eos=True),
            service_class=ServiceClass.BATCH if i % 4 == 3 else ServiceClass.INTERACTIVE,
            fairness_key=f"t{i % 3}",
            sampling=SamplingParams(temperature=0.9 if sampled else 0.0, seed=100 + i if sampled else None,
                                    ignore_eos=True, max_tokens=max_tokens, stop_token_ids=tuple(stop_ids)),
        ))
    return requests


class FailingStep(StepExecutor):
    """Raises on the run of any step that holds `victim`; notes each run in `log`."""

    def __init__(self, runner: ModelRunner, victim: str | None, log: list) -> None:
        super().__init__(runner)
        self.victim = victim
        self.log = log

    def run_prepared(self, prepared, previous=None, should_yield=None):
        self.log.append(("run",))
        if any(chunk.request_id == self.victim for chunk in prepared.plan.chunks):
            raise RuntimeError("the device fell over")
        return super().run_prepared(prepared, previous, should_yield)


def run(model, overlap: bool, num_blocks: int = 24, fail: str | None = None, log: list | None = None):
    caches = allocate_kv_caches(model.config, num_blocks, BLOCK, torch.float32, "cpu")
    core = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=6, long_prefill_chunk_tokens=12,
                        max_model_len_tokens=model.config.max_position_embeddings, interactive_preempt_after_s=0.0),
        BlockManager(num_blocks, BLOCK),
    )
    runner = ModelRunner(model, caches)
    log = [] if log is None else log  # ("run",), ("sink", request id), ("flush",) in the order they happen
    executor = FailingStep(runner, fail, log)
    engine = EngineLoop(core, executor, overlap=overlap)
    requests = workload()
    tokens: dict[str, list[int]] = {r.request_id: [] for r in requests}
    ends: dict[str, object] = {}
    lock = threading.Lock()
    done = threading.Semaphore(0)

    def sink_for(request_id):
        def sink(event):
            log.append(("sink", request_id))
            with lock:
                if isinstance(event, BaseException):
                    ends[request_id] = event
                else:
                    tokens[request_id].extend(event.new_token_ids)
                    if event.finished:
                        ends[request_id] = event.finish_reason
            if isinstance(event, BaseException) or event.finished:
                done.release()
        return sink

    engine.start()
    try:
        flush = lambda: log.append(("flush",))  # noqa: E731 - one for every request, as a multiplexed call's
        for r in requests:
            engine.submit(r, sink_for(r.request_id), flush)
        for _ in requests:
            assert done.acquire(timeout=60), "a request never ended"
    finally:
        engine.stop()
    assert core.blocks.num_free_blocks == num_blocks
    assert not core.has_work()
    return tokens, ends, core.num_preemptions_total


@pytest.fixture(scope="module")
def one_at_a_time(tiny_checkpoint):
    return run(tiny_checkpoint.model, overlap=False)


def test_overlapped_steps_generate_what_one_step_at_a_time_does(tiny_checkpoint, one_at_a_time):
    tokens, ends, preemptions = run(tiny_checkpoint.model, overlap=True)
    expected_tokens, expected_ends, _ = one_at_a_time
    assert ends == expected_ends
    assert tokens == expected_tokens
    # The workload is what it is meant to be: stops, length limits, preemption.
    assert FinishReason.STOP in ends.values() and FinishReason.LENGTH in ends.values()
    assert preemptions > 0


def test_a_failed_step_fails_its_requests_and_the_rest_go_on(tiny_checkpoint, one_at_a_time):
    # r4 is admitted after the first steps, so it fails a step others share
    # and a step planned behind it has placeholders nobody can fill.
    tokens, ends, _ = run(tiny_checkpoint.model, overlap=True, fail="r4")
    expected_tokens, expected_ends, _ = one_at_a_time
    failed = {request_id for request_id, end in ends.items() if isinstance(end, BaseException)}
    assert "r4" in failed
    for request_id, end in ends.items():
        if request_id in failed:
            assert isinstance(end, RuntimeError)
        else:  # untouched by the failure: as without it
            assert end == expected_ends[request_id]
            assert tokens[request_id] == expected_tokens[request_id]


@pytest.mark.parametrize("overlap", [False, True])
def test_each_steps_outputs_are_flushed_once_and_one_at_a_time_just_before_the_next_step(tiny_checkpoint, overlap):
    log: list = []
    run(tiny_checkpoint.model, overlap=overlap, log=log)
    assert log[-1] == ("flush",)  # nothing sunk is left unflushed
    assert all(a != b for a, b in zip(log, log[1:]) if a == ("flush",))  # never twice in a row
    sinks_since_flush = 0
    for previous, event in zip([("start",), *log], log):
        if event == ("flush",):
            assert sinks_since_flush > 0  # a flush only follows outputs
            sinks_since_flush = 0
        elif event[0] == "sink":
            sinks_since_flush += 1
        elif not overlap:  # ("run",), one step at a time: the outputs before it went out right before it ran
            assert sinks_since_flush == 0 and previous != ("sink",)
