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
    (wall clock, 0 = none)."""

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

    def __aiter__(self) -> ProgressWatch[Event]:
        return self

    async def __anext__(self) -> Event:
        now = self._loop.time()
        if self._deadline_at is not None and now >= self._deadline_at:
            raise self._deadline_passed()
        wake_at = now + self._stall_timeout_s
        by_deadline = self._deadline_at is not None and self._deadline_at < wake_at
        if by_deadline:
            wake_at = self._deadline_at  # type: ignore[assignment]
        timeout = asyncio.timeout_at(wake_at)
        try:
            async with timeout:
                return await anext(self._events)
        except TimeoutError:
            if not timeout.expired():  # not ours
                raise
            raise (self._deadline_passed() if by_deadline else self._stalled()) from None

    def _stalled(self) -> StreamTimeout:
        return StreamTimeout.of(
            Reason.REPLICA_LOST,
            f"The model replica stopped making progress (nothing for {self._stall_timeout_s:g} s); "
            "retry the request.",
        )

    @staticmethod
    def _deadline_passed() -> StreamTimeout:
        return StreamTimeout.of(Reason.DEADLINE_EXCEEDED, "The request's deadline passed before it finished.")
