"""The requests of one Router.GenerateMany call: each runs the relay as its
own task, and their events leave batched.

A replica step's tokens reach the router as one message and wake every
relay on it in the same event-loop pass; each relay's event lands in the
outbox, and the response stream, woken after them, sends the whole outbox
as one message. So the gateway gets about one message per replica step
instead of one per token per request.
"""

from __future__ import annotations

import asyncio
import logging

from opentelemetry import context as otel_context

from sluice.outcomes import Reason
from sluice.router.relay import Relay
from sluice.rpc.errors import ServiceError, request_failed
from sluice.telemetry import spans
from sluice.v1 import router_pb2

log = logging.getLogger(__name__)


class RoutedRequests:
    def __init__(self, relay: Relay) -> None:
        self._relay = relay
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._outbox: list[router_pb2.RoutedEvent] = []
        self._ready = asyncio.Event()
        self._closed = False

    def submit(self, request: router_pb2.GenerateRequest) -> None:
        request_id = request.request_id
        if not request_id or request_id in self._tasks:
            error = ServiceError.of(Reason.INVALID_REQUEST, f"request id {request_id!r} is empty or already running")
            self._emit(router_pb2.RoutedEvent(request_id=request_id, failed=request_failed(error.info)))
            return
        self._tasks[request_id] = asyncio.create_task(self._run(request), name=f"relay-{request_id}")

    def cancel(self, request_id: str) -> None:
        """The caller gave up on it (client disconnect): the relay's cleanup
        gives back its placement and cancels it on the replica."""
        task = self._tasks.pop(request_id, None)
        if task is not None:
            task.cancel()

    def cancel_all(self) -> None:
        for request_id in list(self._tasks):
            self.cancel(request_id)

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def next_batch(self) -> router_pb2.GenerateEventBatch | None:
        while not self._outbox:
            if self._closed and not self._tasks:
                return None
            await self._ready.wait()
            self._ready.clear()
        events, self._outbox = self._outbox, []
        return router_pb2.GenerateEventBatch(events=events)

    async def _run(self, request: router_pb2.GenerateRequest) -> None:
        request_id = request.request_id
        # This task is the request's alone: its context is the one the
        # request's message carries, so this hop's log lines name its trace.
        # (Never detached: the task's context copy ends with it.)
        otel_context.attach(spans.request_parent(request.trace_context))
        try:
            async for event in self._relay.generate(request):
                self._emit(router_pb2.RoutedEvent(request_id=request_id, event=event))
        except ServiceError as error:  # refused before its first event
            self._emit(router_pb2.RoutedEvent(request_id=request_id, failed=request_failed(error.info)))
        except Exception:
            log.exception("relay of request %s failed", request_id, extra={"request_id": request_id})
            error = ServiceError.of(Reason.INTERNAL_ERROR, "the router failed the request")
            self._emit(router_pb2.RoutedEvent(request_id=request_id, failed=request_failed(error.info)))
        finally:
            if self._tasks.get(request_id) is asyncio.current_task():
                del self._tasks[request_id]
            self._ready.set()  # a closed call may now be done

    def _emit(self, event: router_pb2.RoutedEvent) -> None:
        self._outbox.append(event)
        self._ready.set()
