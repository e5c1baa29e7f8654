"""Replica gRPC servicer: token requests in, engine streams, token events out
(one request per Generate call, or many per GenerateMany call)."""

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc

from sluice.model.config import LlamaConfig
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.events import failure_info, token_events
from sluice.replica.metrics import ReplicaCounters
from sluice.replica.multiplex import MultiplexedRequests
from sluice.replica.request_spans import RequestSpans
from sluice.replica.requests import engine_request
from sluice.replica.streams import RequestStream
from sluice.rpc.errors import ServiceError
from sluice.rpc.multiplex_server import serve_multiplexed
from sluice.v1 import replica_pb2, replica_pb2_grpc

class ReplicaServicer(replica_pb2_grpc.ReplicaServicer):
    def __init__(
        self,
        engine: EngineLoop,
        config: LlamaConfig,
        replica_id: str,
        model_version: str,
        is_ready: Callable[[], bool],
        counters: ReplicaCounters,
        state_interval_s: float,
    ) -> None:
        self._engine = engine
        self._config = config
        self._replica_id = replica_id
        self._model_version = model_version
        self._is_ready = is_ready
        self._counters = counters
        self._state_interval_s = state_interval_s
        self._spans = RequestSpans(model_version, replica_id)
        self._watches_closing = asyncio.Event()

    def close_watches(self) -> None:
        """End every WatchState stream at its next report, with status OK.
        Called as the replica stops, before the server's grace period: a
        state stream never ends on its own, and one still open when the
        grace runs out (or cancelled by its caller while the server stops)
        is cancelled inside grpc, which prints the CancelledError's
        traceback to stderr, outside the JSON log lines."""
        self._watches_closing.set()

    async def Generate(
        self, request: replica_pb2.TokenRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[replica_pb2.TokenEvent]:
        self._spans.arrived(request)
        try:
            stream = RequestStream(self._engine, engine_request(request, self._config))
        except ServiceError as error:
            self._spans.ended(request.request_id, error.info.reason, failed=True)
            raise
        try:
            while True:
                try:
                    outputs = await stream.next_batch()
                except Exception as error:
                    info = failure_info(error)
                    self._spans.ended(request.request_id, info.reason, failed=True)
                    raise ServiceError(info.status, info.reason, info.message) from error
                self._spans.produced(request.request_id, outputs)
                for event in token_events(outputs):
                    yield event
                if outputs[-1].finished:
                    return
        finally:
            if not stream.finished:
                # The caller went away (or a stop string matched upstream):
                # the engine frees the request's blocks before its next step.
                stream.cancel()
                self._counters.cancelled_total += 1
                self._spans.ended(request.request_id, "cancelled")

    async def GenerateMany(
        self, request_iterator: AsyncIterator[replica_pb2.GenerateCommand], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[replica_pb2.TokenEventBatch]:
        requests = MultiplexedRequests(self._engine, self._config, self._counters, self._spans)
        async for batch in serve_multiplexed(request_iterator, requests):
            yield batch

    async def WatchState(
        self, request: replica_pb2.WatchStateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[replica_pb2.ReplicaState]:
        interval_s = max(request.min_interval_s, self._state_interval_s)
        cache_cursor: int | None = None  # None: this stream's first message is a cache snapshot
        while True:
            snapshot = self._engine.snapshot
            cache = self._engine.cache_events.read_since(cache_cursor)
            cache_cursor = cache.cursor
            yield replica_pb2.ReplicaState(
                replica_id=self._replica_id,
                model_version=self._model_version,
                total_kv_blocks=snapshot.total_kv_blocks,
                free_kv_blocks=snapshot.free_kv_blocks,
                block_size_tokens=snapshot.block_size_tokens,
                num_running=snapshot.num_running,
                num_waiting=snapshot.num_waiting,
                step_time_s=snapshot.step_time_s,
                ready=self._is_ready(),
                at_unix_s=time.time(),
                max_num_seqs=snapshot.max_num_seqs,
                cache_stored_block_hashes=cache.stored_block_hashes,
                cache_evicted_block_hashes=cache.evicted_block_hashes,
                cache_snapshot=cache.snapshot,
            )
            try:
                await asyncio.wait_for(self._watches_closing.wait(), interval_s)
                return
            except TimeoutError:
                pass
