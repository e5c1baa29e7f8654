"""Work that must outlive the coroutine that started it.

When a client disconnects, its response coroutine is cancelled; the
accounting for that request (unbilled attempt, releasing the slot and the
idempotency key) still has to run. Tasks are kept referenced until done and
awaited at shutdown.
"""

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class BackgroundTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    async def run_to_completion(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Await `coroutine` in its own task: if the caller is cancelled (the
        client went away mid-accounting; Starlette's anyio scope cancels every
        await after the first) the work still finishes."""
        return await asyncio.shield(self.spawn(coroutine))

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    async def drain(self, timeout_s: float) -> None:
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
