"""`sluice`: operator commands for the ledger database.

    sluice db upgrade
    sluice keys create --tenant NAME [--tokens-per-minute N]
                       [--requests-per-minute N] [--max-concurrency N] [--admin]
    sluice keys revoke KEY

The database is SLUICE_DATABASE_URL, or `.sluice/ledger.db` under the current
directory. Key commands migrate first, so a fresh database just works.
`keys create` prints the new key and nothing else on stdout, so
`KEY=$(sluice keys create --tenant acme)` captures exactly the key;
everything else goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sluice.ledger.database import resolve_database_url
from sluice.ledger.keys import KeyStore
from sluice.ledger.migrate import upgrade_database
from sluice.ledger.store import LedgerStore


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


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
    revoke = key_commands.add_parser("revoke", help="revoke a key")
    revoke.add_argument("key")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    url = resolve_database_url(os.environ, Path.cwd())
    upgrade_database(url)
    if args.group == "db":
        print("ledger database is at the latest revision", file=sys.stderr)
        return 0

    store = LedgerStore(url)
    try:
        keys = KeyStore(store)
        if args.command == "create":
            key = keys.create_key(
                args.tenant,
                tokens_per_minute=args.tokens_per_minute,
                requests_per_minute=args.requests_per_minute,
                max_concurrency=args.max_concurrency,
                is_admin=args.admin,
            )
            print(key)
            return 0
        if keys.revoke_key(args.key):
            print("revoked", file=sys.stderr)
            return 0
        print("no active key matches", file=sys.stderr)
        return 1
    finally:
        store.close()


if __name__ == "__main__":
    raise SystemExit(main())
