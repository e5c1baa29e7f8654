"""The router's end of the Scheduler.Place stream.

One long-lived bidirectional stream carries every enqueue, first-token and
release message; the scheduler answers each enqueue once, when its policy
dispatches it (possibly after it queued) or refuses it. The router holds no
queue: a caller simply awaits its answer. If the stream breaks, waiting
callers fail with scheduler_unavailable (the scheduler has dropped our
entries with the stream) and the client reconnects in the background.
"""

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from sluice.rpc.channels import insecure_channel
from sluice.outcomes import Reason, outcome_of
from sluice.rpc.errors import ServiceError
from sluice.v1 import scheduler_pb2, scheduler_pb2_grpc

log = logging.getLogger(__name__)

RECONNECT_BACKOFF_S = (0.1, 0.3, 1.0, 2.0)


class PlacementClient:
    def __init__(self, address: str) -> None:
        self._address = address
        self._outgoing: asyncio.Queue[scheduler_pb2.PlacementRequest | None] = asyncio.Queue()
        self._pending: dict[str, asyncio.Future[scheduler_pb2.Placement]] = {}
        self._connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    async def place(self, enqueue: scheduler_pb2.Enqueue, timeout_s: float) -> scheduler_pb2.Dispatch:
        if not self._connected.is_set():
            raise ServiceError.of(Reason.SCHEDULER_UNAVAILABLE, "The scheduler is not reachable.", retry_after_s=1.0)
        future: asyncio.Future[scheduler_pb2.Placement] = asyncio.get_running_loop().create_future()
        self._pending[enqueue.request_id] = future
        self._outgoing.put_nowait(scheduler_pb2.PlacementRequest(enqueue=enqueue))
        try:
            placement = await asyncio.wait_for(future, timeout_s)
        except TimeoutError:
            # A backstop only: the scheduler answers a queued request by its
            # deadline itself (queue_timeout, with a predicted Retry-After).
            self.release(enqueue.request_id)
            raise ServiceError.of(
                Reason.QUEUE_TIMEOUT, "Timed out waiting for the scheduler to place the request.", retry_after_s=1.0
            ) from None
        except asyncio.CancelledError:
            self.release(enqueue.request_id)  # the caller left while queued
            raise
        finally:
            self._pending.pop(enqueue.request_id, None)
        if placement.WhichOneof("outcome") == "dispatch":
            return placement.dispatch
        reject = placement.reject
        outcome = outcome_of(reject.reason)
        # The scheduler's reason passes through as is; a string outside the
        # vocabulary (a newer scheduler) still reads as contention.
        retry_after_s = reject.retry_after_s if outcome is None or outcome.retryable else None
        if outcome is None:
            raise ServiceError(grpc.StatusCode.RESOURCE_EXHAUSTED, reject.reason, reject.message,
                               retry_after_s=retry_after_s)
        raise ServiceError.of(outcome.reason, reject.message, retry_after_s=retry_after_s)

    def started(self, request_id: str) -> None:
        """The request's first token arrived (its prefill is over)."""
        if self._connected.is_set():
            self._outgoing.put_nowait(
                scheduler_pb2.PlacementRequest(started=scheduler_pb2.Started(request_id=request_id))
            )

    def release(self, request_id: str, output_tokens: int = 0) -> None:
        if self._connected.is_set():
            self._outgoing.put_nowait(
                scheduler_pb2.PlacementRequest(
                    release=scheduler_pb2.Release(request_id=request_id, output_tokens=output_tokens)
                )
            )

    @staticmethod
    async def _requests(
        outgoing: "asyncio.Queue[scheduler_pb2.PlacementRequest | None]",
    ) -> AsyncIterator[scheduler_pb2.PlacementRequest]:
        while True:
            message = await outgoing.get()
            if message is None:
                return
            yield message

    async def _run(self) -> None:
        attempt = 0
        while True:
            channel = insecure_channel(self._address)
            try:
                await channel.channel_ready()
                stub = scheduler_pb2_grpc.SchedulerStub(channel)
                self._outgoing = asyncio.Queue()
                call = stub.Place(self._requests(self._outgoing))
                self._connected.set()
                attempt = 0
                log.info("placement stream to %s open", self._address)
                async for placement in call:
                    future = self._pending.get(placement.request_id)
                    if future is not None and not future.done():
                        future.set_result(placement)
                    elif placement.WhichOneof("outcome") == "dispatch":
                        # Nobody waits for it any more: hand the capacity back.
                        self.release(placement.request_id)
            except grpc.aio.AioRpcError as error:
                log.warning("placement stream to %s broke: %s", self._address, error.code().name)
            finally:
                self._connected.clear()
                self._outgoing.put_nowait(None)
                for future in self._pending.values():
                    if not future.done():
                        future.set_exception(
                            ServiceError.of(Reason.SCHEDULER_UNAVAILABLE, "The scheduler stream broke.",
                                            retry_after_s=1.0)
                        )
                await channel.close()
            await asyncio.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
            attempt += 1
