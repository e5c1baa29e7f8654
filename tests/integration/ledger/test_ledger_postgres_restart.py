"""A Postgres restart during a run loses nothing and bills nothing twice.

Restarts the real local cluster with pg_ctlcluster (Debian's wrapper), so it
needs to run as root or postgres on the database host; elsewhere it skips and
says why. SLUICE_TEST_SKIP_PG_RESTART=1 skips it on a shared server. The
cluster is started again in `finally` whatever happens.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time

import psycopg
import pytest
from ledger_factories import make_attempt, make_usage
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from sluice.ledger.migrate import upgrade_database
from sluice.ledger.outbox import Outbox, OutboxFlusher
from sluice.ledger.schema import Attempt, Usage
from sluice.ledger.store import LedgerStore

USAGE_RECORDS = 150
ATTEMPT_RECORDS = 50


def local_cluster(port: int) -> tuple[str, str]:
    """(version, name) of the online Debian cluster on `port`, or skip."""
    if os.environ.get("SLUICE_TEST_SKIP_PG_RESTART") == "1":
        pytest.skip("SLUICE_TEST_SKIP_PG_RESTART=1")
    if shutil.which("pg_lsclusters") is None or shutil.which("pg_ctlcluster") is None:
        pytest.skip("pg_ctlcluster not found: cannot restart Postgres from this host")
    if os.geteuid() != 0:
        pytest.skip("restarting the Postgres cluster needs root")
    listing = subprocess.run(["pg_lsclusters", "--no-header"], capture_output=True, text=True,
                             check=True).stdout
    for line in listing.splitlines():
        version, name, cluster_port, status, *_ = line.split()
        if int(cluster_port) == port and status == "online":
            return version, name
    pytest.skip(f"no online local cluster on port {port} to restart")


def pg_ctlcluster(version: str, name: str, action: str) -> None:
    subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, name, action],
                   check=True, capture_output=True, timeout=60)


def wait_until_accepting(url: str, timeout_s: float = 30.0) -> None:
    conninfo = make_url(url).set(drivername="postgresql", query={}).render_as_string(
        hide_password=False)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            psycopg.connect(conninfo, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def ensure_cluster_up(version: str, name: str, url: str) -> None:
    status = subprocess.run(["pg_lsclusters", "--no-header", version, name], capture_output=True,
                            text=True).stdout
    if "online" not in status:
        pg_ctlcluster(version, name, "start")
    wait_until_accepting(url)


def test_postgres_restart_during_a_run_loses_nothing(postgres_url, tmp_path):
    version, name = local_cluster(make_url(postgres_url).port or 5432)
    upgrade_database(postgres_url)
    store = LedgerStore(postgres_url)
    outbox = Outbox(tmp_path / "outbox.db")
    flusher = OutboxFlusher(outbox, store, idle_poll_s=0.02)
    stop = threading.Event()
    flusher_thread = threading.Thread(target=flusher.run_forever, args=(stop,))
    restart_errors: list[BaseException] = []

    def restart() -> None:
        try:
            pg_ctlcluster(version, name, "restart")
        except BaseException as exc:  # noqa: BLE001 - reported below
            restart_errors.append(exc)

    restarter = threading.Thread(target=restart)
    max_failures_seen = 0
    flusher_thread.start()
    try:
        for i in range(USAGE_RECORDS):
            outbox.append(make_usage(f"r{i:03d}"))
            if i % 3 == 0:
                outbox.append(make_attempt(f"r{i:03d}"))
            if i == USAGE_RECORDS // 4:
                restarter.start()  # appends go on while the database goes away
            max_failures_seen = max(max_failures_seen, flusher.consecutive_failures)
            time.sleep(0.01)
        restarter.join(timeout=90)
        assert restart_errors == []
        deadline = time.monotonic() + 60
        while outbox.pending_count() and time.monotonic() < deadline:
            max_failures_seen = max(max_failures_seen, flusher.consecutive_failures)
            time.sleep(0.05)
    finally:
        stop.set()
        flusher_thread.join(timeout=30)
        if restarter.is_alive():
            restarter.join(timeout=90)
        ensure_cluster_up(version, name, postgres_url)

    assert outbox.pending_count() == 0
    assert max_failures_seen > 0, "the restart never interrupted a write; the test proved nothing"
    with store.engine.connect() as connection:
        request_ids = connection.execute(select(Usage.request_id).order_by(Usage.request_id)).scalars().all()
        attempts = connection.execute(select(func.count()).select_from(Attempt)).scalar_one()
    assert request_ids == [f"r{i:03d}" for i in range(USAGE_RECORDS)]
    assert attempts == ATTEMPT_RECORDS
    outbox.close()
    store.close()
