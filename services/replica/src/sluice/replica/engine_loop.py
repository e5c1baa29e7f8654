"""The engine thread: schedule, run, postprocess, forever.

Only this thread touches the engine core. Other threads talk to it through
a command queue (submit, cancel) and read an immutable `EngineSnapshot`
that the thread republishes after every step, and the prefix-cache changes
it records after every step in `cache_events`. Each request's outputs go
to the sink its submitter gave (a callable that must be thread-safe, e.g.
loop.call_soon_threadsafe into an asyncio queue).

A submitter that gathers many requests' outputs (one message per step for
all of them) also gives a `flush`: called once a step, after every sink
of that step, so it wakes its reader once. Without overlap the flush
waits until the next step is planned and prepared, right before it runs:
the reader's work (building and sending the step's message) then shares
the GIL with the model's C kernels, which release it, and not with the
planning and input preparation, which hold it (on two shared cores, the
reader woken at the first sink stretched preparing a 64-decode step from
~0.5 ms alone to 1.5 ms).

With `overlap` (async scheduling, as vLLM's), the model runs on a thread of
its own and the engine thread works one step ahead of it:

    model thread:   | step N            | step N+1          | step N+2
    engine thread:    plan+prepare N+1    update+emit N       ...
                                          plan+prepare N+2

so planning, input preparation and the outputs' bookkeeping leave the
model's critical path. Step N+1's decodes of tokens N samples carry
placeholders the model thread fills in from N's sample before it runs
N+1. A plan that may be given up for a chat (yields_to_chats) is not
planned past: the next plan waits for it to end, as do commands, so the
chat that arrives meanwhile still makes it yield. Without `overlap` the
engine thread runs each step itself, one at a time.
"""

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from sluice.engine.plan import RequestOutput, StepPlan
from sluice.engine.request import EngineRequest
from sluice.engine.scheduler import IterationScheduler
from sluice.model.yielding import StepYielded
from sluice.replica.cache_events import CacheEventLog
from sluice.replica.engine_metrics import EngineMetrics
from sluice.replica.executor import PreparedPlan, StepExecutor

log = logging.getLogger(__name__)

Sink = Callable[[RequestOutput | BaseException], None]
Flush = Callable[[], None]


@dataclass(frozen=True, slots=True)
class _Receiver:
    """Where a request's outputs go: its sink, and its submitter's flush if it gave one."""

    sink: Sink
    flush: Flush | None = None

# Smoothing of the step-time average reported to the scheduler: ~the last
# 20 steps, so one slow prefill does not look like a slow replica.
STEP_TIME_EWMA_WEIGHT = 0.05
IDLE_WAIT_S = 0.5
# Cache events kept for WatchState subscribers, per KV block. Past ~2 events
# a block since a subscriber's previous message, a snapshot (at most one
# hash per block) is no bigger than the deltas would be, so a subscriber
# that far behind gets one.
CACHE_EVENTS_PER_BLOCK = 2


@dataclass(frozen=True, slots=True)
class EngineSnapshot:
    total_kv_blocks: int
    free_kv_blocks: int
    block_size_tokens: int
    num_running: int
    num_waiting: int
    step_time_s: float
    steps_total: int
    generated_tokens_total: int
    preemptions_total: int
    last_step_at_s: float
    # Prefix cache, in tokens: looked up at each admission, and found cached.
    prefix_cache_queried_tokens_total: int = 0
    prefix_cache_hit_tokens_total: int = 0
    # Free blocks that still hold a cached prefix (evicted LRU when needed).
    cached_free_kv_blocks: int = 0
    max_num_seqs: int = 0  # resident sequences the engine takes at once


class StepSkipped(Exception):
    """Not run: the step planned before it failed, so its placeholders
    have no tokens (the engine takes the plan back)."""


@dataclass(slots=True, eq=False)
class LaunchedStep:
    """A prepared step handed to the model; the model side fills in the rest."""

    prepared: PreparedPlan
    # The step launched before it, still running when it was planned: its
    # samples fill this one's placeholders (None: planned after it ended).
    follows: "LaunchedStep | None"
    should_yield: Callable[[], bool] | None
    started_s: float = 0.0
    ended_s: float = 0.0
    sampled: Mapping[str, int] | None = None
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def plan(self) -> StepPlan:
        return self.prepared.plan


