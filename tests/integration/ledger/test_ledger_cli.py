"""The `sluice` console script, run for real as a subprocess: stdout carries
the new key and nothing else, so `KEY=$(sluice keys create ...)` works."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from sluice.ledger.keys import KeyStore
from sluice.ledger.store import LedgerStore

KEY_LINE = re.compile(r"sk-sluice-[A-Za-z0-9_-]{43}\n")
SLUICE = Path(sys.executable).with_name("sluice")


def run_cli(*args: str, cwd: Path, database_url: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("SLUICE_DATABASE_URL", None)
    if database_url is not None:
        env["SLUICE_DATABASE_URL"] = database_url
    return subprocess.run([str(SLUICE), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)


def test_keys_create_prints_only_the_key_then_revoke(ledger_url, tmp_path):
    created = run_cli("keys", "create", "--tenant", "acme", "--tokens-per-minute", "500",
                      "--max-concurrency", "3", "--admin", cwd=tmp_path, database_url=ledger_url)
    assert created.returncode == 0, created.stderr
    assert KEY_LINE.fullmatch(created.stdout), repr(created.stdout)
    key = created.stdout.strip()

    with LedgerStore(ledger_url) as store:
        record = KeyStore(store).lookup(key)
    assert record is not None
    assert (record.tenant, record.is_admin, record.tokens_per_minute, record.max_concurrency) == (
        "acme", True, 500, 3)

    revoked = run_cli("keys", "revoke", key, cwd=tmp_path, database_url=ledger_url)
    assert (revoked.returncode, revoked.stdout) == (0, "")
    with LedgerStore(ledger_url) as store:
        assert KeyStore(store).lookup(key) is None


def test_default_database_is_a_sqlite_file_under_the_working_directory(tmp_path):
    upgraded = run_cli("db", "upgrade", cwd=tmp_path, database_url=None)
    assert upgraded.returncode == 0, upgraded.stderr
    assert upgraded.stdout == ""
    assert (tmp_path / ".sluice" / "ledger.db").is_file()

    again = run_cli("keys", "revoke", "sk-sluice-unknown", cwd=tmp_path, database_url=None)
    assert again.returncode == 1 and again.stdout == ""
