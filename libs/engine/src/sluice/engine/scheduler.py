"""The iteration scheduler: which tokens run in the next model step.

One algorithm, no phases. Every sequence catches its computed tokens up to
its length under a per-step token budget:

  1. one token for every running sequence that is decoding (protects ITL),
     interactive first;
  2. the rest of the budget goes to prefill chunks, interactive class before
     batch; within a class, running sequences part-way through their prompt
     (oldest first), then admissions from the waiting line (preempted ones
     first, then round robin across tenants). An admission starts from the
     longest cached prefix of the sequence's tokens;
  3. when a running sequence cannot get KV blocks, the least important
     running sequence (batch before interactive, newest arrival first) is
     preempted by recompute: its blocks are freed (its cached ones stay in
     the prefix cache, so re-admission usually hits them) and it waits ahead
     of new arrivals with its outputs kept;
  4. an interactive sequence at the head of the waiting line that has
     waited `interactive_preempt_after_s` and cannot get blocks or a
     sequence slot preempts running batch sequences (newest arrival first,
     as in 3, and only as many as it needs). Nothing else that waits
     preempts: batch never displaces anyone, interactive never displaces
     interactive.

Every prefill chunk is at most `long_prefill_chunk_tokens` (fewer deep into
a prompt). A long prompt (more than `long_prefill_threshold_tokens` left to
compute at admission) prefills one chunk per step, its tail included, and at
most `max_long_prefills_per_step` of them share a step. While another
tenant's chats are live (a short interactive prompt of theirs arrived
within `interactive_recent_s`), a long prompt's chunk is at most
`long_prefill_chunk_tokens_beside_chats`: the step a chat arrives during
is what it waits out before its own. A step that admits a
short interactive prompt carries no long chunk and no batch work at all,
decodes included (never two steps running): its first token waits for the
interactive decodes, not for another tenant's prompt or for batch. With
`yield_to_chats`, a plan that is mostly batch work, or mostly another
tenant's long prompt while chats are live, says so
(`StepPlan.yields_to_chats`): the runner may give it up part-way for a chat
that arrives meanwhile, and `abandon(plan)` then leaves it unapplied; the
step after a held or abandoned one never yields.

`schedule(now_s)` returns a frozen `StepPlan`; `update(plan, sampled)`
applies the runner's sampled tokens, registers newly computed full blocks in
the prefix cache, and returns per-request outputs.

A plan counts as computed the moment it is made, so the next one may be
made before it is updated (async scheduling: the replica plans step N+1
while step N runs). Tokens step N samples are then pending: step N+1
decodes them with a placeholder id the runner fills in from N's sample. A
sequence whose pending token reaches its length limit gets no more steps;
one that stops on a sampled stop token has one wasted decode in the plan
already made, which `update` ignores. Preempted while a step of its runs, a
sequence still keeps the token that step samples, so outputs are what
one-at-a-time scheduling gives. Plans are updated in the order they were
made; `unschedule` (and `abandon`) take back the newest.
"""

import itertools
import math
from collections import deque
from collections.abc import Mapping

from sluice.engine.block_manager import BlockManager, CachedPrefix, KVBlocks
from sluice.engine.plan import RequestOutput, ScheduledChunk, StepPlan
from sluice.engine.request import EngineRequest, FinishReason, ServiceClass
from sluice.engine.scheduler_config import SchedulerConfig
from sluice.engine.sequence import Sequence, SequenceStatus
from sluice.engine.step_builder import StepBuilder
from sluice.engine.waiting import WaitingQueue

__all__ = ["IterationScheduler", "SchedulerConfig"]  # the config lives in scheduler_config.py


def _rank(sequence: Sequence) -> tuple[int, int]:
    """Smaller is more important: class, then arrival."""
    return sequence.request.service_class, sequence.arrival_index