class EngineLoop:
    def __init__(self, core: IterationScheduler, executor: StepExecutor, clock: Callable[[], float] = time.monotonic,
                 cache_events: CacheEventLog | None = None, metrics: EngineMetrics | None = None,
                 overlap: bool = False):
        self._core = core
        self.overlap = overlap
        # Unregistered when none is given (tests, tools): recorded, never scraped.
        self.metrics = metrics or EngineMetrics(model="", replica="")
        self._executor = executor
        self._clock = clock
        self._commands: deque[Callable[[], None]] = deque()
        self._wake = threading.Condition()
        self._receivers: dict[str, _Receiver] = {}
        self._unflushed: dict[Flush, None] = {}  # flushes owed for outputs already sunk, in order
        self._stopping = False
        # A chat was submitted since the loop last took its commands: a step
        # whose plan yields to chats gives way (SchedulerConfig.yield_to_chats).
        # Set with the command and cleared as the commands are taken, both
        # under the lock; read between layers without it.
        self._chat_submitted = False
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        # Steps launched and not yet applied, oldest first: at most two (one
        # running, one queued behind it) with overlap, else at most one.
        self._in_flight: deque[LaunchedStep] = deque()
        self._model_queue: queue.SimpleQueue[LaunchedStep | None] = queue.SimpleQueue()
        self._model_thread = threading.Thread(target=self._run_model, name="engine-model", daemon=True)
        self._step_time_s = 0.0
        self._steps_total = 0
        self._generated_tokens_total = 0
        # Written by the engine thread only (record); read by WatchState streams.
        self.cache_events = cache_events or CacheEventLog(CACHE_EVENTS_PER_BLOCK * core.blocks.num_blocks)
        self.cache_events.record(core.blocks.drain_cache_events())  # whatever it cached before this loop
        self.snapshot = self._take_snapshot(clock())

    # -- any thread ----------------------------------------------------------

    def start(self) -> None:
        if self.overlap:
            self._model_thread.start()
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout_s)
        if self._model_thread.is_alive():
            self._model_queue.put(None)
            self._model_thread.join(timeout_s)

    def submit(self, request: EngineRequest, sink: Sink, flush: Flush | None = None) -> None:
        """Run `request`; its outputs (or its failure) go to `sink`, on the
        engine thread, and `flush` (if given) is called once after each step
        that gave it any."""
        self._command(lambda: self._add(request, sink, flush), chat=self._core.config.is_chat(request))

    def cancel(self, request_id: str) -> None:
        self._command(lambda: self._cancel(request_id))

    def _command(self, command: Callable[[], None], chat: bool = False) -> None:
        with self._wake:
            self._commands.append(command)
            self._chat_submitted = self._chat_submitted or chat
            self._wake.notify()

    # -- the engine thread ---------------------------------------------------

    def _run(self) -> None:
        while True:
            in_flight = self._in_flight
            try:
                if in_flight and (not self.overlap or in_flight[-1].plan.yields_to_chats):
                    self._finish_all()  # nothing is planned past it, and no command taken meanwhile
                if not self._core.has_work():
                    self._flush()  # no step to wait for: the outputs go now
                with self._wake:
                    while (not self._stopping and not self._commands and not in_flight
                           and not self._core.has_work()):
                        self._wake.wait(IDLE_WAIT_S)
                    stopping = self._stopping
                    commands = list(self._commands)
                    self._commands.clear()
                    self._chat_submitted = False  # those chats are added before the next plan
                if stopping:
                    self._finish_all()
                    self._flush()
                    return
                for command in commands:
                    command()
                launched = False
                if self._core.has_work() and len(in_flight) < 2:
                    launched = self._plan_next()
                # With overlap, the step just launched runs while the one
                # before it is applied, and the next is planned.
                if in_flight and (not self.overlap or len(in_flight) == 2 or not launched):
                    self._finish(in_flight.popleft())
            except Exception as error:  # a bug in the core must not hang every stream
                log.exception("engine loop failed; failing %d requests", len(self._receivers))
                self._drain()
                self._fail_all(error)
            self.cache_events.record(self._core.blocks.drain_cache_events())
            self.snapshot = self._take_snapshot(self._clock())

    def _plan_next(self) -> bool:
        """Plan and launch the next step; False if there was nothing to run."""
        plan = self._core.schedule(self._clock())
        if plan.is_empty:
            self._flush()
            if not self._in_flight:
                # Waiting work that cannot get blocks yet; running work will free some.
                with self._wake:
                    self._wake.wait(0.01)
            return False  # else the step that runs frees blocks, or ends the sequences left
        prepared = self._executor.prepare(plan)
        follows = self._in_flight[-1] if self._in_flight else None
        launched = LaunchedStep(prepared, follows, self._chat_waits if plan.yields_to_chats else None)
        self._in_flight.append(launched)
        if self.overlap:
            self._model_queue.put(launched)
        else:
            self._flush()  # the last step's outputs, while this one runs (see the module's docstring)
            self._run_step(launched)
        return True

    # -- the model (the model thread with overlap, else the engine thread) ---

    def _run_model(self) -> None:
        while (launched := self._model_queue.get()) is not None:
            self._run_step(launched)

    def _run_step(self, launched: LaunchedStep) -> None:
        launched.started_s = self._clock()
        try:
            follows = launched.follows
            if follows is not None:
                follows.done.wait()  # queued in order: already set, but say so
                if follows.error is not None:
                    raise StepSkipped()
            previous = follows.sampled if follows is not None else None
            launched.sampled = self._executor.run_prepared(launched.prepared, previous, launched.should_yield).sampled
        except BaseException as error:  # handed to the engine thread, which owns the requests
            launched.error = error
        launched.ended_s = self._clock()
        launched.done.set()

    # -- back on the engine thread -------------------------------------------

    def _finish_all(self) -> None:
        while self._in_flight:
            self._finish(self._in_flight.popleft())

    def _drain(self) -> None:
        """After a failure of the loop itself: wait out what runs, apply nothing."""
        while self._in_flight:
            launched = self._in_flight.pop()
            launched.done.wait()
            try:
                self._core.unschedule(launched.plan)
            except Exception:  # the core is what failed: its requests are failed next anyway
                log.exception("could not take back a plan after a failure")

    def _finish(self, launched: LaunchedStep) -> None:
        """Apply a launched step (waiting for it) and emit its outputs."""
        launched.done.wait()
        plan = launched.plan
        error = launched.error
        if error is not None:
            # What was planned after it has not run (or cannot): take it back first.
            for later in reversed(self._in_flight):
                later.done.wait()
                self._core.unschedule(later.plan)
            self._in_flight.clear()
            if isinstance(error, StepYielded):
                # Its work is planned again once the chat's first-token step has run.
                self._core.abandon(plan)
                self.metrics.yielded(launched.started_s, launched.ended_s)
            elif not isinstance(error, StepSkipped):  # a failed step fails its requests, not the replica
                log.error("engine step failed; failing %d requests", len(plan.chunks), exc_info=error)
                self._core.unschedule(plan)
                for chunk in plan.chunks:
                    self._fail(chunk.request_id, error)
            return
        assert launched.sampled is not None
        outputs = self._core.update(plan, launched.sampled)
        elapsed_s = launched.ended_s - launched.started_s
        self.metrics.step(plan, outputs, launched.started_s, launched.ended_s)
        self._step_time_s += STEP_TIME_EWMA_WEIGHT * (elapsed_s - self._step_time_s)
        self._steps_total += 1
        for output in outputs:
            self._generated_tokens_total += len(output.new_token_ids)
            receiver = self._receivers.get(output.request_id)
            if output.finished:
                self._receivers.pop(output.request_id, None)
                self._executor.forget(output.request_id)
            if receiver is not None:
                self._send(receiver, output)
        if self.overlap:
            self._flush()  # the next step already runs on the model thread

    def _send(self, receiver: _Receiver, item: RequestOutput | BaseException) -> None:
        """Sink `item`; its flush is owed until the next `_flush`."""
        receiver.sink(item)
        if receiver.flush is not None:
            self._unflushed[receiver.flush] = None

    def _flush(self) -> None:
        """Call each flush owed for the outputs sunk since the last call."""
        flushes = list(self._unflushed)
        self._unflushed.clear()
        for flush in flushes:
            flush()

    def _fail_all(self, error: BaseException) -> None:
        for request_id in list(self._receivers):
            self._fail(request_id, error)

    def _fail(self, request_id: str, error: BaseException) -> None:
        """End a request with `error`: forgotten by the core and everyone."""
        self._core.cancel(request_id)
        self._executor.forget(request_id)
        self.metrics.forget(request_id)
        receiver = self._receivers.pop(request_id, None)
        if receiver is not None:
            self._send(receiver, error)
            self._flush()  # a failure goes at once

    def _add(self, request: EngineRequest, sink: Sink, flush: Flush | None = None) -> None:
        now_s = self._clock()
        try:
            self._core.add(request, now_s)  # the clock schedule() runs on
        except ValueError as error:
            self._send(_Receiver(sink, flush), error)
            self._flush()  # a refusal goes at once
            return
        self._receivers[request.request_id] = _Receiver(sink, flush)
        self.metrics.arrived(request, now_s)

    def _cancel(self, request_id: str) -> None:
        if self._core.cancel(request_id):
            self._executor.forget(request_id)
        self._receivers.pop(request_id, None)
        self.metrics.ended(request_id, self._clock())

    def _chat_waits(self) -> bool:
        return self._chat_submitted

    def _take_snapshot(self, now_s: float) -> EngineSnapshot:
        blocks = self._core.blocks
        return EngineSnapshot(
            total_kv_blocks=blocks.num_blocks,
            free_kv_blocks=blocks.num_free_blocks,
            block_size_tokens=blocks.block_size_tokens,
            num_running=self._core.num_running,
            num_waiting=self._core.num_waiting,
            step_time_s=self._step_time_s,
            steps_total=self._steps_total,
            generated_tokens_total=self._generated_tokens_total,
            preemptions_total=self._core.num_preemptions_total,
            last_step_at_s=now_s,
            prefix_cache_queried_tokens_total=blocks.prefix_cache_queried_tokens_total,
            prefix_cache_hit_tokens_total=blocks.prefix_cache_hit_tokens_total,
            cached_free_kv_blocks=blocks.num_cached_free_blocks,
            max_num_seqs=self._core.config.max_num_seqs,
        )
