"""The serving side of a call that carries many requests: read commands,
answer with batches, and clean up however the call ends.

A service supplies the ``Batcher`` (what running a request means there, and
how its events are gathered). Command messages share one shape: a oneof
``command`` holding either the request (any field name) or
``cancel_request_id``.
The call ends when the caller has closed its side and nothing is left
running; if the caller goes away first, every request still running is
cancelled, so none keeps a replica busy for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Protocol, TypeVar

Batch = TypeVar("Batch")


class Batcher(Protocol[Batch]):
    def submit(self, request: Any) -> None:
        """Start a request (a refusal becomes one of its events)."""

    def cancel(self, request_id: str) -> None:
        """Stop one request; unknown or finished ids are ignored."""

    def close(self) -> None:
        """No more submits: next_batch returns None once the running requests end."""

    async def next_batch(self) -> Batch | None:
        """Everything produced since the last call (waits for some), or None at the end."""

    def cancel_all(self) -> None:
        """Stop every request still running."""


async def serve_multiplexed(commands: AsyncIterator[Any], batcher: Batcher[Batch]) -> AsyncIterator[Batch]:
    async def read_commands() -> None:
        try:
            async for command in commands:
                which = command.WhichOneof("command")
                if which == "cancel_request_id":
                    batcher.cancel(command.cancel_request_id)
                elif which is not None:
                    batcher.submit(getattr(command, which))
        finally:
            batcher.close()  # the caller closed its side (or broke the call)

    reader = asyncio.create_task(read_commands())
    try:
        while (batch := await batcher.next_batch()) is not None:
            yield batch
    finally:
        reader.cancel()
        batcher.cancel_all()
