"""Replica gRPC servicer: TokenRequest in, engine stream, TokenEvents out."""

import asyncio
import time
from collections.abc import AsyncIterator, Callable

import grpc

from sluice.engine.request import FinishReason
from sluice.model.config import LlamaConfig
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.metrics import ReplicaCounters
from sluice.replica.requests import engine_request
from sluice.replica.streams import RequestStream
from sluice.rpc.errors import ServiceError
from sluice.v1 import common_pb2, replica_pb2, replica_pb2_grpc

FINISH_REASONS = {
    FinishReason.STOP: common_pb2.FINISH_REASON_STOP,
    FinishReason.LENGTH: common_pb2.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: common_pb2.FINISH_REASON_CANCELLED,
}


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

    async def Generate(
        self, request: replica_pb2.TokenRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[replica_pb2.TokenEvent]:
        stream = RequestStream(self._engine, engine_request(request, self._config))
        try:
            while True:
                try:
                    outputs = await stream.next_batch()
                except ValueError as error:  # the engine refused it (can never fit)
                    raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT, "invalid_request", str(error)) from error
                except Exception as error:  # the engine logged the detail
                    raise ServiceError(grpc.StatusCode.INTERNAL, "engine_error", "the engine step failed") from error
                token_ids = [t for output in outputs for t in output.new_token_ids]
                if token_ids:
                    yield replica_pb2.TokenEvent(tokens=replica_pb2.TokenDelta(token_ids=token_ids))
                last = outputs[-1]
                if last.finished:
                    yield replica_pb2.TokenEvent(
                        finished=replica_pb2.TokenFinished(
                            finish_reason=FINISH_REASONS[last.finish_reason],
                            usage=common_pb2.Usage(
                                prompt_tokens=last.num_prompt_tokens,
                                cached_prompt_tokens=last.num_cached_tokens,
                                output_tokens=last.num_output_tokens,
                            ),
                        )
                    )
                    return
        finally:
            if not stream.finished:
                # The caller went away (or a stop string matched upstream):
                # the engine frees the request's blocks before its next step.
                stream.cancel()
                self._counters.cancelled_total += 1

    async def WatchState(
        self, request: replica_pb2.WatchStateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[replica_pb2.ReplicaState]:
        interval_s = max(request.min_interval_s, self._state_interval_s)
        while True:
            snapshot = self._engine.snapshot
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
            )
            await asyncio.sleep(interval_s)
