"""Interleave keep-alives into a slow async stream.

A request may sit in a replica's queue or prefill a long prompt before its
first token; proxies and clients drop SSE connections that stay silent for
long. `with_heartbeat` yields None whenever `interval_s` passes without an
item, so the caller can send an SSE comment. The pending read is never
cancelled by a heartbeat, only when the consumer stops.
"""

import asyncio
from collections.abc import AsyncIterator
from typing import TypeVar

T = TypeVar("T")


async def with_heartbeat(items: AsyncIterator[T], interval_s: float) -> AsyncIterator[T | None]:
    pending: asyncio.Future[T] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(items.__anext__())
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield None
                continue
            finished, pending = pending, None
            try:
                item = finished.result()
            except StopAsyncIteration:
                return
            yield item
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
