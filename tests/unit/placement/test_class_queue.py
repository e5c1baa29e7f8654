from sluice.placement.class_queue import ClassQueue, QueueEntry
from sluice.placement.vtc import VirtualTokenCounters

from placement_factories import make_ask


def entry(request_id: str, tenant: str, *, at: float = 0.0, blocks: int = 10, is_long: bool = False) -> QueueEntry:
    return QueueEntry(make_ask(request_id, tenant=tenant), at, at + 10.0, blocks, 60, is_long)


def test_fifo_per_tenant_smallest_counter_first():
    counters = VirtualTokenCounters()
    queue = ClassQueue(counters)
    for e in (entry("a1", "a"), entry("a2", "a"), entry("b1", "b"), entry("b2", "b")):
        queue.push(e)
    counters.counters.update(a=100.0, b=0.0)
    assert len(queue) == 4 and "a2" in queue and "zz" not in queue
    assert queue.next_entry(lambda e: True).ask.request_id == "b1"
    queue.remove("b1")
    assert queue.next_entry(lambda e: True).ask.request_id == "b2"


def test_push_lifts_a_newly_backlogged_tenant():
    counters = VirtualTokenCounters(counters={"a": 500.0, "b": 0.0})
    queue = ClassQueue(counters)
    queue.push(entry("a1", "a"))
    queue.push(entry("b1", "b"))
    assert counters.counters["b"] == 500.0
    queue.push(entry("b2", "b"))  # already backlogged: not lifted again
    counters.counters["a"] = 900.0
    queue.push(entry("b3", "b"))
    assert counters.counters["b"] == 500.0


def test_entries_that_may_not_go_are_skipped_not_their_tenant():
    counters = VirtualTokenCounters()
    queue = ClassQueue(counters)
    for e in (entry("a1", "a", is_long=True), entry("a2", "a"), entry("a3", "a"), entry("b1", "b", is_long=True)):
        queue.push(e)
    short_only = lambda e: not e.is_long  # noqa: E731
    assert queue.next_entry(short_only).ask.request_id == "a2"  # a's oldest that may go
    assert queue.next_entry(lambda e: True).ask.request_id == "a1"
    counters.counters["a"] = 50.0
    assert queue.next_entry(lambda e: True).ask.request_id == "b1"
    assert queue.next_entry(short_only).ask.request_id == "a2"  # b has nothing that may go
    assert queue.next_entry(lambda e: False) is None


def test_remove_keeps_the_accounting():
    queue = ClassQueue(VirtualTokenCounters())
    queue.push(entry("a1", "a", at=3.0, blocks=7))
    queue.push(entry("a2", "a", at=4.0, blocks=5))
    queue.push(entry("b1", "b", at=1.0, blocks=2))
    assert queue.kv_blocks == 14 and queue.oldest_enqueued_s() == 1.0
    assert queue.tenant_work() == {"a": (2, 12), "b": (1, 2)}
    assert queue.remove("b1").ask.request_id == "b1"
    assert queue.remove("b1") is None
    assert queue.oldest_enqueued_s() == 3.0
    queue.remove("a1")
    queue.remove("a2")
    assert (len(queue), queue.kv_blocks, queue.tenant_work(), queue.oldest_enqueued_s()) == (0, 0, {}, None)
    assert not queue
