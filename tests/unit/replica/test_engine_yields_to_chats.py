"""A step given up part-way for an arriving chat, on the tiny checkpoint.

The runner stops between layers and leaves no trace a redo can see (same
logits, same seeded sample); the engine loop gives up a yielding step when
a chat is submitted during it, runs the chat, and every request's tokens
are those of a run that never yielded."""

from __future__ import annotations

import threading

import pytest
import torch

from sluice.engine.block_manager import BlockManager
from sluice.engine.request import EngineRequest, ServiceClass, StopPolicy
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig
from sluice.model import ModelRunner, allocate_kv_caches
from sluice.model.runner import ModelInput, SequenceInput
from sluice.model.sampler import SampleRequest, SamplingParams
from sluice.model.yielding import StepYielded
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.engine_metrics import EngineMetrics
from sluice.replica.executor import StepExecutor

BLOCK = 16


def asks_then_yields(after_calls: int):
    """A should_yield that says no `after_calls` times, then yes."""
    calls = []

    def should_yield() -> bool:
        calls.append(1)
        return len(calls) > after_calls
    return should_yield, calls


@pytest.mark.parametrize("after_calls", [0, 1, 2])  # before layer 0, before layer 1, before the LM head
def test_a_redo_after_yielding_matches_a_step_never_given_up(tiny_checkpoint, after_calls):
    model = tiny_checkpoint.model
    assert model.config.num_hidden_layers == 2

    def batch(seed: int) -> ModelInput:
        params = SamplingParams(temperature=1.0, seed=seed, max_tokens=4)
        prompt = tuple(range(3, 40))
        return ModelInput((
            SequenceInput(prompt, 0, (0, 1, 2), SampleRequest(params, 0, params.make_generator("cpu"))),
            SequenceInput((9, 10, 11, 12), 0, (3,), SampleRequest(params, 0, params.make_generator("cpu"))),
        ), return_logits=True)

    plain = ModelRunner(model, allocate_kv_caches(model.config, 8, BLOCK, torch.float32, "cpu"))
    expected = plain.execute(batch(seed=5))

    runner = ModelRunner(model, allocate_kv_caches(model.config, 8, BLOCK, torch.float32, "cpu"))
    step = batch(seed=5)
    should_yield, calls = asks_then_yields(after_calls)
    with pytest.raises(StepYielded):
        runner.execute(step, should_yield)
    assert len(calls) == after_calls + 1
    redone = runner.execute(step)  # the same generators: a yield drew nothing from them
    assert redone.sampled_token_ids == expected.sampled_token_ids
    torch.testing.assert_close(redone.logits, expected.logits, atol=1e-5, rtol=1e-5)


def engine_request(request_id: str, prompt: tuple[int, ...], max_tokens: int,
                   service_class: ServiceClass = ServiceClass.INTERACTIVE) -> EngineRequest:
    return EngineRequest(
        request_id=request_id, prompt_token_ids=prompt, service_class=service_class,
        stop=StopPolicy(max_output_tokens=max_tokens, ignore_eos=True),
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
    )


class ChatDuringStep(StepExecutor):
    """Submits `chat` to the engine from inside its second step (the batch
    prompt's second chunk), as a caller on another thread would while it
    runs."""

    def __init__(self, runner: ModelRunner, chat: EngineRequest, sink) -> None:
        super().__init__(runner)
        self.engine: EngineLoop | None = None
        self._chat, self._sink = chat, sink
        self.steps = self.yielding_steps = 0

    def run_prepared(self, prepared, previous=None, should_yield=None):
        self.steps += 1
        self.yielding_steps += should_yield is not None
        if self.steps == 2:
            self.engine.submit(self._chat, self._sink)
        return super().run_prepared(prepared, previous, should_yield)


def run_engine(model, yield_to_chats: bool, overlap: bool = False) -> tuple[dict[str, list[int]], EngineLoop, ChatDuringStep]:
    num_blocks = 64
    caches = allocate_kv_caches(model.config, num_blocks, BLOCK, torch.float32, "cpu")
    core = IterationScheduler(
        SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=8, long_prefill_chunk_tokens=0,
                        batch_prefill_tokens_beside_interactive=0,
                        max_model_len_tokens=model.config.max_position_embeddings, yield_to_chats=yield_to_chats),
        BlockManager(num_blocks, BLOCK),
    )
    outputs: dict[str, list[int]] = {"job": [], "chat": []}
    done = threading.Semaphore(0)

    def sink_for(request_id):
        def sink(event):
            outputs[request_id].extend(event.new_token_ids)
            if event.finished:
                done.release()
        return sink

    executor = ChatDuringStep(ModelRunner(model, caches), engine_request("chat", (5, 6, 7, 8), 3), sink_for("chat"))
    engine = EngineLoop(core, executor, metrics=EngineMetrics("tiny@1", "r0"), overlap=overlap)
    executor.engine = engine
    engine.start()
    try:
        # A 60-token batch prompt: four 16-token prefill steps, each one that may yield.
        engine.submit(engine_request("job", tuple(range(40, 100)), 5, ServiceClass.BATCH), sink_for("job"))
        for _ in range(2):
            assert done.acquire(timeout=20)
    finally:
        engine.stop()
    assert core.blocks.num_free_blocks == num_blocks
    return outputs, engine, executor


@pytest.mark.parametrize("overlap", [False, True], ids=["one-step-at-a-time", "overlap"])
def test_the_engine_gives_a_batch_step_up_for_a_chat_and_loses_nothing(tiny_checkpoint, overlap):
    # With overlap, nothing is planned past a step that may yield, and no
    # command is taken while it runs: the chat still makes it give way.
    model = tiny_checkpoint.model
    outputs, engine, executor = run_engine(model, yield_to_chats=True, overlap=overlap)
    registry = engine.metrics
    assert executor.yielding_steps >= 1
    yielded = next(s for m in registry.collect() if m.name == "sluice_engine_steps_yielded"
                   for s in m.samples if s.name.endswith("_total"))
    assert yielded.value == 1  # the chat came once; later yielding steps ran to their end

    # Greedy: the same tokens as a run that never gives a step up (where the
    # chat, submitted at the same point, waits the step out).
    reference, _, reference_executor = run_engine(model, yield_to_chats=False)
    assert reference_executor.yielding_steps == 0
    assert outputs == reference
    assert len(outputs["job"]) == 5 and len(outputs["chat"]) == 3
