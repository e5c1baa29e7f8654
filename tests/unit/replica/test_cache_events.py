"""CacheEventLog: snapshots, deltas as net state, and falling behind."""

import threading

from sluice.engine.block_hash import BlockHash
from sluice.engine.block_manager import CacheEvent, CacheEventKind
from sluice.replica.cache_events import CacheEventLog


def h(i: int) -> BlockHash:
    return BlockHash(bytes([i]) * 16)


def stored(*ids: int) -> list[CacheEvent]:
    return [CacheEvent(CacheEventKind.STORED, h(i)) for i in ids]


def evicted(*ids: int) -> list[CacheEvent]:
    return [CacheEvent(CacheEventKind.EVICTED, h(i)) for i in ids]


class Subscriber:
    """Applies what it reads the way the cluster scheduler's index will."""

    def __init__(self, log: CacheEventLog) -> None:
        self.log, self.cursor, self.view, self.snapshots = log, None, set(), 0

    def read(self):
        delta = self.log.read_since(self.cursor)
        self.cursor = delta.cursor
        if delta.snapshot:
            self.snapshots += 1
            self.view = set(delta.stored_block_hashes)
            assert not delta.evicted_block_hashes
        else:
            assert not set(delta.stored_block_hashes) & set(delta.evicted_block_hashes)
            self.view |= set(delta.stored_block_hashes)
            self.view -= set(delta.evicted_block_hashes)
        return delta


def test_first_read_is_a_snapshot_then_deltas():
    log = CacheEventLog(max_events=16)
    log.record(stored(1, 2))
    sub = Subscriber(log)
    first = sub.read()
    assert first.snapshot and set(first.stored_block_hashes) == {h(1), h(2)}
    log.record(stored(3) + evicted(1))
    delta = sub.read()
    assert not delta.snapshot
    assert delta.stored_block_hashes == (h(3),) and delta.evicted_block_hashes == (h(1),)
    empty = sub.read()
    assert (empty.snapshot, empty.stored_block_hashes, empty.evicted_block_hashes) == (False, (), ())


def test_a_hash_stored_evicted_and_stored_again_ends_up_stored():
    log = CacheEventLog(max_events=16)
    sub = Subscriber(log)
    sub.read()
    log.record(stored(5))
    log.record(evicted(5))
    log.record(stored(5))
    delta = sub.read()
    assert delta.stored_block_hashes == (h(5),) and delta.evicted_block_hashes == ()
    log.record(evicted(5))
    log.record(stored(5))
    log.record(evicted(5))
    delta = sub.read()
    assert delta.stored_block_hashes == () and delta.evicted_block_hashes == (h(5),)
    assert sub.view == set() == log.cached_block_hashes()


def test_a_subscriber_behind_the_history_gets_a_snapshot_of_the_true_set():
    log = CacheEventLog(max_events=3)
    fast, slow = Subscriber(log), Subscriber(log)
    fast.read()
    slow.read()
    for i in range(10):
        log.record(stored(i) + (evicted(i - 2) if i >= 2 else []))
        fast.read()  # at most 2 events per read: it keeps up
    assert fast.snapshots == 1 and fast.view == log.cached_block_hashes() == {h(8), h(9)}
    delta = slow.read()
    assert delta.snapshot and set(delta.stored_block_hashes) == {h(8), h(9)}
    assert slow.snapshots == 2
    log.record(stored(20))
    assert not slow.read().snapshot and slow.view == {h(8), h(9), h(20)}


def test_readers_on_other_threads_converge_on_the_true_set():
    log = CacheEventLog(max_events=64)
    subscribers = [Subscriber(log) for _ in range(4)]
    done = threading.Event()

    def follow(sub):
        while not done.is_set():
            sub.read()

    threads = [threading.Thread(target=follow, args=(s,)) for s in subscribers]
    for t in threads:
        t.start()
    for i in range(2_100):  # ends with 0..99 stored
        log.record(stored(i % 200) if i % 400 < 200 else evicted(i % 200))
    done.set()
    for t in threads:
        t.join()
    for sub in subscribers:
        sub.read()
        assert sub.view == log.cached_block_hashes()
