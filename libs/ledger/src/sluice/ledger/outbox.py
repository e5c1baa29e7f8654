"""A durable local outbox between the token stream and the ledger database.

    stream ends ──append()──> outbox.db (SQLite, WAL, synchronous=FULL)
                                   │ OutboxFlusher, a background thread:
                                   │   read a batch -> idempotent insert ->
                                   │   commit -> only then delete the batch
                                   v
                              LedgerStore (Postgres or SQLite)

`append` returns once the record is on disk (an fsync'd local commit, about
a millisecond), so the stream never waits on the network, and a database
outage only grows the outbox. Appends that arrive while a commit is on its
way to disk share the next one (group commit): streams that end together
wait for one fsync each round, not one each in a queue. A crash between the ledger commit and the
outbox delete resends the batch; both inserts are idempotent, so the ledger
still holds each record exactly once.

One outbox file per process: the file is the process's private queue. It
persists across restarts, and a restarted process drains what it left.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from sluice.ledger.records import AttemptRecord, UsageRecord
from sluice.ledger.store import LedgerStore

logger = logging.getLogger(__name__)

LedgerRecord = UsageRecord | AttemptRecord

_KIND_USAGE = "usage"
_KIND_ATTEMPT = "attempt"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id INTEGER PRIMARY KEY,  -- rowid: append order
    kind TEXT NOT NULL,
    payload TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS dead_letters (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    error TEXT NOT NULL
);
"""


@dataclass(slots=True)
class _Group:
    """Appends that share one commit; `done` once it is on disk or failed."""

    rows: list[tuple[str, str]]
    done: bool = False
    error: BaseException | None = None


@dataclass(slots=True, frozen=True)
class PendingEntry:
    id: int
    kind: str
    payload: str


def encode_record(record: LedgerRecord) -> tuple[str, str]:
    """(kind, JSON payload). Datetimes as ISO 8601 with their offset."""
    if isinstance(record, UsageRecord):
        kind = _KIND_USAGE
    elif isinstance(record, AttemptRecord):
        kind = _KIND_ATTEMPT
    else:
        raise TypeError(f"not a ledger record: {type(record).__name__}")
    fields = {k: v.isoformat() if isinstance(v, datetime) else v for k, v in asdict(record).items()}
    return kind, json.dumps(fields, separators=(",", ":"))


def decode_record(kind: str, payload: str) -> LedgerRecord:
    """Inverse of encode_record; raises ValueError (or TypeError) on bad input."""
    fields = json.loads(payload)
    if kind == _KIND_USAGE:
        fields["finished_at"] = datetime.fromisoformat(fields["finished_at"])
        return UsageRecord(**fields)
    if kind == _KIND_ATTEMPT:
        fields["at"] = datetime.fromisoformat(fields["at"])
        return AttemptRecord(**fields)
    raise ValueError(f"unknown outbox record kind {kind!r}")


