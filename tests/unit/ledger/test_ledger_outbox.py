"""The outbox file and the flusher's retry policy, with SQLite only.

The flusher's store here is a real SQLite LedgerStore behind a switch that
makes writes fail, so the backoff schedule can be stepped with a fake clock;
outages of real databases are in tests/integration/ledger.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from sluice.ledger.migrate import upgrade_database
from sluice.ledger.outbox import Outbox, OutboxFlusher
from sluice.ledger.records import AttemptRecord, UsageRecord
from sluice.ledger.store import LedgerStore

T0 = datetime(2025, 3, 1, 12, 0, tzinfo=timezone.utc)


def make_usage(request_id: str) -> UsageRecord:
    return UsageRecord(tenant="acme", request_id=request_id, model="m", model_version="v1",
                       prompt_tokens=3, cached_tokens=0, output_tokens=5, finish_reason="stop",
                       finished_at=T0)


class SwitchableStore:
    """Delegates to a real store; raises what a dropped connection raises while `down`."""

    def __init__(self, store: LedgerStore, fail_from_call: int | None = None) -> None:
        self.store = store
        self.down = False
        self.fail_from_call = fail_from_call  # 1-based; None: only `down` fails
        self.calls = 0

    def write_usage(self, records: Sequence[UsageRecord]) -> int:
        self.calls += 1
        if self.down or (self.fail_from_call is not None and self.calls >= self.fail_from_call):
            raise OperationalError("INSERT", {}, Exception("connection refused"))
        return self.store.write_usage(records)

    def write_attempts(self, records: Sequence[AttemptRecord]) -> int:
        return self.store.write_attempts(records)


@pytest.fixture
def store(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade_database(url)
    with LedgerStore(url) as real:
        yield real


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_entries_come_back_in_append_order_and_go_when_removed(tmp_path):
    with Outbox(tmp_path / "outbox.db") as outbox:
        for i in range(5):
            outbox.append(make_usage(f"r{i}"))
        entries = outbox.pending(3)
        assert [e.id for e in entries] == sorted(e.id for e in entries)
        outbox.remove([e.id for e in entries])
        assert outbox.pending_count() == 2


def test_outbox_survives_reopening_the_file(tmp_path):
    path = tmp_path / "nested" / "outbox.db"
    with Outbox(path) as outbox:
        outbox.append(make_usage("r1"))
        outbox.append(make_usage("r2"))
    with Outbox(path) as reopened:
        assert reopened.pending_count() == 2


class CountingOutbox(Outbox):
    """Counts commits; the first one waits until `release` is set (so later appends gather behind it),
    and the group holding `poison` fails."""

    def __init__(self, path: Path, *, poison: str | None = None, **kwargs) -> None:
        super().__init__(path, **kwargs)
        self.groups: list[list[str]] = []
        self.release = threading.Event()
        self.poison = poison

    def _commit(self, rows):
        ids = [json.loads(payload)["request_id"] for _, payload in rows]
        self.groups.append(ids)
        if len(self.groups) == 1:
            assert self.release.wait(10)
        if self.poison in ids:
            return sqlite3.OperationalError("disk I/O error")
        return super()._commit(rows)


def _on_disk(path: Path) -> set[str]:
    """What another reader of the file sees: committed rows only."""
    connection = sqlite3.connect(path)
    try:
        return {json.loads(p)["request_id"] for (p,) in connection.execute("SELECT payload FROM outbox")}
    finally:
        connection.close()


def _append_all(outbox: Outbox, ids: list[str], path: Path) -> dict[str, object]:
    """Append each id from its own thread; per id, what append did: "ok" (and it was on disk by
    then) or the exception it raised."""
    results: dict[str, object] = {}

    def one(request_id: str) -> None:
        try:
            outbox.append(make_usage(request_id))
            results[request_id] = "ok" if request_id in _on_disk(path) else "returned before its commit"
        except Exception as error:  # noqa: BLE001 - the test reads it
            results[request_id] = error

    threads = [threading.Thread(target=one, args=(request_id,)) for request_id in ids]
    threads[0].start()
    deadline = time.monotonic() + 10
    while not getattr(outbox, "groups", True) and time.monotonic() < deadline:
        time.sleep(0.001)  # the first append is committing (and held there)
    for thread in threads[1:]:
        thread.start()
    time.sleep(0.05)  # the rest have joined the next group
    if hasattr(outbox, "release"):
        outbox.release.set()
    for thread in threads:
        thread.join(10)
    return results


def test_appends_that_arrive_during_a_commit_share_the_next_one(tmp_path):
    path = tmp_path / "outbox.db"
    with CountingOutbox(path) as outbox:
        ids = [f"r{i}" for i in range(20)]
        results = _append_all(outbox, ids, path)
        assert results == {request_id: "ok" for request_id in ids}
        assert outbox.groups[0] == ["r0"] and sorted(outbox.groups[1]) == sorted(ids[1:])  # two fsyncs, not 20
        assert outbox.pending_count() == 20 and _on_disk(path) == set(ids)


def test_a_failed_commit_fails_every_append_of_its_group_and_no_other(tmp_path):
    path = tmp_path / "outbox.db"
    with CountingOutbox(path, poison="r7") as outbox:
        ids = [f"r{i}" for i in range(12)]
        results = _append_all(outbox, ids, path)
        assert results["r0"] == "ok"
        failed = {request_id for request_id, result in results.items() if result != "ok"}
        assert failed == set(ids[1:])  # the whole second group, and nothing it held reached the file
        assert all(isinstance(results[request_id], sqlite3.OperationalError) for request_id in failed)
        assert len({id(results[request_id]) for request_id in failed}) == len(failed)  # each its own copy
        assert _on_disk(path) == {"r0"}
        outbox.append(make_usage("after"))  # the outbox goes on working
        assert _on_disk(path) == {"r0", "after"}


def test_a_group_is_bounded(tmp_path):
    path = tmp_path / "outbox.db"
    with CountingOutbox(path, max_group_records=4) as outbox:
        ids = [f"r{i}" for i in range(11)]
        results = _append_all(outbox, ids, path)
        assert results == {request_id: "ok" for request_id in ids}
        assert [len(group) for group in outbox.groups] == [1, 4, 4, 2]
    with pytest.raises(ValueError, match="max_group_records"):
        Outbox(tmp_path / "other.db", max_group_records=0)


def test_outbox_file_is_wal_with_full_sync(tmp_path):
    with Outbox(tmp_path / "outbox.db") as outbox:
        with outbox._lock:  # reading the live connection's settings
            journal = outbox._connection.execute("PRAGMA journal_mode").fetchone()[0]
            synchronous = outbox._connection.execute("PRAGMA synchronous").fetchone()[0]
    assert (journal, synchronous) == ("wal", 2)  # 2 == FULL


def test_backoff_doubles_per_failure_up_to_the_cap(tmp_path, store):
    flaky, clock = SwitchableStore(store), FakeClock()
    with Outbox(tmp_path / "outbox.db") as outbox:
        outbox.append(make_usage("r1"))
        flusher = OutboxFlusher(outbox, flaky, clock=clock)  # type: ignore[arg-type]
        flaky.down = True
        backoffs = []
        for _ in range(8):
            assert flusher.flush_once() == 0
            backoffs.append(flusher.backoff_s)
            clock.now += flusher.backoff_s
        assert backoffs == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
        assert outbox.pending_count() == 1


def test_no_retry_before_the_backoff_expires_and_recovery_resets_it(tmp_path, store):
    flaky, clock = SwitchableStore(store), FakeClock()
    with Outbox(tmp_path / "outbox.db") as outbox:
        outbox.append(make_usage("r1"))
        flusher = OutboxFlusher(outbox, flaky, clock=clock)  # type: ignore[arg-type]
        flaky.down = True
        flusher.flush_once()
        flaky.down = False
        calls = flaky.calls
        clock.now += 0.05  # inside the 0.1 s backoff
        assert flusher.flush_once() == 0 and flaky.calls == calls
        clock.now += 0.05
        assert flusher.flush_once() == 1
        assert (flusher.consecutive_failures, flusher.backoff_s, outbox.pending_count()) == (0, 0.0, 0)


def test_a_failed_batch_stays_and_earlier_batches_stay_moved(tmp_path, store):
    flaky, clock = SwitchableStore(store, fail_from_call=2), FakeClock()
    with Outbox(tmp_path / "outbox.db") as outbox:
        for i in range(5):
            outbox.append(make_usage(f"r{i}"))
        flusher = OutboxFlusher(outbox, flaky, clock=clock, batch_size=2)  # type: ignore[arg-type]
        assert flusher.flush_once() == 2
        assert outbox.pending_count() == 3


def test_invalid_tuning_is_refused(tmp_path, store):
    with Outbox(tmp_path / "outbox.db") as outbox:
        with pytest.raises(ValueError):
            OutboxFlusher(outbox, store, min_backoff_s=6.0, max_backoff_s=5.0)
