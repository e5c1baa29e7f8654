"""Ends a replica stream that stopped making progress, or outlived its
request's deadline.

    replica events ──▶ ProgressWatch ──▶ relay
                          │ nothing for stall_timeout_s  → replica_lost (503, retry)
                          │ deadline_unix_s passed        → deadline_exceeded (504)

A replica that stalls without failing (its call stays open, no step
finishes: a wedged GPU, a stopped process) would otherwise keep the
stream, its reservation and the client alive forever, the gateway's SSE
keep-alives hiding it. Only the wait for the next event is timed, never
the relay's own work between events.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from sluice.outcomes import Reason
from sluice.rpc.errors import ServiceError

Event = TypeVar("Event")

# A replica sends a request an event every step (10-100 ms on a GPU, a few
# ms for the tiny CPU model); its longest honest silence is the request's
# own prefill (a near-context prompt on CPU, or a long one on a busy GPU,
# is seconds) or a batch sequence preempted by interactive work waiting to
# be recomputed. 30 s is ten times the former and bounds how long a client
# watches keep-alives from a replica that stopped; raise it where batch is
# preempted for longer.
DEFAULT_STALL_TIMEOUT_S = 30.0


class StreamTimeout(ServiceError):
    """The watch ended the stream; its message is the whole story (the
    replica did not fail the request, so no hop should say it did)."""


class ProgressWatch(Generic[Event]):
    """Iterates `events`, raising StreamTimeout when the next one takes
    longer than `stall_timeout_s`, or arrives after `deadline_unix_s`
    (wall clock, 0 = none).

    It runs on every token of every stream, so it keeps one timer per
    stream, re-armed only when it fires (at the due time of the wait then
    in progress, or not at all between waits), instead of an
    asyncio.timeout per event (a timer scheduled and cancelled per token).
    An expired wait is ended the way asyncio.timeout ends one: the waiting
    task is cancelled and the cancellation turned into the timeout."""

    def __init__(
        self,
        events: AsyncIterator[Event],
        stall_timeout_s: float,
        deadline_unix_s: float = 0.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._events = events
        self._stall_timeout_s = stall_timeout_s
        self._loop = asyncio.get_running_loop()
        # The deadline on the loop's clock, so a wall-clock step cannot move it.
        self._deadline_at = (
            self._loop.time() + (deadline_unix_s - wall_clock()) if deadline_unix_s > 0 else None
        )
        self._waiter: asyncio.Task | None = None  # the task waiting for an event, while it waits
        self._waiting_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._expired: StreamTimeout | None = None

    def __aiter__(self) -> ProgressWatch[Event]:
        return self

    async def __anext__(self) -> Event:
        now = self._loop.time()
        if self._deadline_at is not None and now >= self._deadline_at:
            self.close()
            raise self._deadline_passed()
        self._waiter, self._waiting_since = asyncio.current_task(), now
        if self._timer is None:
            self._timer = self._loop.call_at(self._due_at(), self._check)
        try:
            event = await anext(self._events)
        except asyncio.CancelledError:
            expired, self._expired = self._expired, None
            self.close()
            if expired is None or self._waiter is None or self._waiter.uncancel() > 0:
                raise  # not ours, or cancelled from outside as well
            raise expired from None
        except BaseException:
            self.close()
            raise
        finally:
            self._waiter = None
        if self._expired is not None:  # the source swallowed our cancellation: take it back
            self._expired = None
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        return event

    def close(self) -> None:
        """Stop the timer (the stream ended; a watch is not reused)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due_at(self) -> float:
        due = self._waiting_since + self._stall_timeout_s
        return due if self._deadline_at is None else min(due, self._deadline_at)

    def _check(self) -> None:
        self._timer = None
        if self._waiter is None:
            return  # between waits: the next wait arms it again
        now = self._loop.time()
        if now < self._due_at():  # an earlier wait's due time: re-arm for this one
            self._timer = self._loop.call_at(self._due_at(), self._check)
            return
        by_deadline = self._deadline_at is not None and now >= self._deadline_at
        self._expired = self._deadline_passed() if by_deadline else self._stalled()
        self._waiter.cancel()

    def _stalled(self) -> StreamTimeout:
        return StreamTimeout.of(
            Reason.REPLICA_LOST,
            f"The model replica stopped making progress (nothing for {self._stall_timeout_s:g} s); "
            "retry the request.",
        )

    @staticmethod
    def _deadline_passed() -> StreamTimeout:
        return StreamTimeout.of(Reason.DEADLINE_EXCEEDED, "The request's deadline passed before it finished.")
