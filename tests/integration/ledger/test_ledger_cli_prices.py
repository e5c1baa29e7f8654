"""`sluice prices`, `sluice usage` and the key policy flags, through
cli.main against real SQLite and Postgres, reading stdout and stderr."""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal

import pytest
from ledger_factories import make_usage

from sluice.ledger import cli
from sluice.ledger.keys import KeyStore
from sluice.ledger.store import LedgerStore

DAY2 = datetime(2025, 3, 2, 9, 0, tzinfo=timezone.utc)
MARCH = ["--start", "2025-03-01", "--end", "2025-04-01"]


@pytest.fixture
def sluice(ledger_url, monkeypatch, capsys):
    """Run the CLI on the test database; returns (exit code, stdout, stderr)."""
    monkeypatch.setenv("SLUICE_DATABASE_URL", ledger_url)

    def run(*argv: str) -> tuple[int, str, str]:
        code = cli.main(list(argv))
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_prices_set_then_list(sluice, ledger_url):
    assert sluice("prices", "list") == (0, "", "no prices set\n")
    code, out, err = sluice("prices", "set", "llama-8b-v2", "--input", "0.15", "--cached-input", "0.075",
                            "--output", "0.6", "--batch-discount", "0.5")
    assert (code, out) == (0, "")
    assert "llama-8b-v2" in err
    assert sluice("prices", "set", "tiny-v1", "--input", "0", "--cached-input", "0", "--output", "1")[0] == 0
    # Setting again replaces.
    assert sluice("prices", "set", "tiny-v1", "--input", "0", "--cached-input", "0", "--output", "2")[0] == 0

    code, out, _ = sluice("prices", "list")
    assert code == 0
    header, *lines = out.splitlines()
    assert header.split() == ["model_version", "input", "cached_input", "output", "batch_discount",
                              "currency", "updated_at"]
    assert [line.split()[:6] for line in lines] == [
        ["llama-8b-v2", "0.15", "0.075", "0.6", "0.5", "USD"],
        ["tiny-v1", "0", "0", "2", "0", "USD"],
    ]
    with LedgerStore(ledger_url) as store:
        assert store.prices()["llama-8b-v2"].cached_input_per_mtok == Decimal("0.075")


@pytest.mark.parametrize("bad", [
    ["--input", "-1", "--cached-input", "0", "--output", "0"],
    ["--input", "0.0000001", "--cached-input", "0", "--output", "0"],
    ["--input", "1", "--cached-input", "0", "--output", "0", "--batch-discount", "2"],
])
def test_a_refused_price_says_why_and_writes_nothing(sluice, bad):
    code, out, err = sluice("prices", "set", "v1", *bad)
    assert (code, out) == (2, "")
    assert err.startswith("sluice: ")
    assert sluice("prices", "list")[2] == "no prices set\n"


def test_usage_prints_tokens_and_cost_per_day_and_model_with_a_total(sluice, ledger_store):
    ledger_store.set_price("alpha-v1", Decimal("1"), Decimal("0.5"), Decimal("2"),
                           batch_discount=Decimal("0.5"))
    ledger_store.write_usage([
        make_usage("a", model="alpha", model_version="alpha-v1", prompt_tokens=1000,
                   cached_tokens=400, output_tokens=1000),                      # 0.0028
        make_usage("b", model="alpha", model_version="alpha-v1", prompt_tokens=1000,
                   cached_tokens=0, output_tokens=1000, service_class="batch"),  # 0.0015
        make_usage("c", model="alpha", model_version="alpha-v1", prompt_tokens=20,
                   cached_tokens=0, output_tokens=10, finished_at=DAY2),          # 0.00004
        make_usage("d", tenant="globex", model="alpha", model_version="alpha-v1"),
    ])
    code, out, err = sluice("usage", "--tenant", "acme", *MARCH)
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        "day         model  requests  prompt  cached  output  cost (USD)",
        "2025-03-01  alpha         2    2000     400    2000      0.0043",
        "2025-03-02  alpha         1      20       0      10     0.00004",
        "total                     3    2020     400    2010     0.00434",
    ]


def test_usage_of_an_unpriced_version_shows_no_cost_and_names_it(sluice, ledger_store):
    ledger_store.set_price("alpha-v1", Decimal("1"), Decimal("1"), Decimal("1"))
    ledger_store.write_usage([
        make_usage("a", model="alpha", model_version="alpha-v1", prompt_tokens=10,
                   cached_tokens=0, output_tokens=0),
        make_usage("b", model="beta", model_version="beta-v7"),
    ])
    code, out, err = sluice("usage", "--tenant", "acme", *MARCH)
    assert code == 0
    rows = [line.split() for line in out.splitlines()[1:]]
    assert rows == [["2025-03-01", "alpha", "1", "10", "0", "0", "0.00001"],
                    ["2025-03-01", "beta", "1", "10", "4", "20", "-"],
                    ["total", "2", "20", "4", "20", "-"]]
    assert "beta-v7" in err


def test_usage_of_a_quiet_tenant_is_a_zero_total(sluice):
    code, out, _ = sluice("usage", "--tenant", "nobody", *MARCH)
    assert code == 0
    assert [line.split() for line in out.splitlines()] == [
        ["day", "model", "requests", "prompt", "cached", "output", "cost", "(USD)"],
        ["total", "0", "0", "0", "0", "0"]]


def test_usage_with_start_after_end_is_refused(sluice):
    code, out, err = sluice("usage", "--tenant", "acme", "--start", "2025-04-01", "--end", "2025-03-01")
    assert (code, out) == (2, "")
    assert "--start" in err


def test_keys_create_policy_flags(sluice, ledger_url):
    code, out, _ = sluice("keys", "create", "--tenant", "acme", "--priority", "critical",
                          "--degradable", "--allow-fallback")
    assert code == 0
    plain_code, plain_out, _ = sluice("keys", "create", "--tenant", "acme")
    assert plain_code == 0
    with LedgerStore(ledger_url) as store:
        keys = KeyStore(store)
        flagged, plain = keys.lookup(out.strip()), keys.lookup(plain_out.strip())
    assert (flagged.priority, flagged.degradable, flagged.allow_fallback) == ("critical", True, True)
    assert (plain.priority, plain.degradable, plain.allow_fallback) == ("normal", False, False)
