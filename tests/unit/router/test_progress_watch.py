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


async def test_a_steady_stream_keeps_one_timer_and_a_late_event_still_stalls():
    gaps = asyncio.Queue()

    async def paced():
        i = 0
        while True:
            delay = await gaps.get()
            await asyncio.sleep(delay)
            yield i
            i += 1

    watch = ProgressWatch(paced(), stall_timeout_s=0.2)
    for _ in range(5):  # each event well inside the timeout: no stall, whatever the earlier timer's due time
        gaps.put_nowait(0.08)
        await watch.__anext__()
    gaps.put_nowait(5.0)
    with pytest.raises(StreamTimeout) as stalled:
        await asyncio.wait_for(watch.__anext__(), 5)
    assert stalled.value.info.reason == "replica_lost"
    assert watch._timer is None  # ended: nothing left armed


async def test_a_cancellation_from_outside_is_not_turned_into_a_timeout():
    async def silent():
        await asyncio.Event().wait()
        yield 0

    watch = ProgressWatch(silent(), stall_timeout_s=10)
    reader = asyncio.ensure_future(watch.__anext__())
    await asyncio.sleep(0.01)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert watch._timer is None


async def test_the_deadline_ends_a_wait_before_the_stall_timeout():
    import time

    async def silent():
        await asyncio.Event().wait()
        yield 0

    watch = ProgressWatch(silent(), stall_timeout_s=10, deadline_unix_s=time.time() + 0.05)
    with pytest.raises(StreamTimeout) as passed:
        await asyncio.wait_for(watch.__anext__(), 5)
    assert passed.value.info.reason == "deadline_exceeded"


async def test_a_source_that_swallows_the_expiry_leaves_no_cancellation_behind():
    async def stubborn():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass  # swallowed: the event comes anyway
        yield "late"

    watch = ProgressWatch(stubborn(), stall_timeout_s=0.02)
    assert await asyncio.wait_for(watch.__anext__(), 5) == "late"
    assert asyncio.current_task().cancelling() == 0
    await asyncio.sleep(0.01)  # nothing pending is delivered to this task now
