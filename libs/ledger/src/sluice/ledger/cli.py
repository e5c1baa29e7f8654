"""`sluice`: operator commands for the ledger database.

    sluice db upgrade
    sluice keys create --tenant NAME [--tokens-per-minute N]
                       [--requests-per-minute N] [--max-concurrency N] [--admin]
                       [--priority normal|critical] [--degradable] [--allow-fallback]
    sluice keys revoke KEY
    sluice prices set MODEL_VERSION --input X --cached-input Y --output Z
                      [--batch-discount D] [--currency USD]
    sluice prices list
    sluice usage --tenant NAME [--start ISO] [--end ISO]
    sluice sim ...      the simulator (sluice.sim.cli; `sluice sim --help`)
    sluice plan ...     the capacity planner (sluice.sim.plan_cli)
    sluice top ...      a live terminal view of the fleet's /metrics (sluice.top.cli)
    sluice rollout ...  model version upgrades in gated steps (sluice.rollout.cli)

The database is SLUICE_DATABASE_URL, or `.sluice/ledger.db` under the current
directory. Every command migrates first, so a fresh database just works.
`keys create` prints the new key and nothing else on stdout, so
`KEY=$(sluice keys create --tenant acme)` captures exactly the key;
`prices list` and `usage` print a table on stdout; everything else goes to
stderr. Prices are per million tokens in the currency's major unit.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from decimal import Decimal, InvalidOperation
from pathlib import Path

from sluice.ledger.database import resolve_database_url
from sluice.ledger.keys import KEY_PRIORITIES, KeyStore
from sluice.ledger.migrate import upgrade_database
from sluice.ledger.pricing import MONEY, money_text
from sluice.ledger.records import UsageRow
from sluice.ledger.store import LedgerStore
from sluice.ledger.summary import ledger_currency

# `sluice usage` without --start: the same 30 days GET /v1/usage defaults to.
DEFAULT_USAGE_WINDOW = timedelta(days=30)


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _decimal(text: str) -> Decimal:
    # Parsed straight from the text, never through a float.
    try:
        return Decimal(text)
    except InvalidOperation:
        raise argparse.ArgumentTypeError(f"must be a decimal number, got {text!r}") from None


def _instant(text: str) -> datetime:
    """ISO 8601 (a date alone is its midnight); without an offset, UTC."""
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an ISO 8601 date or time, got {text!r}") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description="Sluice ledger administration")
    commands = parser.add_subparsers(dest="group", required=True)

    db = commands.add_parser("db", help="ledger database schema")
    db_commands = db.add_subparsers(dest="command", required=True)
    db_commands.add_parser("upgrade", help="apply all migrations (idempotent)")

    keys = commands.add_parser("keys", help="API keys")
    key_commands = keys.add_subparsers(dest="command", required=True)
    create = key_commands.add_parser("create", help="mint a key; prints it once, alone, on stdout")
    create.add_argument("--tenant", required=True, help="tenant name (created if new)")
    create.add_argument("--tokens-per-minute", type=_positive_int, default=None)
    create.add_argument("--requests-per-minute", type=_positive_int, default=None)
    create.add_argument("--max-concurrency", type=_positive_int, default=None)
    create.add_argument("--admin", action="store_true", help="make the tenant an admin tenant")
    create.add_argument("--priority", choices=KEY_PRIORITIES, default="normal",
                        help="critical keys are shed last under overload")
    create.add_argument("--degradable", action="store_true",
                        help="overload control may cap this key's output")
    create.add_argument("--allow-fallback", action="store_true",
                        help="under overload, a smaller fallback model version may serve this key")
    revoke = key_commands.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key")

    prices = commands.add_parser("prices", help="per-model-version prices, per million tokens")
    price_commands = prices.add_subparsers(dest="command", required=True)
    set_price = price_commands.add_parser("set", help="create or replace a model version's price")
    set_price.add_argument("model_version")
    set_price.add_argument("--input", type=_decimal, required=True, help="per million uncached prompt tokens")
    set_price.add_argument("--cached-input", type=_decimal, required=True,
                           help="per million prompt tokens served from the prefix cache")
    set_price.add_argument("--output", type=_decimal, required=True, help="per million output tokens")
    set_price.add_argument("--batch-discount", type=_decimal, default=Decimal(0),
                           help="fraction taken off batch requests, 0..1 (0.5: batch costs half)")
    set_price.add_argument("--currency", default="USD", help="ISO 4217 code; one for the whole ledger")
    price_commands.add_parser("list", help="print every price")

    usage = commands.add_parser("usage", help="a tenant's tokens and cost per day and model")
    usage.add_argument("--tenant", required=True)
    usage.add_argument("--start", type=_instant, default=None, help="ISO 8601; default 30 days before end")
    usage.add_argument("--end", type=_instant, default=None, help="ISO 8601, exclusive; default now")
    return parser


# Commands of other distributions that `sluice` hands their arguments to,
# so one console script serves the operator (ledger) and the planner (sim)
# without the ledger depending on the simulator.
DELEGATED = {"sim": "sluice.sim.cli", "plan": "sluice.sim.plan_cli", "top": "sluice.top.cli",
             "rollout": "sluice.rollout.cli"}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        try:
            module = importlib.import_module(DELEGATED[argv[0]])
        except ModuleNotFoundError:
            distribution = DELEGATED[argv[0]].split(".")[1]  # sluice.sim.cli -> sim
            print(f"sluice {argv[0]}: install the sluice-{distribution} distribution (libs/{distribution})",
                  file=sys.stderr)
            return 2
        return module.main(argv[1:])
    args = build_parser().parse_args(argv)
    url = resolve_database_url(os.environ, Path.cwd())
    upgrade_database(url)
    if args.group == "db":
        print("ledger database is at the latest revision", file=sys.stderr)
        return 0

    store = LedgerStore(url)
    try:
        if args.group == "keys":
            return _keys(store, args)
        if args.group == "prices":
            return _prices(store, args)
        return _usage(store, args)
    except ValueError as error:  # a refused price or range: say why, no traceback
        print(f"sluice: {error}", file=sys.stderr)
        return 2
    finally:
        store.close()


def _keys(store: LedgerStore, args: argparse.Namespace) -> int:
    keys = KeyStore(store)
    if args.command == "create":
        key = keys.create_key(
            args.tenant,
            tokens_per_minute=args.tokens_per_minute,
            requests_per_minute=args.requests_per_minute,
            max_concurrency=args.max_concurrency,
            is_admin=args.admin,
            priority=args.priority,
            degradable=args.degradable,
            allow_fallback=args.allow_fallback,
        )
        print(key)
        return 0
    if keys.revoke_key(args.key):
        print("revoked", file=sys.stderr)
        return 0
    print("no active key matches", file=sys.stderr)
    return 1


def _prices(store: LedgerStore, args: argparse.Namespace) -> int:
    if args.command == "set":
        price = store.set_price(args.model_version, args.input, args.cached_input, args.output,
                                batch_discount=args.batch_discount, currency=args.currency)
        print(f"price of {price.model_version} set", file=sys.stderr)
        return 0
    prices = store.prices()
    if not prices:
        print("no prices set", file=sys.stderr)
        return 0
    header = ["model_version", "input", "cached_input", "output", "batch_discount", "currency", "updated_at"]
    body = [
        [p.model_version, money_text(p.input_per_mtok), money_text(p.cached_input_per_mtok),
         money_text(p.output_per_mtok), money_text(p.batch_discount), p.currency,
         p.updated_at.isoformat(timespec="seconds") if p.updated_at else "-"]
        for p in prices.values()
    ]
    print("\n".join(format_table(header, body, numeric_columns={1, 2, 3, 4})))
    return 0


def _usage(store: LedgerStore, args: argparse.Namespace) -> int:
    end = args.end or datetime.now(timezone.utc)
    start = args.start or end - DEFAULT_USAGE_WINDOW
    if start > end:
        raise ValueError("--start must not be after --end")
    rows = store.usage_summary(args.tenant, start, end, group_by="model_day")
    currency = ledger_currency(store.prices())
    print("\n".join(usage_table(rows, currency)))
    unpriced = sorted({version for row in rows for version in row.unpriced_versions})
    if unpriced:
        print(f"no price for {', '.join(unpriced)}: their rows and the total have no cost "
              "(sluice prices set VERSION ...)", file=sys.stderr)
    return 0


def usage_table(rows: Sequence[UsageRow], currency: str) -> list[str]:
    """Rows per (day, model) and a total line; '-' where a cost is unknown."""
    header = ["day", "model", "requests", "prompt", "cached", "output", f"cost ({currency})"]
    body = [
        [row.day.isoformat() if row.day else "-", row.model or "-", str(row.requests),
         str(row.prompt_tokens), str(row.cached_tokens), str(row.output_tokens), _cost_text(row.cost)]
        for row in rows
    ]
    total_cost: Decimal | None = Decimal(0)
    for row in rows:
        # MONEY, not the default 28-digit context: a sum either stays exact or raises.
        total_cost = None if total_cost is None or row.cost is None else MONEY.add(total_cost, row.cost)
    body.append(["total", "", str(sum(r.requests for r in rows)), str(sum(r.prompt_tokens for r in rows)),
                 str(sum(r.cached_tokens for r in rows)), str(sum(r.output_tokens for r in rows)),
                 _cost_text(total_cost)])
    return format_table(header, body, numeric_columns={2, 3, 4, 5, 6})


def _cost_text(cost: Decimal | None) -> str:
    return "-" if cost is None else money_text(cost)


def format_table(header: list[str], body: list[list[str]], numeric_columns: set[int]) -> list[str]:
    """Plain aligned columns, two spaces apart; numbers right-aligned."""
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = []
    for line in [header, *body]:
        cells = [cell.rjust(widths[i]) if i in numeric_columns else cell.ljust(widths[i])
                 for i, cell in enumerate(line)]
        lines.append("  ".join(cells).rstrip())
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