class IterationScheduler:
    def __init__(self, config: SchedulerConfig, blocks: BlockManager) -> None:
        self.config = config
        self.blocks = blocks
        self._sequences: dict[str, Sequence] = {}
        self._waiting = WaitingQueue()
        self._probes: list[Sequence] = []  # health probes not yet admitted: they skip the waiting line
        self._running: list[Sequence] = []  # in admission order
        self._arrivals = itertools.count()
        self._plan_indices = itertools.count(1)
        self._in_flight: deque[int] = deque()  # indices of plans made and not yet updated
        self.num_preemptions_total = 0
        # The previous step held long chunks and batch back for first tokens.
        self._held_for_first_tokens_last_step = False
        # The previous plan was given up part-way (`abandon`): this one runs.
        self._abandoned_last_step = False
        self._last_interactive_arrival_s = -math.inf  # on the clock `add` is given
        # Tenant -> its latest short interactive arrival (a chat), on the same
        # clock; and the tenants with one within interactive_recent_s, as of
        # the step being scheduled.
        self._chat_arrivals: dict[str, float] = {}
        self._chat_keys: frozenset[str] = frozenset()

    # -- requests in and out -------------------------------------------------

    def add(self, request: EngineRequest, now_s: float | None = None) -> None:
        """Queue `request`. `now_s`: its arrival, on the clock `schedule` is
        given (how long it has waited is measured from it); None takes
        `request.arrival_s`."""
        if request.request_id in self._sequences:
            raise ValueError(f"duplicate request id {request.request_id}")
        total = len(request.prompt_token_ids) + request.stop.max_output_tokens
        if self.blocks.blocks_for(min(total, self.config.max_model_len_tokens)) > self.blocks.num_blocks:
            raise ValueError(f"request {request.request_id} can never fit in the KV cache")
        sequence = Sequence(request, next(self._arrivals), self.blocks.block_size_tokens,
                            arrival_s=request.arrival_s if now_s is None else now_s)
        self._sequences[request.request_id] = sequence
        if request.probe:
            self._probes.append(sequence)
            return
        self._waiting.push(sequence)
        if request.service_class is ServiceClass.INTERACTIVE:
            self._last_interactive_arrival_s = max(self._last_interactive_arrival_s, sequence.arrival_s)
            # A chat: a prompt that would not be long. Recorded only where the
            # cap beside chats or yielding to chats is on: only then does a
            # step forget old ones.
            config = self.config
            if (config.long_prefill_chunk_tokens_beside_chats or config.yield_to_chats) and config.is_chat(request):
                key = request.fairness_key
                self._chat_arrivals[key] = max(self._chat_arrivals.get(key, -math.inf), sequence.arrival_s)

    def cancel(self, request_id: str) -> bool:
        """Forget the request; its blocks are freed at once. False if unknown."""
        sequence = self._sequences.pop(request_id, None)
        if sequence is None:
            return False
        self._retire(sequence, FinishReason.CANCELLED)
        return True

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting) + len(self._probes)

    def has_work(self) -> bool:
        return bool(self._running or self._waiting or self._probes)

    # -- one step ------------------------------------------------------------

    def schedule(self, now_s: float) -> StepPlan:
        # Batch's turn: the step after one that held it back, or after one
        # given up, runs to its end.
        their_turn = self._held_for_first_tokens_last_step or self._abandoned_last_step
        self._abandoned_last_step = False
        step = StepBuilder(self.config.max_num_batched_tokens)
        if self._probes:
            self._admit_probes(step)
        planned = step.chunks
        decoding = sorted(  # num_uncomputed_tokens == 1, inlined: every running sequence, every step
            (s for s in self._running
             if len(s.all_token_ids) + s.num_pending_tokens - s.num_computed_tokens == 1
             and s.request.request_id not in planned and not s.final_token_pending),
            key=_rank)
        for sequence in decoding:
            if step.budget_tokens == 0:
                break
            if sequence.status is SequenceStatus.RUNNING:  # not preempted earlier in this loop
                self._schedule_running(sequence, step)
        if not self._waiting and not step.preempted_ids and (
                len(decoding) == len(self._running)
                or len(decoding) + sum(s.final_token_pending for s in self._running) == len(self._running)):
            # Every resident sequence is decoding (or ends once its pending
            # token is known) and nobody waits: the prefill and admission
            # passes below would add nothing (the common step of a steady
            # decode; the simulator runs millions).
            self._held_for_first_tokens_last_step = False
            chunks = tuple(step.chunks.values())
            return self._plan(chunks, (), now_s, self._yields(chunks, their_turn))

        step.chunk_cap_tokens = self.config.long_prefill_chunk_tokens
        step.depth_scale_tokens = self.config.prefill_depth_scale_tokens
        step.long_slots = self.config.max_long_prefills_per_step
        held = False
        interactive_live = self._interactive_live(now_s)
        self._chat_keys = self._live_chat_keys(now_s)
        admitting = True
        for service_class in sorted(ServiceClass):
            if service_class is ServiceClass.BATCH:
                # Every interactive first chunk of this step is known now: a
                # first-token step holds batch back before any batch is admitted.
                held = self._hold_for_first_tokens(step) or held
                if step.batch_held:
                    break
            if service_class is ServiceClass.BATCH and interactive_live:
                cap = self.config.batch_prefill_tokens_beside_interactive
                if cap:  # batch comes last: what it leaves of the budget goes unused
                    step.budget_tokens = min(step.budget_tokens, cap)
                    # A chunk deep into a batch prompt costs more per token: the
                    # cap counts in tokens at the prompt's start, as the chunk cap does.
                    step.chunk_cap_tokens = min(step.chunk_cap_tokens or cap, cap)
            prefilling = sorted(
                (s for s in self._running
                 if s.request.service_class == service_class and s.request_id not in step.chunks
                 and not s.final_token_pending),
                key=_rank,
            )
            # Tenants with nothing part-way through its prompt are admitted
            # first: a quiet tenant's short prompt does not wait behind
            # another tenant's long prompts prefilling chunk by chunk.
            busy_keys = frozenset(s.request.fairness_key for s in prefilling)
            if admitting and busy_keys:
                admitting = self._admit(service_class, step, now_s, skip_keys=busy_keys)
            if service_class is ServiceClass.INTERACTIVE:
                held = self._hold_for_first_tokens(step) or held  # before the long interactive chunks
            for sequence in prefilling:
                if step.budget_tokens == 0:
                    break
                if sequence.status is SequenceStatus.RUNNING:
                    self._schedule_running(sequence, step)
            if admitting:
                admitting = self._admit(service_class, step, now_s)

        self._held_for_first_tokens_last_step = held
        chunks = tuple(step.chunks.values())
        yields = not step.batch_held and self._yields(chunks, their_turn)
        return self._plan(chunks, tuple(step.preempted_ids), now_s, yields)

    def _plan(self, chunks: tuple[ScheduledChunk, ...], preempted_ids: tuple[str, ...], now_s: float,
              yields: bool) -> StepPlan:
        """The plan of `chunks`, counted as computed from now on."""
        if not chunks:
            return StepPlan(chunks, preempted_ids, now_s, yields)
        max_model_len = self.config.max_model_len_tokens
        for chunk in chunks:
            sequence = self._sequences[chunk.request_id]
            sequence.num_computed_tokens = chunk.start_position + len(chunk.token_ids)
            if chunk.samples:
                sequence.num_pending_tokens += 1
                if (sequence.num_output_tokens >= sequence.request.stop.max_output_tokens
                        or sequence.num_tokens >= max_model_len):
                    sequence.final_token_pending = True
        index = next(self._plan_indices)
        self._in_flight.append(index)
        return StepPlan(chunks, preempted_ids, now_s, yields, index)

    def abandon(self, plan: StepPlan) -> None:
        """The runner gave `plan` up part-way (it yields to chats): nothing
        of it counts (`unschedule`), and the next `schedule` plans its work
        again. That next step (usually the chat's first-token step) and the
        one after it do not yield, so work given up again and again still
        runs at least every third step."""
        if not plan.yields_to_chats:
            raise ValueError("only a plan that yields to chats may be abandoned")
        self.unschedule(plan)
        self._abandoned_last_step = True

    def unschedule(self, plan: StepPlan) -> None:
        """Take back the newest plan, not run or given up part-way: its
        sequences are where they were before it, blocks it allocated stay
        with them, and its admissions stay admitted."""
        if plan.is_empty:
            return
        if not self._in_flight or self._in_flight[-1] != plan.index:
            raise ValueError("only the newest plan not yet updated can be taken back")
        self._in_flight.pop()
        for chunk in plan.chunks:
            sequence = self._sequences.get(chunk.request_id)
            if sequence is None or sequence.status is not SequenceStatus.RUNNING:
                continue  # cancelled meanwhile
            sequence.num_computed_tokens = chunk.start_position
            if chunk.samples:
                sequence.num_pending_tokens -= 1
                sequence.final_token_pending = False

    def update(self, plan: StepPlan, sampled: Mapping[str, int]) -> list[RequestOutput]:
        """Apply a plan the runner has run: `sampled` has a token for every
        chunk that samples."""
        if plan.is_empty:
            return []
        if not self._in_flight or self._in_flight[0] != plan.index:
            raise ValueError(f"stale plan {plan.index}: update each plan exactly once, in the order made")
        self._in_flight.popleft()
        max_model_len = self.config.max_model_len_tokens
        outputs: list[RequestOutput] = []
        for chunk in plan.chunks:
            sequence = self._sequences.get(chunk.request_id)
            if sequence is None:
                continue  # cancelled, or ended on a token the step before sampled
            if sequence.status is SequenceStatus.RUNNING:
                # The step has run, so these blocks' K/V exist: now others may hit them.
                self.blocks.cache_full_blocks(sequence.request_id, sequence.block_hashes,
                                              chunk.start_position + len(chunk.token_ids))
            if not chunk.samples:
                continue
            # Running, or preempted by a plan made while this step ran: the
            # token is sound either way (its K/V were intact until this step ended).
            token_id = sampled[chunk.request_id]
            sequence.append_output(token_id)
            reason = sequence.request.stop.finish_reason(token_id, sequence.num_known_output_tokens)
            if reason is None and len(sequence.all_token_ids) >= max_model_len:
                reason = FinishReason.LENGTH
            if reason is not None:
                del self._sequences[sequence.request_id]
                self._retire(sequence, reason)
            outputs.append(self._output(sequence, (token_id,)))
        return outputs

    # -- internals -----------------------------------------------------------

    def _admit_probes(self, step: StepBuilder) -> None:
        """Health probes first: a slot past max_num_seqs, blocks taken from
        the newest running sequence if none are free (it recomputes)."""
        for sequence in list(self._probes):
            if sequence.num_pending_tokens:
                continue  # preempted while a step of its runs: back once that step is updated
            kv = self.blocks.allocate(sequence.request_id, sequence.num_tokens)
            if kv is None:
                victims = [s for s in self._running if not s.request.probe]
                if victims:
                    self._preempt(max(victims, key=lambda s: s.arrival_index), step)
                    kv = self.blocks.allocate(sequence.request_id, sequence.num_tokens)
            if kv is None:
                continue  # every block is a probe's: the next step
            self._probes.remove(sequence)
            sequence.status = SequenceStatus.RUNNING
            sequence.num_computed_tokens = 0
            self._running.append(sequence)
            step.admitted_ids.add(sequence.request_id)
            step.add(self._chunk(sequence, sequence.num_tokens, kv))

    def _yields(self, chunks: tuple[ScheduledChunk, ...], their_turn: bool) -> bool:
        """Whether a step of `chunks` may give way to an arriving chat. Never
        the step right after one that held work back for first tokens or was
        given up (`their_turn`, see `schedule`); otherwise when the step is
        mostly work a chat need not wait for:

        - batch: more batch sequences than interactive ones. The interactive
          sequences in a step given up get their token from the chat's
          first-token step, which holds batch back: sooner where batch was
          most of the step, later by the part given up where it was not.
        - a long prompt, while chats of a tenant other than its own are
          live (`_others_chatting`): its chunk holds more tokens than the rest of
          the step together. A step that is mostly other sequences' decodes
          (many chats beside near-context prompts) runs on: giving it up
          costs each of them the part done, and the chats then wait for that
          CPU."""
        if not self.config.yield_to_chats or their_turn or not chunks:
            return False
        batch = step_tokens = 0
        largest = chunks[0]  # only the largest chunk can hold more than the rest
        for chunk in chunks:
            batch += self._sequences[chunk.request_id].request.service_class is ServiceClass.BATCH
            step_tokens += len(chunk.token_ids)
            if len(chunk.token_ids) > len(largest.token_ids):
                largest = chunk
        if batch > len(chunks) - batch:
            return True
        tokens = len(largest.token_ids)
        sequence = self._sequences[largest.request_id]
        return tokens > step_tokens - tokens and sequence.is_long_prefilling and self._others_chatting(sequence)

    def _interactive_live(self, now_s: float) -> bool:
        """Interactive work is resident or waiting, or arrived within
        `interactive_recent_s`: batch steps are kept short."""
        return (now_s - self._last_interactive_arrival_s < self.config.interactive_recent_s
                or self._waiting.has_class(ServiceClass.INTERACTIVE)
                or any(s.request.service_class is ServiceClass.INTERACTIVE and not s.request.probe
                       for s in self._running))

    def _live_chat_keys(self, now_s: float) -> frozenset[str]:
        """Tenants whose latest chat arrived within `interactive_recent_s`
        (older arrivals forgotten, so the map stays as small as the tenants
        chatting now)."""
        if not self._chat_arrivals:
            return frozenset()
        horizon_s = now_s - self.config.interactive_recent_s
        for key in [k for k, arrival_s in self._chat_arrivals.items() if arrival_s <= horizon_s]:
            del self._chat_arrivals[key]
        return frozenset(self._chat_arrivals)

    def _long_cap(self, sequence: Sequence, long: bool) -> int:
        """The smaller chunk cap of a long prefill while another tenant's
        chats are live; 0 = the step's own cap."""
        if not long or not self._others_chatting(sequence):
            return 0
        return self.config.long_prefill_chunk_tokens_beside_chats

    def _others_chatting(self, sequence: Sequence) -> bool:
        """Chats of a tenant other than `sequence`'s are live (as of this
        plan): when only its own tenant chats, the trade-off is its own."""
        keys = self._chat_keys
        return bool(keys) and not (len(keys) == 1 and sequence.request.fairness_key in keys)

    def _hold_for_first_tokens(self, step: StepBuilder) -> bool:
        """Short interactive prompts admitted so far get their first token
        from this step: it then carries no long chunk (of either class) and
        no batch work at all (batch has no latency target; it loses a step),
        so its length is theirs and the interactive decodes'. Never two
        steps running, so long prompts and batch still advance. True if
        this step held anything back."""
        if not step.first_chunks or self._held_for_first_tokens_last_step or step.batch_held:
            return False
        step.long_slots = 0
        step.batch_held = True
        held = False
        for sequence in self._running:
            if sequence.request.service_class is ServiceClass.BATCH:
                held = True
                step.drop(sequence.request_id)  # its KV for the token stays allocated: next step uses it
            elif sequence.is_long_prefilling and sequence.request_id not in step.chunks:
                held = True
        return held or self._waiting.has_class(ServiceClass.BATCH)

    def _schedule_running(self, sequence: Sequence, step: StepBuilder) -> None:
        """Schedule the next chunk of a running sequence, preempting the least
        important running sequence until its blocks fit (or it is that one)."""
        while True:
            long = sequence.is_long_prefilling
            take = step.take(sequence.num_uncomputed_tokens, long, sequence.num_computed_tokens,
                             self._long_cap(sequence, long))
            if take == 0:
                return  # a long prefill past this step's quota: next step
            kv = self.blocks.allocate(sequence.request_id, sequence.num_computed_tokens + take)
            if kv is not None:
                step.claim(long)
                step.add(self._chunk(sequence, take, kv))
                return
            victim = max(self._running, key=_rank)
            self._preempt(victim, step)
            if victim is sequence:
                return

    def _admit(
        self, service_class: ServiceClass, step: StepBuilder, now_s: float,
        skip_keys: frozenset[str] = frozenset(),
    ) -> bool:
        """Admit waiting sequences of `service_class` (of tenants not in
        `skip_keys`) while budget, sequence slots and blocks last. False when
        the head of the line is stuck on blocks or slots: nobody behind it
        (of any class) may go first."""
        while step.budget_tokens > 0:
            sequence = self._waiting.peek(skip_keys)
            if sequence is None or sequence.request.service_class != service_class:
                return True
            if sequence.request_id in step.preempted_ids or sequence.num_pending_tokens:
                # It just lost its blocks to make room this step, or lost them
                # while a step of its runs: it waits for that step's token.
                return False
            prefix = self.blocks.lookup_prefix(sequence.block_hashes, sequence.num_tokens)
            # Transferred K/V past the cache hit goes into the fresh blocks
            # allocated after the hit's: both count as computed.
            start = max(prefix.num_tokens, sequence.num_external_tokens)
            uncomputed = sequence.num_tokens - start
            long = self.config.is_long_prefill(uncomputed)
            take = step.take(uncomputed, long, start, self._long_cap(sequence, long))
            if take == 0:
                return False  # a long prompt, and this step's long chunks are taken: it keeps its place
            num_tokens = start + take
            kv = None
            if len(self._running) < self.config.max_num_seqs:
                kv = self.blocks.allocate(sequence.request_id, num_tokens, prefix)
            if kv is None and self._may_preempt_batch(sequence, now_s):
                kv = self._preempt_batch_for(sequence, num_tokens, prefix, step)
            if kv is None:
                return False
            self._waiting.pop(sequence)
            sequence.status = SequenceStatus.RUNNING
            sequence.num_computed_tokens = start
            sequence.long_prefill = long
            if sequence.num_preemptions == 0:
                sequence.num_cached_tokens = prefix.num_tokens
            self._running.append(sequence)
            step.admitted_ids.add(sequence.request_id)
            step.claim(long)
            if not long and service_class is ServiceClass.INTERACTIVE:
                step.first_chunks += 1
            step.add(self._chunk(sequence, take, kv))
        return True

    def _may_preempt_batch(self, sequence: Sequence, now_s: float) -> bool:
        after_s = self.config.interactive_preempt_after_s
        return (after_s is not None and sequence.request.service_class is ServiceClass.INTERACTIVE
                and now_s - sequence.arrival_s >= after_s)

    def _preempt_batch_for(self, sequence: Sequence, num_tokens: int, prefix: CachedPrefix,
                           step: StepBuilder) -> KVBlocks | None:
        """Preempt the fewest running batch sequences, newest arrival first,
        after which `sequence` has a slot and blocks for `num_tokens`, and
        allocate them. None, preempting nobody, if all of them would not do."""
        victims = sorted((s for s in self._running if s.request.service_class is ServiceClass.BATCH),
                         key=lambda s: s.arrival_index, reverse=True)

        def fits(count: int) -> bool:
            return (len(self._running) - count < self.config.max_num_seqs
                    and self.blocks.can_allocate(sequence.request_id, num_tokens, prefix,
                                                 after_freeing=[v.request_id for v in victims[:count]]))

        if not victims or not fits(len(victims)):
            return None
        # Fitting only gets easier with more victims: the first count that fits.
        count = next(c for c in range(1, len(victims) + 1) if fits(c))
        for victim in victims[:count]:
            self._preempt(victim, step)
        return self.blocks.allocate(sequence.request_id, num_tokens, prefix)

    def _chunk(self, sequence: Sequence, take: int, kv: KVBlocks) -> ScheduledChunk:
        start = sequence.num_computed_tokens
        stop = start + take
        return ScheduledChunk(
            request_id=sequence.request_id,
            token_ids=sequence.token_ids(start, stop),
            start_position=start,
            block_table=kv.block_ids,
            samples=stop == sequence.num_tokens,
            num_output_tokens=sequence.num_output_tokens,  # pending ones too: this sample follows them
            sampling=sequence.request.sampling,
        )

    def _preempt(self, sequence: Sequence, step: StepBuilder) -> None:
        """Free the sequence's blocks and put it back in the waiting line,
        ahead of new arrivals. One admitted earlier in this same step (a
        quiet tenant's prompt goes before a running prefill's next chunk)
        has not run: it returns to the line as if never admitted, and is
        no preemption."""
        self.blocks.free(sequence.request_id)
        self._running.remove(sequence)
        sequence.status = SequenceStatus.WAITING
        sequence.num_computed_tokens = 0
        # Even one admitted this step and never run: the engine cannot tell
        # whether the source still holds the K/V, so it recomputes it all.
        sequence.num_external_tokens = 0
        if sequence.request.probe:
            self._probes.append(sequence)
        else:
            self._waiting.push_resumed(sequence)
        step.drop(sequence.request_id)
        if sequence.request_id in step.admitted_ids:
            step.admitted_ids.discard(sequence.request_id)
            return
        sequence.num_preemptions += 1
        self.num_preemptions_total += 1
        step.preempted_ids.append(sequence.request_id)

    def _retire(self, sequence: Sequence, reason: FinishReason) -> None:
        self.blocks.free(sequence.request_id)
        if sequence.status is SequenceStatus.RUNNING:
            self._running.remove(sequence)
        elif sequence.status is SequenceStatus.WAITING:
            if sequence.request.probe:
                self._probes.remove(sequence)
            else:
                self._waiting.remove(sequence)
        sequence.status = SequenceStatus.FINISHED
        sequence.finish_reason = reason

    def _output(self, sequence: Sequence, new_token_ids: tuple[int, ...]) -> RequestOutput:
        return RequestOutput(
            request_id=sequence.request_id,
            new_token_ids=new_token_ids,
            finish_reason=sequence.finish_reason,
            num_prompt_tokens=sequence.num_prompt_tokens,
            num_cached_tokens=sequence.num_cached_tokens,
            num_output_tokens=sequence.num_known_output_tokens,
        )
