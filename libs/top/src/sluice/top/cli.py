"""`sluice top`: the fleet's signals, live, in a terminal.

    sluice top [--scheduler URL] [--replica URL ...] [--router URL] [--gateway URL]
               [--interval-s 2] [--top-tenants 5] [--once] [--json]

URLs are /metrics pages (a bare http://host:port means its /metrics);
unset ones come from SLUICE_TOP_SCHEDULER_URL, SLUICE_TOP_ROUTER_URL,
SLUICE_TOP_GATEWAY_URL, SLUICE_TOP_REPLICA_URLS (comma-separated), else
the local stack's ports. Rates and percentiles are over the last interval.
`--once` prints one frame (two scrapes `--interval-s` apart) and exits;
`--json` prints that frame's view model as JSON instead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.live import Live

from sluice.top.render import render_view
from sluice.top.scrape import DEFAULT_SCRAPE_TIMEOUT_S, FleetScrape, scrape_fleet
from sluice.top.targets import Target, resolve_targets
from sluice.top.view import DEFAULT_TOP_TENANTS, build_view


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice top", description="Live view of the fleet's Prometheus signals")
    parser.add_argument("--scheduler", help="the scheduler's /metrics URL")
    parser.add_argument("--router", help="the router's /metrics URL")
    parser.add_argument("--gateway", help="the gateway's /metrics URL (its HTTP port)")
    parser.add_argument("--replica", action="append", default=[], help="a replica's /metrics URL (repeat for each)")
    parser.add_argument("--interval-s", type=_positive_float, default=2.0, help="seconds between scrapes")
    parser.add_argument("--timeout-s", type=_positive_float, default=DEFAULT_SCRAPE_TIMEOUT_S,
                        help="per-target scrape timeout")
    parser.add_argument("--top-tenants", type=int, default=DEFAULT_TOP_TENANTS,
                        help="tenants shown per model before the rest fold into 'other'")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--json", action="store_true", help="print the view model as JSON (implies --once)")
    return parser


async def _two_scrapes(targets: Sequence[Target], interval_s: float,
                       timeout_s: float) -> tuple[FleetScrape, FleetScrape, float]:
    first = await scrape_fleet(targets, timeout_s)
    started_s = time.monotonic()
    await asyncio.sleep(interval_s)
    second = await scrape_fleet(targets, timeout_s)
    return first, second, time.monotonic() - started_s


async def _live(console: Console, targets: Sequence[Target], args: argparse.Namespace) -> None:
    previous, current, elapsed_s = await _two_scrapes(targets, args.interval_s, args.timeout_s)
    with Live(render_view(build_view(previous, current, elapsed_s, args.top_tenants)),
              console=console, screen=False, auto_refresh=False) as live:
        while True:
            taken_s = time.monotonic()
            await asyncio.sleep(args.interval_s)
            previous, current = current, await scrape_fleet(targets, args.timeout_s)
            live.update(render_view(build_view(previous, current, time.monotonic() - taken_s, args.top_tenants)),
                        refresh=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    targets = resolve_targets(os.environ, args.scheduler, args.router, args.gateway, args.replica)
    if args.json or args.once:
        previous, current, elapsed_s = asyncio.run(_two_scrapes(targets, args.interval_s, args.timeout_s))
        view = build_view(previous, current, elapsed_s, args.top_tenants)
        if args.json:
            json.dump(view.to_json_dict(), sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            Console().print(render_view(view))
        return 0
    try:
        asyncio.run(_live(Console(), targets, args))
    except KeyboardInterrupt:
        pass
    return 0
