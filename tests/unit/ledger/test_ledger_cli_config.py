"""Where the CLI finds its database, and what its parser accepts."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

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


def test_create_parses_the_overload_policy():
    args = build_parser().parse_args(["keys", "create", "--tenant", "acme"])
    assert (args.priority, args.degradable, args.allow_fallback) == ("normal", False, False)
    args = build_parser().parse_args(
        ["keys", "create", "--tenant", "acme", "--priority", "critical", "--degradable", "--allow-fallback"])
    assert (args.priority, args.degradable, args.allow_fallback) == ("critical", True, True)


def test_prices_set_parses_decimals_without_a_float():
    args = build_parser().parse_args(
        ["prices", "set", "v1", "--input", "0.1", "--cached-input", "0.05", "--output", "0.3"])
    assert (args.model_version, args.input, args.cached_input, args.output, args.batch_discount,
            args.currency) == ("v1", Decimal("0.1"), Decimal("0.05"), Decimal("0.3"), 0, "USD")
    assert str(args.input) == "0.1"  # not 0.1000000000000000055511151231257827


def test_usage_reads_a_date_as_utc_midnight():
    args = build_parser().parse_args(["usage", "--tenant", "acme", "--start", "2025-03-01"])
    assert args.start == datetime(2025, 3, 1, tzinfo=timezone.utc)
    assert args.end is None


@pytest.mark.parametrize("argv", [
    ["keys", "create"],
    ["keys", "create", "--tenant", "acme", "--priority", "urgent"],
    ["prices", "set", "v1", "--input", "cheap", "--cached-input", "0", "--output", "0"],
    ["prices", "set", "v1", "--input", "1", "--output", "1"],
    ["usage"],
    ["usage", "--tenant", "acme", "--start", "yesterday"],
    ["keys", "create", "--tenant", "acme", "--max-concurrency", "0"],
    ["keys"],
    ["db", "downgrade"],
])
def test_bad_invocations_exit_with_usage(argv):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
