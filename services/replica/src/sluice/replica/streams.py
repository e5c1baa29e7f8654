"""Bridges the model thread's per-request outputs into asyncio."""

import asyncio

from sluice.engine.plan import RequestOutput
from sluice.engine.request import EngineRequest
from sluice.replica.engine_loop import EngineLoop


class RequestStream:
    """Outputs of one request as an async iterator of batches.

    The model thread may produce several tokens before the event loop reads;
    `next_batch` returns all that are waiting so a slow reader gets fewer,
    larger messages instead of falling behind.
    """

    def __init__(self, engine: EngineLoop, request: EngineRequest) -> None:
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        self._engine = engine
        self.request_id = request.request_id
        self.finished = False
        engine.submit(request, lambda item: loop.call_soon_threadsafe(self._queue.put_nowait, item))

    async def next_batch(self) -> list[RequestOutput]:
        items = [await self._queue.get()]
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        outputs = []
        for item in items:
            if isinstance(item, BaseException):
                self.finished = True
                raise item
            outputs.append(item)
            if item.finished:
                self.finished = True
        return outputs

    def cancel(self) -> None:
        if not self.finished:
            self._engine.cancel(self.request_id)
            self.finished = True