class Outbox:
    """The local queue file. Thread-safe: one connection, one lock; every
    operation is a single short transaction.

    Group commit: each append joins the newest waiting group; when no
    commit is in flight, an append of the oldest group commits that whole
    group (one transaction, one fsync) while later appends gather in the
    next. An append returns only when its own group is on disk, and if that
    commit fails every append of the group raises. `max_group_records`
    bounds a group (1: a commit per append, as before group commit)."""

    def __init__(self, path: str | Path, *, max_group_records: int = 256) -> None:
        if max_group_records < 1:
            raise ValueError(f"max_group_records must be at least 1, got {max_group_records}")
        self.max_group_records = max_group_records
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions, each statement (or
        # explicit BEGIN IMMEDIATE ... COMMIT) commits on its own.
        self._connection = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=30.0)
        self._lock = threading.Lock()  # the connection
        self._groups = threading.Condition()  # guards the two below
        self._waiting: deque[_Group] = deque()  # groups to commit, oldest first; the last one gathers appends
        self._committing = False
        with self._lock:
            # WAL: a commit is one append to the log. synchronous=FULL: that
            # append is fsync'd before append() returns, so a record survives
            # a power cut, not only a process crash.
            self._connection.execute("PRAGMA journal_mode=WAL")
            self._connection.execute("PRAGMA synchronous=FULL")
            self._connection.executescript(_SCHEMA)

    def append(self, record: LedgerRecord) -> None:
        """Durably queue one record (blocking, ~1 ms: call it from a thread).
        Returns once the record is committed; raises if its commit failed."""
        row = encode_record(record)
        with self._groups:
            if not self._waiting or len(self._waiting[-1].rows) >= self.max_group_records:
                self._waiting.append(_Group([]))
            group = self._waiting[-1]
            group.rows.append(row)
            while not group.done:
                if self._committing or self._waiting[0] is not group:
                    self._groups.wait()  # a commit is on its way to disk, or an older group goes first
                    continue
                self._committing = True
                self._waiting.popleft()  # appends from now on gather in the next group
                self._groups.release()
                try:
                    group.error = self._commit(group.rows)
                except BaseException as error:  # the group must not pass for committed
                    group.error = error
                    raise
                finally:
                    self._groups.acquire()
                    self._committing = False
                    group.done = True
                    self._groups.notify_all()
        if group.error is not None:
            # Each append of the group raises its own copy; the commit's error is the cause.
            raise copy.copy(group.error) from group.error

    def _commit(self, rows: list[tuple[str, str]]) -> BaseException | None:
        """One transaction for a group's rows; the error that failed it, if any."""
        try:
            with self._transaction():
                self._connection.executemany("INSERT INTO outbox (kind, payload) VALUES (?, ?)", rows)
        except Exception as error:  # noqa: BLE001 - handed to every append of the group
            return error
        return None

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """The connection, in one write transaction: committed when the block
        ends, rolled back if it (or the COMMIT itself) fails."""
        with self._lock:
            self._connection.execute("BEGIN IMMEDIATE")
            try:
                yield
                self._connection.execute("COMMIT")
            except BaseException:
                if self._connection.in_transaction:  # a failed COMMIT can leave it open
                    self._connection.execute("ROLLBACK")
                raise

    def pending(self, limit: int) -> list[PendingEntry]:
        """The oldest `limit` queued entries, in append order."""
        with self._lock:
            rows = self._connection.execute(
                "SELECT id, kind, payload FROM outbox ORDER BY id LIMIT ?", (limit,)).fetchall()
        return [PendingEntry(id=row[0], kind=row[1], payload=row[2]) for row in rows]

    def remove(self, entry_ids: Sequence[int]) -> None:
        """Forget entries; only after the ledger has committed them."""
        if not entry_ids:
            return
        with self._transaction():
            self._connection.executemany("DELETE FROM outbox WHERE id = ?", [(entry_id,) for entry_id in entry_ids])

    def move_to_dead_letters(self, entry: PendingEntry, error: str) -> None:
        """Park an entry that can never be written (undecodable), so it does
        not block the queue; kept for a human, never dropped."""
        with self._transaction():
            self._connection.execute("INSERT INTO dead_letters (kind, payload, error) VALUES (?, ?, ?)",
                                     (entry.kind, entry.payload, error))
            self._connection.execute("DELETE FROM outbox WHERE id = ?", (entry.id,))

    def pending_count(self) -> int:
        with self._lock:
            return self._connection.execute("SELECT count(*) FROM outbox").fetchone()[0]

    def dead_letter_count(self) -> int:
        with self._lock:
            return self._connection.execute("SELECT count(*) FROM dead_letters").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._connection.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


# Backoff after a failed ledger write: doubles from the first value per
# consecutive failure up to the cap. 0.1 s rides out a connection blip; 5 s
# keeps a long outage from hammering a recovering database while still
# draining within seconds of it coming back.
MIN_BACKOFF_S = 0.1
MAX_BACKOFF_S = 5.0
# Rows per ledger transaction: big enough to drain a backlog quickly, small
# enough that one transaction stays well under a second.
BATCH_SIZE = 500
# How often an idle flusher looks for new records: the ledger lags the
# stream by at most this much when the database is healthy.
IDLE_POLL_S = 0.1


