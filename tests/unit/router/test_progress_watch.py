"""ProgressWatch times only the wait for the next event: what the consumer
does between events never counts, and a TimeoutError that is not its own
passes through as it was raised."""

import asyncio

import pytest

from sluice.router.progress_watch import ProgressWatch, StreamTimeout


async def ready_events(count: int):
    for i in range(count):
        yield i


async def test_the_consumers_own_time_between_events_is_not_a_stall():
    received = []
    async for event in ProgressWatch(ready_events(3), stall_timeout_s=0.05):
        received.append(event)
        await asyncio.sleep(0.15)  # three stall timeouts of work per event
    assert received == [0, 1, 2]


async def test_a_source_that_waits_past_the_timeout_is_a_stall_and_its_own_timeout_error_passes():
    async def silent():
        await asyncio.Event().wait()
        yield 0

    with pytest.raises(StreamTimeout) as stalled:
        await asyncio.wait_for(anext(ProgressWatch(silent(), stall_timeout_s=0.05)), 5)
    assert stalled.value.info.reason == "replica_lost"

    async def raises_timeout():
        raise TimeoutError("the source's own")
        yield 0

    with pytest.raises(TimeoutError, match="the source's own"):
        await anext(ProgressWatch(raises_timeout(), stall_timeout_s=5.0))
