"""Interleave keep-alives into a slow async stream.

A request may sit in a replica's queue or prefill a long prompt before its
first token; proxies and clients drop SSE connections that stay silent for
long. `with_heartbeat` yields None whenever `interval_s` passes without an
item, so the caller can send an SSE comment.

It runs on every token of every stream, so an item costs one queue put and
get: a pump task reads the source, and one timer per stream (re-armed only
when it fires) decides on heartbeats. (A read with a timeout per item, i.e.
a task and a timer handle per token, cost more than the rest of the SSE path.)
The source is read until the consumer stops; then the pending read is cancelled.

The pump reads one item ahead, no more: a consumer that stops (an SSE
client that stopped reading holds back the writes) leaves the rest in the
source, whose own bound then ends the stream (the router session's
`slow_reader`). A queue of its own here would hide that consumer, and grow.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")

_HEARTBEAT = object()
_END = object()


async def with_heartbeat(items: AsyncIterator[T], interval_s: float) -> AsyncIterator[T | None]:
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