class OutboxFlusher:
    """Moves outbox entries into the LedgerStore. Run one per outbox.

    Only the flusher's own thread calls flush_once/run_forever; the
    `consecutive_failures` and `backoff_s` it writes are read by others
    (metrics) without a lock, which is fine for ints and floats.
    """

    def __init__(
        self,
        outbox: Outbox,
        store: LedgerStore,
        clock: Callable[[], float] = time.monotonic,
        batch_size: int = BATCH_SIZE,
        min_backoff_s: float = MIN_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        idle_poll_s: float = IDLE_POLL_S,
    ) -> None:
        if batch_size <= 0 or not 0 < min_backoff_s <= max_backoff_s or idle_poll_s <= 0:
            raise ValueError("need batch_size > 0, 0 < min_backoff_s <= max_backoff_s, idle_poll_s > 0")
        self._outbox = outbox
        self._store = store
        self._clock = clock
        self._batch_size = batch_size
        self._min_backoff_s = min_backoff_s
        self._max_backoff_s = max_backoff_s
        self._idle_poll_s = idle_poll_s
        self.consecutive_failures = 0
        self.backoff_s = 0.0
        self._retry_at = float("-inf")

    def pending_count(self) -> int:
        return self._outbox.pending_count()

    def flush_once(self) -> int:
        """Move everything pending now, batch by batch; returns entries moved.

        On a database error the failing batch stays queued, the flusher backs
        off, and calls before the backoff expires return 0 without trying.
        """
        if self._clock() < self._retry_at:
            return 0
        moved = 0
        while True:
            entries = self._outbox.pending(self._batch_size)
            if not entries:
                return moved
            usage, attempts, entry_ids = self._decode(entries)
            try:
                self._store.write_usage(usage)
                self._store.write_attempts(attempts)
            except Exception as exc:  # noqa: BLE001 - any failure: keep the batch, retry later
                self._record_failure(exc)
                return moved
            self._outbox.remove(entry_ids)
            self.consecutive_failures = 0
            self.backoff_s = 0.0
            moved += len(entry_ids)
            if len(entries) < self._batch_size:
                return moved

    def run_forever(self, stop_event: threading.Event) -> None:
        """Flush until `stop_event` is set, then try one last drain (unless
        backing off; whatever is left stays in the file for the next start)."""
        while not stop_event.is_set():
            self.flush_once()
            wait_s = self._idle_poll_s
            if self.consecutive_failures:
                wait_s = max(self._retry_at - self._clock(), 0.0)
            stop_event.wait(wait_s)
        self.flush_once()

    def _decode(self, entries: list[PendingEntry]
                ) -> tuple[list[UsageRecord], list[AttemptRecord], list[int]]:
        usage: list[UsageRecord] = []
        attempts: list[AttemptRecord] = []
        entry_ids: list[int] = []
        for entry in entries:
            try:
                record = decode_record(entry.kind, entry.payload)
            except (ValueError, TypeError, KeyError) as exc:
                logger.error("outbox entry %d is unreadable, moved to dead_letters: %s", entry.id, exc)
                self._outbox.move_to_dead_letters(entry, repr(exc))
                continue
            (usage if isinstance(record, UsageRecord) else attempts).append(record)  # type: ignore[arg-type]
            entry_ids.append(entry.id)
        return usage, attempts, entry_ids

    def _record_failure(self, exc: Exception) -> None:
        self.consecutive_failures += 1
        doublings = min(self.consecutive_failures - 1, 32)  # past the cap anyway; no float overflow
        self.backoff_s = min(self._max_backoff_s, self._min_backoff_s * 2.0 ** doublings)
        self._retry_at = self._clock() + self.backoff_s
        logger.warning("ledger write failed (%d in a row), retrying in %.1f s: %s",
                       self.consecutive_failures, self.backoff_s, exc)
