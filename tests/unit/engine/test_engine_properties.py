"""Property tests of the pure engine core under random traffic.

Hypothesis draws arrivals (tenants, classes, prompts that share prefixes),
pool sizes small enough to force preemption, token budgets small enough to
force chunking, chunk caps (long prompts one chunk a step, smaller beside
other tenants' chats), how long an interactive sequence waits before it preempts
batch ones (steps are one second apart), cancels (between steps and while a step runs) and stop
tokens. A fake model stands in for the runner: it remembers which token was
written into every KV slot and, before it "samples", checks that the slots a
sequence attends over hold exactly that sequence's tokens, so a wrong prefix
hit, a block reused while still shared or a lost recompute shows up as wrong
K/V, not only as wrong bookkeeping. It samples a deterministic function of
(request id, position), so every request's outputs are known in advance and
must not depend on chunking, batching, preemption or prefix hits.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sluice.engine.block_manager import BlockManager
from sluice.engine.plan import RequestOutput, StepPlan
from sluice.engine.request import EngineRequest, FinishReason, ServiceClass, StopPolicy
from sluice.engine.scheduler import IterationScheduler, SchedulerConfig

VOCAB = 24
EOS = 0  # ~1 in 24 sampled tokens ends a request that does not ignore EOS
MAX_STEPS = 3_000  # liveness bound: every scenario below finishes far sooner


def fake_token(request_id: str, index: int) -> int:
    """The token a request gets at sequence index `index`, whatever happens."""
    digest = hashlib.blake2b(f"{request_id}:{index}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") % VOCAB


@dataclass(frozen=True)
class Arrival:
    step: int
    request: EngineRequest
    cancel_at_step: int | None  # None: runs to its end
    cancel_mid_step: bool       # cancel between schedule() and update()


@dataclass(frozen=True)
class Scenario:
    num_blocks: int
    block_size: int
    budget_tokens: int
    max_seqs: int
    max_model_len: int
    arrivals: tuple[Arrival, ...]
    interactive_preempt_after_s: float | None = None
    # Step composition: chunk caps (0 = none), the long-prompt threshold, the
    # smaller cap beside other tenants' chats and the window that keeps them live.
    long_prefill_chunk_tokens: int = 256
    long_prefill_threshold_tokens: int = 512
    long_prefill_chunk_tokens_beside_chats: int = 0
    interactive_recent_s: float = 1.0


def expected_outputs(request: EngineRequest, max_model_len: int) -> tuple[list[int], FinishReason]:
    tokens = list(request.prompt_token_ids)
    outputs: list[int] = []
    while True:
        token = fake_token(request.request_id, len(tokens))
        tokens.append(token)
        outputs.append(token)
        reason = request.stop.finish_reason(token, len(outputs))
        if reason is None and len(tokens) >= max_model_len:
            reason = FinishReason.LENGTH
        if reason is not None:
            return outputs, reason


@st.composite
def scenarios(draw) -> Scenario:
    block_size = draw(st.sampled_from([1, 2, 4, 8]))
    token = st.integers(1, VOCAB - 1)
    shared_prefixes = [draw(st.lists(token, max_size=5 * block_size)) for _ in range(3)]
    arrivals = []
    for i in range(draw(st.integers(1, 10))):
        prefix = draw(st.sampled_from([[], *shared_prefixes]))
        suffix = draw(st.lists(token, min_size=0 if prefix else 1, max_size=3 * block_size))
        cancel_at = draw(st.none() | st.none() | st.integers(0, 30))
        request = EngineRequest(
            request_id=f"r{i}",
            prompt_token_ids=tuple(prefix + suffix),
            stop=StopPolicy(max_output_tokens=draw(st.integers(1, 8)), eos_token_ids=frozenset({EOS}),
                            ignore_eos=draw(st.booleans())),
            service_class=draw(st.sampled_from(list(ServiceClass))),
            fairness_key=draw(st.sampled_from("ABC")),
        )
        arrivals.append(Arrival(draw(st.integers(0, 15)), request, cancel_at, draw(st.booleans())))
    return Scenario(
        num_blocks=draw(st.integers(2, 40)),
        block_size=block_size,
        budget_tokens=draw(st.integers(1, 24)),
        max_seqs=draw(st.integers(1, 6)),
        max_model_len=draw(st.sampled_from([4096, 24])),
        arrivals=tuple(arrivals),
        interactive_preempt_after_s=draw(st.sampled_from([None, 0.0, 0.25, 3.0])),
        long_prefill_chunk_tokens=draw(st.sampled_from([0, 3, 8, 256])),
        long_prefill_threshold_tokens=draw(st.sampled_from([0, 6, 512])),
        long_prefill_chunk_tokens_beside_chats=draw(st.sampled_from([0, 1, 2])),
        interactive_recent_s=draw(st.sampled_from([0.0, 1.5, 5.0])),
    )


class FakeModel:
    """Remembers the token in every KV slot; checks what each sampled
    sequence would attend over."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.slots: dict[int, int] = {}

    def slot(self, table: tuple[int, ...], position: int) -> int:
        return table[position // self.block_size] * self.block_size + position % self.block_size

    def run(self, plan: StepPlan, blocks: BlockManager, tokens_of: dict[str, list[int]]) -> dict[str, int]:
        state = blocks.state()
        written: set[int] = set()
        for chunk in plan.chunks:
            for offset, token in enumerate(chunk.token_ids):
                position = chunk.start_position + offset
                block = chunk.block_table[position // self.block_size]
                assert block not in state.cached_block_ids, "a cached (shared) block is written"
                assert state.ref_counts[block] == 1, "a block is written while another table holds it"
                slot = self.slot(chunk.block_table, position)
                assert slot not in written, "two chunks of one step write the same slot"
                written.add(slot)
                self.slots[slot] = token
        sampled = {}
        for chunk in plan.chunks:
            if chunk.samples:
                end = chunk.start_position + len(chunk.token_ids)
                context = [self.slots.get(self.slot(chunk.block_table, p)) for p in range(end)]
                assert context == tokens_of[chunk.request_id], f"{chunk.request_id} attends over wrong K/V"
                sampled[chunk.request_id] = fake_token(chunk.request_id, end)
        return sampled


def check_pool(blocks: BlockManager) -> None:
    state = blocks.state()
    holders = Counter(b for table in state.tables.values() for b in table)
    for table in state.tables.values():
        assert len(set(table)) == len(table), "a table holds a block twice"
    for block, ref_count in enumerate(state.ref_counts):
        assert ref_count == holders[block], f"block {block}: ref count {ref_count}, in {holders[block]} tables"
        if ref_count > 1:
            assert block in state.cached_block_ids, "shared block that is not a cached prefix block"
            # Chained hashes: a shared block sits at the same index everywhere.
            assert len({t.index(block) for t in state.tables.values() if block in t}) == 1
    free_uncached, free_cached = set(state.free_uncached), set(state.free_cached_lru)
    assert len(free_uncached) == len(state.free_uncached) and len(free_cached) == len(state.free_cached_lru)
    assert not free_uncached & free_cached
    assert free_uncached | free_cached == {b for b, r in enumerate(state.ref_counts) if r == 0}
    assert free_cached <= state.cached_block_ids and not free_uncached & state.cached_block_ids
    assert blocks.num_free_blocks + blocks.num_used_blocks == blocks.num_blocks
    assert blocks.num_used_blocks == len(holders)


@dataclass
class Run:
    outputs: dict[str, list[RequestOutput]]
    cancelled: set[str]
    refused: set[str]
    preemptions: int
    prefix_hit_tokens: int


class Driver:
    """Runs one scenario step by step, mirroring what it can see from plans
    and outputs (which requests run, how far each is computed) and checking
    the core against that mirror."""

    def __init__(self, s: Scenario) -> None:
        self.s = s
        self.blocks = BlockManager(s.num_blocks, s.block_size)
        self.scheduler = IterationScheduler(
            SchedulerConfig(max_num_batched_tokens=s.budget_tokens, max_num_seqs=s.max_seqs,
                            max_model_len_tokens=s.max_model_len,
                            interactive_preempt_after_s=s.interactive_preempt_after_s,
                            long_prefill_chunk_tokens=s.long_prefill_chunk_tokens,
                            long_prefill_threshold_tokens=s.long_prefill_threshold_tokens,
                            long_prefill_chunk_tokens_beside_chats=s.long_prefill_chunk_tokens_beside_chats,
                            interactive_recent_s=s.interactive_recent_s),
            self.blocks,
        )
        self.model = FakeModel(s.block_size)
        self.arrivals = sorted(s.arrivals, key=lambda a: a.step)  # add() order = arrival order
        self.rank = {a.request.request_id: (a.request.service_class, i) for i, a in enumerate(self.arrivals)}
        self.tokens_of = {a.request.request_id: list(a.request.prompt_token_ids) for a in s.arrivals}
        self.outputs: dict[str, list[RequestOutput]] = {rid: [] for rid in self.tokens_of}
        self.running: dict[str, int] = {}  # request id -> computed tokens
        self.cancelled: set[str] = set()
        self.refused: set[str] = set()
        self.batch_skipped_last_step = False

    def run(self) -> Run:
        last_arrival = self.arrivals[-1].step
        for step in range(MAX_STEPS):
            self.arrive_and_cancel(step)
            if step > last_arrival and not self.scheduler.has_work():
                break
            self.step(step)
        else:
            raise AssertionError(f"no progress: still working after {MAX_STEPS} steps")
        # Idle: everything is free, nothing is owned.
        state = self.blocks.state()
        assert not state.tables and set(state.ref_counts) == {0}
        assert self.blocks.num_free_blocks == self.blocks.num_blocks
        assert self.scheduler.num_running == self.scheduler.num_waiting == 0
        return Run(self.outputs, self.cancelled, self.refused, self.scheduler.num_preemptions_total,
                   self.blocks.prefix_cache_hit_tokens_total)

    def arrive_and_cancel(self, step: int) -> None:
        for a in self.arrivals:
            r = a.request
            if a.step == step:
                total = min(len(r.prompt_token_ids) + r.stop.max_output_tokens, self.s.max_model_len)
                never_fits = self.blocks.blocks_for(total) > self.s.num_blocks
                try:
                    self.scheduler.add(r, float(step))
                    assert not never_fits
                except ValueError:
                    assert never_fits
                    self.refused.add(r.request_id)
            if a.cancel_at_step == step and not a.cancel_mid_step:
                self.cancel(r.request_id)

    def cancel(self, request_id: str) -> None:
        if self.scheduler.cancel(request_id):
            self.cancelled.add(request_id)
            self.running.pop(request_id, None)

    def step(self, step: int) -> None:
        decoding = {rid for rid, computed in self.running.items() if computed == len(self.tokens_of[rid]) - 1}
        plan = self.scheduler.schedule(float(step))
        check_pool(self.blocks)
        self.check_plan(plan, decoding)
        sampled = self.model.run(plan, self.blocks, self.tokens_of)
        for a in self.arrivals:
            if a.cancel_at_step == step and a.cancel_mid_step:
                self.cancel(a.request.request_id)  # while the step "runs"
        step_outputs = self.scheduler.update(plan, sampled)
        check_pool(self.blocks)
        for chunk in plan.chunks:
            if chunk.request_id not in self.cancelled:
                self.running[chunk.request_id] = chunk.start_position + len(chunk.token_ids)
        for out in step_outputs:
            assert out.request_id not in self.cancelled
            self.outputs[out.request_id].append(out)
            self.tokens_of[out.request_id].extend(out.new_token_ids)
            if out.finished:
                self.running.pop(out.request_id)

    def check_plan(self, plan: StepPlan, decoding: set[str]) -> None:
        s = self.s
        assert plan.num_tokens <= s.budget_tokens
        for rid in plan.preempted_ids:
            self.running.pop(rid)
        survivors = set(self.running) | {c.request_id for c in plan.chunks}
        for victim in plan.preempted_ids:
            assert all(self.rank[other] < self.rank[victim] for other in survivors), "preempted a more important one"
        kinds = [c.request_id in decoding for c in plan.chunks]
        assert kinds == sorted(kinds, reverse=True), "a prefill chunk is ahead of a decode"
        scheduled = {c.request_id for c in plan.chunks}
        skipped = decoding - set(plan.preempted_ids) - scheduled
        if sum(kinds) < s.budget_tokens:
            # Only batch decodes, and only in a step that gives a newly
            # admitted interactive prompt its first chunk, never two running.
            assert all(self.rank[rid][0] is ServiceClass.BATCH for rid in skipped), "a decode was skipped"
            if skipped:
                assert not self.batch_skipped_last_step, "batch decodes skipped two steps running"
                assert any(self.rank[c.request_id][0] is ServiceClass.INTERACTIVE and c.request_id not in self.running
                           for c in plan.chunks), "batch decodes skipped without a first interactive chunk"
        self.batch_skipped_last_step = bool(skipped)
        for chunk in plan.chunks:
            rid, start, n = chunk.request_id, chunk.start_position, len(chunk.token_ids)
            assert n >= 1 and chunk.token_ids == tuple(self.tokens_of[rid][start : start + n])
            assert len(chunk.block_table) * s.block_size >= start + n
            assert chunk.block_table == self.blocks.block_table(rid).block_ids
            assert chunk.samples == (start + n == len(self.tokens_of[rid]))
            if rid in self.running:
                assert start == self.running[rid]
            else:  # admitted now: from scratch or from a cached prefix of full blocks
                assert start % s.block_size == 0 and start < len(self.tokens_of[rid])


def run_scenario(s: Scenario) -> Run:
    return Driver(s).run()


def check_outputs(s: Scenario, run: Run) -> None:
    for a in s.arrivals:
        rid, request = a.request.request_id, a.request
        got = [t for out in run.outputs[rid] for t in out.new_token_ids]
        want, reason = expected_outputs(request, s.max_model_len)
        if rid in run.refused:
            assert not got
            continue
        if rid in run.cancelled:
            assert got == want[: len(got)] and len(got) < len(want)
            continue
        assert got == want, f"{rid}: outputs changed"
        last = run.outputs[rid][-1]
        assert last.finish_reason is reason and last.num_output_tokens == len(want)
        assert all(not out.finished for out in run.outputs[rid][:-1])
        assert last.num_prompt_tokens == len(request.prompt_token_ids)
        assert last.num_cached_tokens % s.block_size == 0
        assert last.num_cached_tokens < len(request.prompt_token_ids)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_engine_invariants_hold_under_random_traffic(scenario: Scenario) -> None:
    check_outputs(scenario, run_scenario(scenario))


def test_the_harness_sees_preemptions_prefix_hits_and_chunking() -> None:
    """A fixed scenario, so the property above provably exercises the hard paths."""
    shared = tuple(range(1, 13))
    arrivals = tuple(
        Arrival(step=i, cancel_at_step=None, cancel_mid_step=False, request=EngineRequest(
            request_id=f"r{i}", prompt_token_ids=shared + (i + 1,) * (i + 1),
            stop=StopPolicy(max_output_tokens=8, eos_token_ids=frozenset({EOS}), ignore_eos=True),
            service_class=ServiceClass.BATCH if i % 2 else ServiceClass.INTERACTIVE, fairness_key="AB"[i % 2]))
        for i in range(6)
    )
    scenario = Scenario(num_blocks=14, block_size=4, budget_tokens=7, max_seqs=4, max_model_len=4096,
                        arrivals=arrivals)
    run = run_scenario(scenario)
    check_outputs(scenario, run)
    assert run.preemptions > 0 and run.prefix_hit_tokens > 0
    assert any(out.num_cached_tokens > 0 for outs in run.outputs.values() for out in outs)


def test_the_harness_sees_a_waiting_interactive_preempt_batch() -> None:
    """Two batch sequences take both slots and never run short of blocks; an
    interactive arrival only runs early by preempting one, and every output
    stays what it would have been."""
    def scenario(preempt_after_s: float | None) -> Scenario:
        def request(request_id: str, service_class: ServiceClass, max_output: int) -> EngineRequest:
            return EngineRequest(request_id=request_id, prompt_token_ids=tuple(range(1, 7)),
                                 stop=StopPolicy(max_output_tokens=max_output, ignore_eos=True),
                                 service_class=service_class)
        arrivals = (
            Arrival(0, request("batch-old", ServiceClass.BATCH, 8), None, False),
            Arrival(0, request("batch-new", ServiceClass.BATCH, 8), None, False),
            Arrival(3, request("chat", ServiceClass.INTERACTIVE, 3), None, False),
        )
        return Scenario(num_blocks=40, block_size=4, budget_tokens=16, max_seqs=2, max_model_len=4096,
                        arrivals=arrivals, interactive_preempt_after_s=preempt_after_s)

    waits = scenario(None)
    run = run_scenario(waits)
    check_outputs(waits, run)
    assert run.preemptions == 0
    preempts = scenario(1.0)
    run = run_scenario(preempts)
    check_outputs(preempts, run)
    assert run.preemptions == 1
