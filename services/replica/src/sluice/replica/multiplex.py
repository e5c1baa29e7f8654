"""Many requests over one GenerateMany call, one message per engine step.

The model thread produces, each step, one output for every running request.
With a call per request that is a gRPC message per request per step, and
gRPC Python spends ~100 us of CPU on each at both ends: at 64 streams that
is a core's worth of relaying on a box whose cores the model needs. Here the
outputs of every request on the call are gathered and leave together:

    engine thread: sink(request_id, output) -> pending deque
                   flush() once the step's outputs are all in: one wake-up
    event loop:    next_batch() drains pending -> one TokenEventBatch

The wake-up is coalesced: however many requests a step served, the event
loop is woken once (the engine loop calls the flush after the step's last
sink, see sluice.replica.engine_loop), and a reader that falls behind gets
everything waiting in one message. The engine loop flushes a failure at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from functools import partial

import grpc

from sluice.engine.plan import RequestOutput
from sluice.model.config import LlamaConfig
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.events import add_token_events, failure_info
from sluice.replica.metrics import ReplicaCounters
from sluice.replica.request_spans import RequestSpans
from sluice.replica.requests import engine_request
from sluice.rpc.errors import ErrorInfo, ServiceError, request_failed
from sluice.v1 import replica_pb2


class MultiplexedRequests:
    """The requests of one GenerateMany call. Event-loop methods except
    ``_from_model_thread`` and ``_flush``, which the engine thread calls."""

    def __init__(
        self, engine: EngineLoop, config: LlamaConfig, counters: ReplicaCounters, spans: RequestSpans | None = None,
    ) -> None:
        self._engine = engine
        self._spans = spans or RequestSpans("", "")
        self._config = config
        self._counters = counters
        self._loop = asyncio.get_running_loop()
        self._pending: deque[tuple[str, RequestOutput | BaseException | ErrorInfo]] = deque()
        self._wake_scheduled = False
        self._ready = asyncio.Event()
        self._active: set[str] = set()
        self._closed = False

    def submit(self, request: replica_pb2.TokenRequest) -> None:
        request_id = request.request_id
        if not request_id or request_id in self._active:
            self._fail(request_id, ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "invalid_request",
                                                f"request id {request_id!r} is empty or already running").info)
            return
        self._spans.arrived(request)
        try:
            engine_req = engine_request(request, self._config)
        except ServiceError as error:
            self._spans.ended(request_id, error.info.reason, failed=True)
            self._fail(request_id, error.info)
            return
        self._active.add(request_id)
        self._engine.submit(engine_req, partial(self._from_model_thread, request_id), self._flush)

    def cancel(self, request_id: str) -> None:
        """The caller no longer wants it (disconnect, stop string): blocks freed next step."""
        if request_id in self._active:
            self._active.discard(request_id)
            self._engine.cancel(request_id)
            self._counters.cancelled_total += 1
            self._spans.ended(request_id, "cancelled")

    def cancel_all(self) -> None:
        for request_id in list(self._active):
            self.cancel(request_id)

    def close(self) -> None:
        """No more submits: ``next_batch`` ends once the running requests finish."""
        self._closed = True
        self._ready.set()

    async def next_batch(self) -> replica_pb2.TokenEventBatch | None:
        """Everything produced since the last call (waits for at least one
        event), or None once closed with nothing left running."""
        while not (self._closed and not self._active and not self._pending):
            await self._ready.wait()
            self._ready.clear()
            batch = self._drain()
            if batch.events:
                return batch
        return None

    def _drain(self) -> replica_pb2.TokenEventBatch:
        # One request may have several outputs waiting (a slow reader): merge
        # them into one delta, in order, as a single-request stream would.
        waiting: dict[str, list[RequestOutput]] = {}
        batch = replica_pb2.TokenEventBatch()
        while self._pending:
            request_id, item = self._pending.popleft()
            if isinstance(item, RequestOutput):
                if request_id in self._active:
                    waiting.setdefault(request_id, []).append(item)
                continue
            failure = item if isinstance(item, ErrorInfo) else failure_info(item)
            if request_id in self._active or isinstance(item, ErrorInfo):
                self._active.discard(request_id)
                self._spans.ended(request_id, failure.reason, failed=True)
                self._add_token_events(batch, request_id, waiting.pop(request_id, []))
                batch.events.add(request_id=request_id, failed=request_failed(failure))
        for request_id, outputs in waiting.items():
            self._spans.produced(request_id, outputs)
            self._add_token_events(batch, request_id, outputs)
            if outputs[-1].finished:
                self._active.discard(request_id)
        return batch

    @staticmethod
    def _add_token_events(batch: replica_pb2.TokenEventBatch, request_id: str, outputs: list[RequestOutput]) -> None:
        if outputs:
            add_token_events(lambda: batch.events.add(request_id=request_id).token, outputs)

    def _fail(self, request_id: str, info: ErrorInfo) -> None:
        self._pending.append((request_id, info))
        self._wake()

    def _from_model_thread(self, request_id: str, item: RequestOutput | BaseException) -> None:
        self._pending.append((request_id, item))  # the engine loop's flush wakes the reader

    def _flush(self) -> None:
        """From the engine thread: wake the event loop for what is pending."""
        if not self._wake_scheduled:
            self._wake_scheduled = True
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        # Cleared before the drain: an item the model thread appends from now
        # on schedules a new wake-up, so none is left behind.
        self._wake_scheduled = False
        self._ready.set()
