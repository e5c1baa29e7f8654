"""Interleave keep-alives into a slow async stream.

A request may sit in a replica's queue or prefill a long prompt before its
first token; proxies and clients drop SSE connections that stay silent for
long. `with_heartbeat` yields None whenever `interval_s` passes without an
item, so the caller can send an SSE comment.

It runs on every token of every stream, so an item must cost next to
nothing: one timer per stream, re-armed only when it fires, decides on
heartbeats. (A read with a timeout per item, i.e. a task and a timer handle
per token, cost more than the rest of the SSE path.) A source that can be
woken (`Wakeable`: the router session's per-request events) is read
directly and the timer wakes its pending read; any other source is read by
a pump task through a one-slot queue, which costs a second task switch per
item. The source is read until the consumer stops; then the pending read is
cancelled.

The pump reads one item ahead, no more: a consumer that stops (an SSE
client that stopped reading holds back the writes) leaves the rest in the
source, whose own bound then ends the stream (the router session's
`slow_reader`). A queue of its own here would hide that consumer, and grow.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol, TypeVar, runtime_checkable

T = TypeVar("T")

_HEARTBEAT = object()
_END = object()


@runtime_checkable
class Wakeable(Protocol):
    """An async iterator whose pending read `wake()` ends with None (unless
    an item is already waiting), as sluice.rpc.multiplex_client.RequestEvents."""

    def wake(self) -> None: ...


async def with_heartbeat(items: AsyncIterator[T], interval_s: float) -> AsyncIterator[T | None]:
    if isinstance(items, Wakeable):
        async for item in _woken(items, interval_s):  # type: ignore[arg-type]
            yield item
        return
    loop = asyncio.get_running_loop()
    # One slot: an item, a heartbeat or the end waits for the consumer.
    queue: asyncio.Queue[tuple[object, BaseException | None]] = asyncio.Queue(maxsize=1)
    last_sent_s = loop.time()

    async def pump() -> None:
        try:
            async for item in items:
                await queue.put((item, None))
        except Exception as error:  # the consumer sees it where it reads
            await queue.put((_END, error))
            return
        await queue.put((_END, None))

    def tick() -> None:
        nonlocal timer, last_sent_s
        now_s = loop.time()
        if now_s - last_sent_s >= interval_s:
            if queue.empty():  # else the consumer has something to send already
                queue.put_nowait((_HEARTBEAT, None))
            last_sent_s = now_s
        timer = loop.call_at(last_sent_s + interval_s, tick)

    reader = asyncio.create_task(pump())
    timer = loop.call_at(last_sent_s + interval_s, tick)
    try:
        while True:
            item, error = await queue.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            last_sent_s = loop.time()
            yield None if item is _HEARTBEAT else item  # type: ignore[misc]
    finally:
        timer.cancel()
        reader.cancel()


async def _woken(items: AsyncIterator[T | None], interval_s: float) -> AsyncIterator[T | None]:
    """with_heartbeat for a Wakeable source: None from it is the heartbeat."""
    loop = asyncio.get_running_loop()
    last_sent_s = loop.time()

    def tick() -> None:
        nonlocal timer, last_sent_s
        now_s = loop.time()
        if now_s - last_sent_s >= interval_s:
            items.wake()  # type: ignore[attr-defined]
            last_sent_s = now_s
        timer = loop.call_at(last_sent_s + interval_s, tick)

    timer = loop.call_at(last_sent_s + interval_s, tick)
    try:
        async for item in items:
            last_sent_s = loop.time()
            yield item
    finally:
        timer.cancel()
