"""The serving side of a call that carries many requests: read commands,
answer with batches, and clean up however the call ends.

A service supplies the ``Batcher`` (what running a request means there, and
how its events are gathered) and a function that applies one command to it.
The call ends when the caller has closed its side and nothing is left
running; if the caller goes away first, every request still running is
cancelled, so none keeps a replica busy for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

Batch = TypeVar("Batch")


class Batcher(Protocol[Batch]):
    def close(self) -> None:
        """No more submits: next_batch returns None once the running requests end."""

    async def next_batch(self) -> Batch | None:
        """Everything produced since the last call (waits for some), or None at the end."""

    def cancel_all(self) -> None:
        """Stop every request still running."""


async def serve_multiplexed(
    commands: AsyncIterator[Any], apply: Callable[[Any], None], batcher: Batcher[Batch]
) -> AsyncIterator[Batch]:
    async def read_commands() -> None:
        try:
            async for command in commands:
                apply(command)
        finally:
            batcher.close()  # the caller closed its side (or broke the call)

    reader = asyncio.create_task(read_commands())
    try:
        while (batch := await batcher.next_batch()) is not None:
            yield batch
    finally:
        reader.cancel()
        batcher.cancel_all()
