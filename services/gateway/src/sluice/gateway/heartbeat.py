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
"""

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")

_HEARTBEAT = object()
_END = object()


async def with_heartbeat(items: AsyncIterator[T], interval_s: float) -> AsyncIterator[T | None]:
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[object, BaseException | None]] = asyncio.Queue()
    last_sent_s = loop.time()

    async def pump() -> None:
        try:
            async for item in items:
                queue.put_nowait((item, None))
        except Exception as error:  # the consumer sees it where it reads
            queue.put_nowait((_END, error))
            return
        queue.put_nowait((_END, None))

    def tick() -> None:
        nonlocal timer, last_sent_s
        now_s = loop.time()
        if now_s - last_sent_s >= interval_s:
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
