"""Outbox -> ledger against real databases: records move, an unreachable
database loses nothing, and a restarted process drains what it left."""

from __future__ import annotations

import socket
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from ledger_factories import make_attempt, make_usage
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from sluice.ledger.outbox import Outbox, OutboxFlusher
from sluice.ledger.schema import Attempt, Usage
from sluice.ledger.store import LedgerStore


def rows(store: LedgerStore, model: type) -> int:
    with store.engine.connect() as connection:
        return connection.execute(select(func.count()).select_from(model)).scalar_one()


def billed_request_ids(store: LedgerStore) -> list[str]:
    with store.engine.connect() as connection:
        return sorted(connection.execute(select(Usage.request_id)).scalars())


def unreachable_url(ledger_url: str, tmp_path: Path) -> str:
    """The same kind of database, somewhere it cannot be reached."""
    if ledger_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'no-such-dir' / 'ledger.db'}"
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    return make_url(ledger_url).set(port=closed_port).render_as_string(hide_password=False)


def test_flusher_moves_every_record_once(ledger_store, tmp_path):
    with Outbox(tmp_path / "outbox.db") as outbox:
        for i in range(120):
            outbox.append(make_usage(f"r{i:04d}"))
        outbox.append(make_attempt("r0000"))
        flusher = OutboxFlusher(outbox, ledger_store, batch_size=50)  # three batches
        assert flusher.flush_once() == 121
        assert outbox.pending_count() == 0
        assert flusher.flush_once() == 0
    assert rows(ledger_store, Usage) == 120
    assert rows(ledger_store, Attempt) == 1


def test_outage_keeps_records_until_the_database_is_back(ledger_store, ledger_url, tmp_path):
    outbox_path = tmp_path / "outbox.db"
    outbox = Outbox(outbox_path)
    down = LedgerStore(unreachable_url(ledger_url, tmp_path))
    fake_now = [0.0]
    flusher = OutboxFlusher(outbox, down, clock=lambda: fake_now[0])
    for i in range(20):
        outbox.append(make_usage(f"r{i:02d}"))
        outbox.append(make_attempt(f"r{i:02d}"))
        assert flusher.flush_once() == 0
        fake_now[0] += 10.0  # past any backoff: every append meets the outage
    assert outbox.pending_count() == 40
    assert flusher.consecutive_failures == 20 and flusher.backoff_s == 5.0
    down.close()
    outbox.close()

    # The process "restarts": a new Outbox on the same file, a healthy store.
    with Outbox(outbox_path) as reopened:
        assert reopened.pending_count() == 40
        assert OutboxFlusher(reopened, ledger_store).flush_once() == 40
        assert reopened.pending_count() == 0
    assert billed_request_ids(ledger_store) == [f"r{i:02d}" for i in range(20)]
    assert rows(ledger_store, Attempt) == 20


def test_a_batch_resent_after_its_commit_is_not_double_counted(ledger_store, tmp_path):
    # A crash after the ledger commit but before the outbox delete resends
    # the batch on restart.
    usage, attempt = make_usage("r1"), make_attempt("r1")
    ledger_store.write_usage([usage])
    ledger_store.write_attempts([attempt])
    with Outbox(tmp_path / "outbox.db") as outbox:
        outbox.append(usage)
        outbox.append(attempt)
        assert OutboxFlusher(outbox, ledger_store).flush_once() == 2
    assert rows(ledger_store, Usage) == 1
    assert rows(ledger_store, Attempt) == 1


def test_background_thread_drains_while_records_keep_coming(ledger_store, tmp_path):
    with Outbox(tmp_path / "outbox.db") as outbox:
        flusher = OutboxFlusher(outbox, ledger_store, idle_poll_s=0.01)
        stop = threading.Event()
        thread = threading.Thread(target=flusher.run_forever, args=(stop,))
        thread.start()
        try:
            for i in range(100):
                outbox.append(make_usage(f"r{i:03d}"))
            deadline = time.monotonic() + 30
            while outbox.pending_count() and time.monotonic() < deadline:
                time.sleep(0.02)
        finally:
            stop.set()
            thread.join(timeout=30)
        assert not thread.is_alive()
        assert outbox.pending_count() == 0
    assert rows(ledger_store, Usage) == 100


@pytest.mark.parametrize("payload", ["{not json", '{"tenant": "acme"}'])
def test_an_unreadable_entry_is_parked_not_blocking(ledger_store, tmp_path, payload):
    with Outbox(tmp_path / "outbox.db") as outbox:
        outbox.append(make_usage("before"))
        # A record written by some incompatible version, through a side door.
        with sqlite3.connect(outbox.path) as other:
            other.execute("INSERT INTO outbox (kind, payload) VALUES ('usage', ?)", (payload,))
        outbox.append(make_usage("after"))
        assert OutboxFlusher(outbox, ledger_store).flush_once() == 2
        assert (outbox.pending_count(), outbox.dead_letter_count()) == (0, 1)
    assert billed_request_ids(ledger_store) == ["after", "before"]
