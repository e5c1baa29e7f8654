"""The caller's side of a call that carries many requests (Router.GenerateMany,
Replica.GenerateMany): one long-lived bidi call per peer, shared by every
request sent there.

    task A ─┐ open(request)                ┌─ queue A ◀─┐
    task B ─┼──▶ commands ──▶ bidi call ───┤            ├─ reader task: one
    task C ─┘ cancel()        (one call)   └─ queue C ◀─┘  batch message per
                                                           peer step / tick

Each task reads its own request's events from a queue, as it would from a
call of its own; the reader task is the only one reading the call. A
request's failure arrives as a `RequestFailed` event and is raised as the
ServiceError a call of its own would have raised; when the call fails or
ends, every request still on it fails with the peer's reason or, where the
peer gave none (it went away), with the owner's `lost` reason
(`replica_lost` for the router's replica sessions, `router_unavailable` for
the gateway's router session); the next `open` starts a new call.

A request's queue is bounded (`max_undelivered_events`): a reader that
falls that far behind (a client that stopped reading its SSE stream) has
its request cancelled at the peer, exactly as its own cancel would, its
queued events dropped, and reads `slow_reader` next; the other requests
on the call never notice. Without the bound one stalled reader would grow
its queue until the generation ended, and nothing would stop it.

gRPC Python spends ~100 us of CPU per message at each end; a relay of one
message per token per request spends a core on that at a few thousand
tokens a second. Batching per step is the cure; this class keeps the
per-request code unaware of it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc

from sluice.outcomes import Reason
from sluice.rpc.errors import ServiceError, from_request_failed, from_rpc_error
from sluice.v1 import common_pb2

Event = TypeVar("Event")

log = logging.getLogger(__name__)

# Each queued item is one peer step's event for that request (a replica
# step's token delta, ~10-50 ms of generation on a GPU), so 256 lets a
# reader fall ~3-13 s behind, on top of what the socket buffers beyond it
# hold, before it is cut off: far more than a GC pause or a busy event loop
# costs a healthy reader, and a few hundred small messages per request at
# most. (An event held here may keep its whole batch message alive; the
# bound caps that too.)
DEFAULT_MAX_UNDELIVERED_EVENTS = 256

_WAKE = object()  # RequestEvents.wake's marker in a request's queue


@dataclass(frozen=True, slots=True)
class MultiplexProtocol(Generic[Event]):
    """How one service's multiplexed call spells its messages. Both services
    share the shape: requests carry ``request_id``; a command message has a
    oneof holding the request (``submit_field``) or ``cancel_request_id``; a
    batch has repeated ``events``, each a ``request_id`` with either the
    event (``event_field``) or ``failed`` (a RequestFailed)."""

    open_call: Callable[[AsyncIterator[Any]], grpc.aio.StreamStreamCall]  # stub method
    command: Callable[..., Any]  # the command message class
    submit_field: str
    event_field: str
    is_last: Callable[[Event], bool]  # no more events follow this one

    def submit(self, request: Any) -> Any:
        return self.command(**{self.submit_field: request})

    def cancel(self, request_id: str) -> Any:
        return self.command(cancel_request_id=request_id)

    def events(self, batch: Any) -> Iterator[tuple[str, Event | None, common_pb2.RequestFailed | None]]:
        for item in batch.events:
            if item.HasField("failed"):
                yield item.request_id, None, item.failed
            else:
                yield item.request_id, getattr(item, self.event_field), None


class _Call(Generic[Event]):
    """One bidi call and the requests on it."""

    def __init__(
        self, protocol: MultiplexProtocol[Event], name: str, lost: Reason, max_undelivered_events: int
    ) -> None:
        self.protocol = protocol
        self.name = name
        self.lost = lost
        self.max_undelivered_events = max_undelivered_events
        self.commands: asyncio.Queue[Any] = asyncio.Queue()
        self.streams: dict[str, asyncio.Queue[Event | ServiceError]] = {}
        self.failed = False
        self.call = protocol.open_call(self._command_stream())
        self.reader = asyncio.create_task(self._read(), name=f"{name}-reader")

    async def _command_stream(self) -> AsyncIterator[Any]:
        while (command := await self.commands.get()) is not None:
            yield command

    async def _read(self) -> None:
        ended = ServiceError.of(self.lost, "the peer ended the stream")
        try:
            async for batch in self.call:
                for request_id, event, failed in self.protocol.events(batch):
                    self._deliver(request_id, event, failed)
        except grpc.aio.AioRpcError as error:
            ended = from_rpc_error(error, unreachable=self.lost)
        except asyncio.CancelledError:
            ended = ServiceError.of(Reason.CANCELLED, "the stream was closed")
            raise
        finally:
            self.failed = True
            for queue in self.streams.values():
                queue.put_nowait(ended)
            self.streams.clear()

    def _deliver(self, request_id: str, event: Event | None, failed: common_pb2.RequestFailed | None) -> None:
        queue = self.streams.get(request_id)
        if queue is None:  # cancelled by its task; late events are dropped
            return
        if failed is not None:
            queue.put_nowait(from_request_failed(failed))
            del self.streams[request_id]
            return
        last = self.protocol.is_last(event)  # type: ignore[arg-type]
        # The last event may go one past the bound: the peer's work is done
        # then, so there is nothing left to stop, and the answer is whole.
        if not last and queue.qsize() >= self.max_undelivered_events:
            self._cut_off(request_id, queue)
            return
        queue.put_nowait(event)  # type: ignore[arg-type]
        if last:
            del self.streams[request_id]

    def _cut_off(self, request_id: str, queue: asyncio.Queue[Event | ServiceError]) -> None:
        """The request's reader fell too far behind: cancel it at the peer
        (which frees its KV at the next step), drop what waits unread, and
        leave the reader the reason."""
        del self.streams[request_id]
        self.commands.put_nowait(self.protocol.cancel(request_id))
        while not queue.empty():
            queue.get_nowait()
        log.warning("%s: request %s cancelled, its reader fell %d events behind",
                    self.name, request_id, self.max_undelivered_events)
        queue.put_nowait(ServiceError.of(
            Reason.SLOW_READER,
            f"The stream was not read fast enough: {self.max_undelivered_events} of its events were waiting "
            "to be sent, so the request was cancelled.",
        ))


class RequestEvents(Generic[Event]):
    """One request's events. Iterating raises ServiceError where a call of
    its own would have failed with that status."""

    def __init__(self, call: _Call[Event], request: Any) -> None:
        self._call = call
        self._request_id = request_id = request.request_id
        self._queue: asyncio.Queue[Event | ServiceError] = asyncio.Queue()
        self._done = False
        call.streams[request_id] = self._queue
        call.commands.put_nowait(call.protocol.submit(request))

    def __aiter__(self) -> RequestEvents[Event]:
        return self

    async def __anext__(self) -> Event | None:
        """The next event; None once after each `wake` that found nothing queued."""
        if self._done:
            raise StopAsyncIteration
        item = await self._queue.get()
        if item is _WAKE:
            return None
        if isinstance(item, ServiceError):
            self._done = True
            raise item
        if self._call.protocol.is_last(item):
            self._done = True
        return item

    def wake(self) -> None:
        """Make the pending (or next) read return None, unless an event is
        already waiting to be read: a reader's timer (an SSE keep-alive) gets
        a turn without a task of its own reading ahead. A marker never piles
        up behind events, so a reader held back counts only real events
        against `max_undelivered_events`."""
        if not self._done and self._queue.empty():
            self._queue.put_nowait(_WAKE)  # type: ignore[arg-type]

    def cancel(self) -> None:
        """Stop the request at the peer. A no-op once it ended."""
        if self._done:
            return
        self._done = True
        if self._call.streams.pop(self._request_id, None) is not None and not self._call.failed:
            self._call.commands.put_nowait(self._call.protocol.cancel(self._request_id))


class MultiplexClient(Generic[Event]):
    def __init__(
        self,
        protocol: MultiplexProtocol[Event],
        *,
        lost: Reason,
        name: str = "multiplex",
        max_undelivered_events: int = DEFAULT_MAX_UNDELIVERED_EVENTS,
    ) -> None:
        """`lost`: the reason requests fail with when the peer goes away
        without one of its own (the owner knows which hop that is).
        `max_undelivered_events`: how many events a request's reader may
        leave unread before the request is cancelled as `slow_reader`."""
        if max_undelivered_events < 1:
            raise ValueError(f"max_undelivered_events must be at least 1, got {max_undelivered_events}")
        self._protocol = protocol
        self._name = name
        self._lost = lost
        self._max_undelivered_events = max_undelivered_events
        self._current: _Call[Event] | None = None

    def open(self, request: Any) -> RequestEvents[Event]:
        """Send a request; its events arrive on the returned iterator."""
        if self._current is None or self._current.failed:
            self._current = _Call(self._protocol, self._name, self._lost, self._max_undelivered_events)
        return RequestEvents(self._current, request)

    async def close(self) -> None:
        call, self._current = self._current, None
        if call is not None:
            call.commands.put_nowait(None)
            call.call.cancel()
            call.reader.cancel()
            await asyncio.gather(call.reader, return_exceptions=True)
