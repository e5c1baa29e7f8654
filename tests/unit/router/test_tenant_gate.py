"""The router's tokenization gate: one tenant's burst waits on its own
lane, so another tenant's prompt (or the same tenant's other class) is
never queued behind it."""

import asyncio

import pytest

from sluice.router.tenant_gate import TenantGate
from sluice.v1 import common_pb2


async def test_a_tenant_past_its_share_waits_while_another_goes_at_once():
    gate = TenantGate(per_tenant=2)
    release = asyncio.Event()
    holding = 0
    order: list[str] = []

    async def work(tenant: str, name: str) -> None:
        nonlocal holding
        async with gate.hold(tenant):
            order.append(name)
            if tenant == "flood":
                holding += 1
                await release.wait()

    flood = [asyncio.create_task(work("flood", f"f{i}")) for i in range(10)]
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert holding == 2  # the rest of the flood waits in its own lane
    await asyncio.wait_for(work("quiet", "q"), timeout=1.0)
    assert order == ["f0", "f1", "q"]
    release.set()
    await asyncio.gather(*flood)
    assert order[3:] == [f"f{i}" for i in range(2, 10)]  # the flood keeps its own order
    assert gate.num_tenants() == 0  # lanes go when nobody holds or waits


async def test_a_tenants_batch_burst_never_holds_back_its_own_interactive_calls():
    gate = TenantGate(per_tenant=1)
    release = asyncio.Event()

    async def batch() -> None:
        async with gate.hold("acme", common_pb2.SERVICE_CLASS_BATCH):
            await release.wait()

    burst = [asyncio.create_task(batch()) for _ in range(4)]
    await asyncio.sleep(0)
    async with asyncio.timeout(1.0):
        async with gate.hold("acme", common_pb2.SERVICE_CLASS_INTERACTIVE):
            pass  # its own lane: not behind the burst
    assert gate.num_tenants() == 1
    release.set()
    await asyncio.gather(*burst)
    assert gate.num_tenants() == 0


async def test_a_cancelled_waiter_leaves_no_lane_behind():
    gate = TenantGate(per_tenant=1)
    release = asyncio.Event()

    async def hold() -> None:
        async with gate.hold("t"):
            await release.wait()

    holder = asyncio.create_task(hold())
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    release.set()
    await holder
    assert gate.num_tenants() == 0


def test_at_least_one_per_tenant():
    with pytest.raises(ValueError):
        TenantGate(per_tenant=0)
