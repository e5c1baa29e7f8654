import asyncio

from sluice.gateway.heartbeat import with_heartbeat


async def _slow(items, delay_s):
    for item in items:
        await asyncio.sleep(delay_s)
        yield item


async def test_heartbeats_fill_silences_without_losing_items():
    seen = [item async for item in with_heartbeat(_slow([1, 2], 0.25), interval_s=0.1)]
    assert [i for i in seen if i is not None] == [1, 2]
    assert seen.count(None) >= 2


async def test_fast_streams_get_no_heartbeats():
    assert [item async for item in with_heartbeat(_slow([1, 2, 3], 0), interval_s=1)] == [1, 2, 3]


async def test_closing_early_cancels_the_pending_read():
    cancelled = asyncio.Event()

    async def endless():
        try:
            yield 1
            await asyncio.sleep(60)
            yield 2
        finally:
            cancelled.set()

    source = endless()
    stream = with_heartbeat(source, interval_s=0.05)
    assert await stream.__anext__() == 1
    assert await stream.__anext__() is None
    await stream.aclose()
    await asyncio.wait_for(cancelled.wait(), timeout=1)  # the source saw the cancellation


async def test_a_failing_source_raises_its_error_to_the_consumer():
    async def failing():
        yield 1
        raise ConnectionError("router went away")

    stream = with_heartbeat(failing(), interval_s=1)
    assert await stream.__anext__() == 1
    try:
        await stream.__anext__()
    except ConnectionError as error:
        assert str(error) == "router went away"
    else:
        raise AssertionError("the source's error was swallowed")


async def test_items_arriving_just_under_the_interval_get_no_heartbeats():
    seen = [item async for item in with_heartbeat(_slow([1, 2, 3, 4], 0.06), interval_s=0.1)]
    assert seen == [1, 2, 3, 4]


async def test_a_consumer_that_stops_leaves_the_rest_in_the_source():
    pulled = 0

    async def ready(n):
        nonlocal pulled
        for i in range(n):
            pulled += 1
            yield i

    stream = with_heartbeat(ready(1000), interval_s=60)
    assert await anext(stream) == 0
    for _ in range(20):
        await asyncio.sleep(0)  # the pump runs as far as it may
    assert pulled <= 3  # one item ahead, no queue of its own behind a stalled consumer
    await stream.aclose()


class _Woken:
    """A Wakeable source shaped like the router session's RequestEvents:
    a queue of items, and wake() makes a pending read return None."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.tasks_at_start = len(asyncio.all_tasks())

    def wake(self) -> None:
        if self.queue.empty():
            self.queue.put_nowait(None)

    def __aiter__(self):
        return self

    async def __anext__(self):
        item = await self.queue.get()
        if item == "end":
            raise StopAsyncIteration
        return item


async def test_a_wakeable_source_is_read_without_a_pump_task_and_gets_heartbeats():
    source = _Woken()
    stream = with_heartbeat(source, interval_s=0.05)
    source.queue.put_nowait(1)
    assert await stream.__anext__() == 1
    assert len(asyncio.all_tasks()) == source.tasks_at_start  # read in the consumer's own task
    assert await asyncio.wait_for(stream.__anext__(), 1) is None  # the silence got a heartbeat
    source.queue.put_nowait(2)
    source.queue.put_nowait("end")
    assert [item async for item in stream if item is not None] == [2]
