"""At most a few of one tenant's prompts of one service class are tokenized
at once.

Tokenizing and hashing a long prompt run on the event loop's shared thread
pool, first come first served (a short one on the loop: sluice.router.relay).
A tenant that sends 64 long prompts at once would otherwise queue 64 jobs
there, and another tenant's short chat would wait behind every one of them
before the scheduler even hears of it (measured: ~100 ms of a quiet
tenant's TTFT under such a burst). With this gate the
flood waits on its own semaphore, in its own order, and the others find
the pool at most `per_tenant` of its jobs deep. Each class has its own
lane: a tenant's batch (flex) burst never holds back its own interactive
calls (measured: one tenant's flood of 64 flex prompts of 1,500 tokens
moved its interactive p99 TTFT from ~30 ms to ~60 ms through one shared lane).

    gate = TenantGate(per_tenant=2)
    async with gate.hold(request.tenant, request.service_class):
        prompt_ids = await asyncio.to_thread(tokenize, ...)
"""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

# One tenant's prompts tokenized at once; the default thread pool has
# min(32, cores + 4) workers, so a flood leaves the others most of it.
DEFAULT_PER_TENANT = 2


@dataclass(slots=True)
class _Lane:
    semaphore: asyncio.Semaphore
    users: int = 0  # holding or waiting; the lane is dropped at 0


class TenantGate:
    def __init__(self, per_tenant: int) -> None:
        if per_tenant < 1:
            raise ValueError("per_tenant must be >= 1")
        self._per_tenant = per_tenant
        self._lanes: dict[tuple[str, int], _Lane] = {}

    @asynccontextmanager
    async def hold(self, tenant: str, service_class: int = 0) -> AsyncIterator[None]:
        key = (tenant, service_class)
        lane = self._lanes.get(key)
        if lane is None:
            lane = self._lanes[key] = _Lane(asyncio.Semaphore(self._per_tenant))
        lane.users += 1
        try:
            async with lane.semaphore:
                yield
        finally:
            lane.users -= 1
            if lane.users == 0:
                del self._lanes[key]

    def num_tenants(self) -> int:
        """Tenants holding or waiting (bounded by the requests in flight)."""
        return len({tenant for tenant, _ in self._lanes})
