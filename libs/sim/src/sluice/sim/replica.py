"""One simulated replica: the engine's own IterationScheduler and
BlockManager, with the cost model's step time in place of a model forward.

    add(request, now)          as the replica's engine loop adds a request
    start_step(now) -> s | None  schedule() one step; its cost-model duration
    finish_step(now) -> outputs  update() with one sampled token per sampling chunk
    yield_at(now) -> s | None    where the step under way gives way to a chat
                                 arriving now, marked to be given up there
                                 (SchedulerConfig.yield_to_chats)
    abandon_step(now)            give it up there
    view(now)                  the ReplicaView its state report would give

The step loop is the replica's (services/replica engine_loop): a step runs
while there is work, requests added meanwhile join at the next step, and a
step that plans nothing (waiting work without blocks) is retried a little
later. A step whose plan yields to chats is given up at the first check
after a chat arrives: the replica checks before each layer and before the
LM head, here `step_segments` equal parts of the step's time (a model's
layers + 1; 0 = yielding not modelled). Sampled tokens are one fixed id: requests run with `ignore_eos` to
exactly their output length, as a trace replay does.
"""

import math
from collections.abc import Callable

from sluice.engine.block_manager import BlockManager
from sluice.engine.plan import RequestOutput, StepPlan
from sluice.engine.request import EngineRequest
from sluice.engine.scheduler import IterationScheduler
from sluice.engine.scheduler_config import SchedulerConfig
from sluice.placement.replica_choice import ReplicaView

from sluice.sim.cost_model import StepShape

# What the replica's engine loop waits before planning again when a step
# planned nothing (services/replica engine_loop: 10 ms).
EMPTY_STEP_RETRY_S = 0.01
# The replica's moving average of step time (engine_loop STEP_TIME_EWMA_WEIGHT).
STEP_TIME_EWMA_WEIGHT = 0.1
SAMPLED_TOKEN_ID = 7


class SimReplica:
    """Only the simulation loop calls it, on its virtual clock."""

    def __init__(
        self, index: int, replica_id: str, model_version: str, num_kv_blocks: int, block_size_tokens: int,
        engine: SchedulerConfig, step_time_s: Callable[[StepShape], float], step_segments: int = 0,
    ) -> None:
        self.index = index  # in the fleet
        self.replica_id = replica_id
        self.model_version = model_version
        self.core = IterationScheduler(engine, BlockManager(num_kv_blocks, block_size_tokens))
        self._step_time_s = step_time_s
        self.plan: StepPlan | None = None  # the step under way
        self.step_started_s = 0.0
        self.busy_until_s: float | None = None
        self.step_segments = step_segments
        self.yield_pending = False  # the step under way is to be given up
        self._step_tokens = (0, 0)  # the step under way's decode and prefill tokens
        self.yielded_steps = 0
        self.step_time_ewma_s = 0.0
        self.steps_total = 0
        self.decode_tokens_total = 0
        self.prefill_tokens_total = 0
        self.busy_s = 0.0

    def add(self, request: EngineRequest, now_s: float) -> None:
        self.core.add(request, now_s)

    def cancel(self, request_id: str) -> None:
        self.core.cancel(request_id)

    @property
    def idle(self) -> bool:
        return self.plan is None

    def start_step(self, now_s: float) -> float | None:
        """Plan a step if there is work: seconds until it ends (the retry
        delay if it planned nothing), or None when there is no work."""
        if not self.core.has_work():
            return None
        plan = self.core.schedule(now_s)
        self.plan = plan
        if plan.is_empty:
            return EMPTY_STEP_RETRY_S
        chunks = tuple([(len(chunk.token_ids), chunk.start_position) for chunk in plan.chunks])
        duration_s = self._step_time_s(StepShape(chunks))
        tokens = 0
        decode = 0
        for n, _ in chunks:
            tokens += n
            decode += n == 1
        self._step_tokens = (decode, tokens - decode)
        self.step_started_s, self.busy_until_s = now_s, now_s + duration_s
        return duration_s

    def yield_at(self, now_s: float) -> float | None:
        """Where the step under way is given up for a chat added at `now_s`
        (the next check between layers; the step is then to be given up
        there), or None: its plan does not yield, it is already to be given
        up, or no check is left before its end."""
        plan = self.plan
        if plan is None or not plan.yields_to_chats or self.yield_pending or self.step_segments < 2:
            return None
        segment_s = (self.busy_until_s - self.step_started_s) / self.step_segments
        # Checks at the start of each segment; the one at the step's start has passed.
        k = max(1, math.ceil((now_s - self.step_started_s) / segment_s))
        if k >= self.step_segments:
            return None
        self.yield_pending = True
        return self.step_started_s + k * segment_s

    def abandon_step(self, now_s: float) -> None:
        """Give the step under way up at `now_s` (its work is planned again)."""
        plan, self.plan = self.plan, None
        self.core.abandon(plan)
        self.busy_s += now_s - self.step_started_s
        self.busy_until_s, self.yield_pending = None, False
        self.yielded_steps += 1

    def finish_step(self) -> list[RequestOutput]:
        plan, self.plan = self.plan, None
        if plan is not None and not plan.is_empty:
            decode, prefill = self._step_tokens
            duration_s = self.busy_until_s - self.step_started_s
            self.decode_tokens_total += decode
            self.prefill_tokens_total += prefill
            self.steps_total += 1
            self.busy_s += duration_s
            self.step_time_ewma_s += STEP_TIME_EWMA_WEIGHT * (duration_s - self.step_time_ewma_s)
        self.busy_until_s = None
        if plan is None or plan.is_empty:
            self.core.blocks.drain_cache_events()
            return []
        sampled = {chunk.request_id: SAMPLED_TOKEN_ID for chunk in plan.chunks if chunk.samples}
        outputs = self.core.update(plan, sampled)
        # Nobody subscribes to the cache log here (placement gets no prefix
        # hashes from the simulator yet): drain it so it does not grow.
        self.core.blocks.drain_cache_events()
        return outputs

    def view(self, now_s: float, kv_blocks_reported: int | None = None) -> ReplicaView:
        """The state report. `kv_blocks_reported` overrides the KV the
        scheduler is told of (the no-KV-admission baseline inflates it)."""
        blocks = self.core.blocks
        total = blocks.num_blocks if kv_blocks_reported is None else kv_blocks_reported
        return ReplicaView(
            replica_id=self.replica_id, address=self.replica_id, model_version=self.model_version,
            total_kv_blocks=total, free_kv_blocks=blocks.num_free_blocks + (total - blocks.num_blocks),
            block_size_tokens=blocks.block_size_tokens, num_running=self.core.num_running,
            num_waiting=self.core.num_waiting, ready=True, seen_at_s=now_s,
            max_num_seqs=self.core.config.max_num_seqs, step_time_s=self.step_time_ewma_s,
        )

    @property
    def kv_occupancy(self) -> float:
        blocks = self.core.blocks
        return blocks.num_used_blocks / blocks.num_blocks
