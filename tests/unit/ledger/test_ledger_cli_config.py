"""Where the CLI finds its database, and what its parser accepts."""

from __future__ import annotations

import pytest

from sluice.ledger.cli import build_parser
from sluice.ledger.database import resolve_database_url


def test_unset_url_means_sqlite_under_dot_sluice(tmp_path):
    url = resolve_database_url({}, tmp_path)
    assert url == f"sqlite:///{(tmp_path / '.sluice' / 'ledger.db').resolve()}"
    assert (tmp_path / ".sluice").is_dir()


def test_environment_url_wins(tmp_path):
    url = "postgresql+psycopg://u@db:5432/sluice"
    assert resolve_database_url({"SLUICE_DATABASE_URL": url}, tmp_path) == url
    assert not (tmp_path / ".sluice").exists()


def test_create_parses_limits():
    args = build_parser().parse_args(
        ["keys", "create", "--tenant", "acme", "--tokens-per-minute", "100",
         "--requests-per-minute", "5", "--max-concurrency", "2", "--admin"])
    assert (args.tenant, args.tokens_per_minute, args.requests_per_minute,
            args.max_concurrency, args.admin) == ("acme", 100, 5, 2, True)


@pytest.mark.parametrize("argv", [
    ["keys", "create"],
    ["keys", "create", "--tenant", "acme", "--max-concurrency", "0"],
    ["keys"],
    ["db", "downgrade"],
])
def test_bad_invocations_exit_with_usage(argv):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
