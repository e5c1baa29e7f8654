"""Readiness that catches a wedged device, not only a closed port.

Every `interval_s` a one-token request goes through the real path (engine
loop, model forward on the device, sampler). If it does not come back within
`timeout_s` the replica reports not ready (health NOT_SERVING, ready=false
in its state), so the scheduler stops placing work on it.
"""

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable

from sluice.engine.request import EngineRequest, StopPolicy
from sluice.model.sampler import SamplingParams
from sluice.replica.engine_loop import EngineLoop
from sluice.replica.metrics import ReplicaCounters
from sluice.replica.streams import RequestStream

log = logging.getLogger(__name__)


class Canary:
    def __init__(
        self,
        engine: EngineLoop,
        probe_token_id: int,
        interval_s: float,
        timeout_s: float,
        on_change: Callable[[bool], Awaitable[None]],
        counters: ReplicaCounters,
    ) -> None:
        self._engine = engine
        self._counters = counters  # canary_failures_total
        self._probe_token_id = probe_token_id
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._on_change = on_change
        self._ids = itertools.count()
        self.ready = False
        self.last_latency_s: float | None = None

    async def probe_once(self) -> bool:
        request = EngineRequest(
            request_id=f"canary-{next(self._ids)}",
            prompt_token_ids=(self._probe_token_id,),
            stop=StopPolicy(max_output_tokens=1),
            sampling=SamplingParams(temperature=0.0, max_tokens=1),
            arrival_s=time.monotonic(),
            probe=True,  # ahead of every queue: a busy replica is not a wedged one
        )
        started_s = time.monotonic()
        stream = RequestStream(self._engine, request)
        try:
            async with asyncio.timeout(self._timeout_s):
                while not stream.finished:
                    await stream.next_batch()
        except (TimeoutError, ValueError, RuntimeError) as error:
            log.error("canary failed after %.2fs: %r", time.monotonic() - started_s, error)
            stream.cancel()
            self._counters.canary_failures_total += 1
            return False
        self.last_latency_s = time.monotonic() - started_s
        return True

    async def run(self) -> None:
        while True:
            ready = await self.probe_once()
            if ready != self.ready:
                self.ready = ready
                log.info("replica %s", "ready" if ready else "NOT ready")
                await self._on_change(ready)
            await asyncio.sleep(self._interval_s)
