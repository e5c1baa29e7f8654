"""The router's side of Replica.GenerateMany: one call per replica, shared by
every request the router sends there.

    relay A ─┐ open(request)                 ┌─ queue A ◀─┐
    relay B ─┼──▶ commands ──▶ GenerateMany ─┤            ├─ reader task:
    relay C ─┘ cancel(id)       (one call)   └─ queue C ◀─┘  one TokenEventBatch
                                                             per engine step

A relay reads its own request's TokenEvents from a queue, as it would from
a call of its own; the reader task is the only one reading the call. When
the call fails or ends, every request still on it fails with the reason,
and the next request opens a new call.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import grpc

from sluice.rpc.errors import ServiceError, from_rpc_error
from sluice.v1 import replica_pb2, replica_pb2_grpc

log = logging.getLogger(__name__)

_STATUS_BY_CODE = {status.value[0]: status for status in grpc.StatusCode}


class _Call:
    """One GenerateMany call and the requests on it."""

    def __init__(self, stub: replica_pb2_grpc.ReplicaStub) -> None:
        self.commands: asyncio.Queue[replica_pb2.GenerateCommand | None] = asyncio.Queue()
        self.streams: dict[str, asyncio.Queue[replica_pb2.TokenEvent | ServiceError]] = {}
        self.failed = False
        self.call = stub.GenerateMany(self._command_stream())
        self.reader = asyncio.create_task(self._read(), name="replica-session-reader")

    async def _command_stream(self) -> AsyncIterator[replica_pb2.GenerateCommand]:
        while (command := await self.commands.get()) is not None:
            yield command

    async def _read(self) -> None:
        ended = ServiceError(grpc.StatusCode.UNAVAILABLE, "replica_stream_ended",
                             "the replica ended the stream without finishing")
        try:
            async for batch in self.call:
                for event in batch.events:
                    self._deliver(event)
        except grpc.aio.AioRpcError as error:
            ended = from_rpc_error(error)
        except asyncio.CancelledError:
            ended = ServiceError(grpc.StatusCode.CANCELLED, "cancelled", "the router closed the replica stream")
            raise
        finally:
            self.failed = True
            for queue in self.streams.values():
                queue.put_nowait(ended)
            self.streams.clear()

    def _deliver(self, event: replica_pb2.RequestEvent) -> None:
        queue = self.streams.get(event.request_id)
        if queue is None:  # cancelled by its relay; late events are dropped
            return
        if event.WhichOneof("event") == "failed":
            failed = event.failed
            status = _STATUS_BY_CODE.get(failed.status_code, grpc.StatusCode.INTERNAL)
            queue.put_nowait(ServiceError(status, failed.reason or "internal_error", failed.message))
            del self.streams[event.request_id]
            return
        queue.put_nowait(event.token)
        if event.token.WhichOneof("event") == "finished":
            del self.streams[event.request_id]


class RequestEvents:
    """One request's TokenEvents. Iterating raises ServiceError where a call
    of its own would have failed with that status."""

    def __init__(self, call: _Call, request: replica_pb2.TokenRequest) -> None:
        self._call = call
        self._request_id = request.request_id
        self._queue: asyncio.Queue[replica_pb2.TokenEvent | ServiceError] = asyncio.Queue()
        self._done = False
        call.streams[self._request_id] = self._queue
        call.commands.put_nowait(replica_pb2.GenerateCommand(submit=request))

    def __aiter__(self) -> RequestEvents:
        return self

    async def __anext__(self) -> replica_pb2.TokenEvent:
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if isinstance(item, ServiceError):
            self._done = True
            raise item
        if item.WhichOneof("event") == "finished":
            self._done = True
        return item

    def cancel(self) -> None:
        """Stop the request on the replica (its blocks are freed at the next
        step). A no-op once it finished or failed."""
        if self._done:
            return
        self._done = True
        if self._call.streams.pop(self._request_id, None) is not None and not self._call.failed:
            self._call.commands.put_nowait(replica_pb2.GenerateCommand(cancel_request_id=self._request_id))


class ReplicaSession:
    def __init__(self, stub: replica_pb2_grpc.ReplicaStub) -> None:
        self._stub = stub
        self._current: _Call | None = None

    def open(self, request: replica_pb2.TokenRequest) -> RequestEvents:
        """Submit a request; its events arrive on the returned iterator."""
        if self._current is None or self._current.failed:
            self._current = _Call(self._stub)
        return RequestEvents(self._current, request)

    async def close(self) -> None:
        call, self._current = self._current, None
        if call is not None:
            call.commands.put_nowait(None)
            call.call.cancel()
            call.reader.cancel()
            await asyncio.gather(call.reader, return_exceptions=True)
