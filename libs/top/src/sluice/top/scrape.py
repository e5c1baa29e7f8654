"""Read every target's /metrics page at once.

A target that refuses, times out, answers non-200 or serves a page that
does not parse is "down" with the reason; it never raises, so one dead
replica cannot take the whole view with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from sluice.top.exposition import MetricPage, parse_page
from sluice.top.targets import Target

# Short: a live view refreshes every couple of seconds, and a page slower
# than this is a finding in itself (shown as down with the timeout).
DEFAULT_SCRAPE_TIMEOUT_S = 1.5


@dataclass(frozen=True, slots=True)
class TargetScrape:
    target: Target
    page: MetricPage | None  # None when down
    error: str = ""

    @property
    def up(self) -> bool:
        return self.page is not None


FleetScrape = tuple[TargetScrape, ...]


async def scrape_target(client: httpx.AsyncClient, target: Target) -> TargetScrape:
    try:
        response = await client.get(target.url)
    except httpx.HTTPError as error:
        return TargetScrape(target, None, f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
    if response.status_code != 200:
        return TargetScrape(target, None, f"HTTP {response.status_code}")
    try:
        page = parse_page(response.text, response.headers.get("content-type", ""))
    except (ValueError, TypeError, IndexError, KeyError) as error:  # what the parsers raise on bad input
        return TargetScrape(target, None, f"unparseable page: {error}")
    return TargetScrape(target, page)


async def scrape_fleet(
    targets: Sequence[Target], timeout_s: float = DEFAULT_SCRAPE_TIMEOUT_S,
    client: httpx.AsyncClient | None = None,
) -> FleetScrape:
    """One scrape of every target, concurrently, in the targets' order."""
    if client is not None:
        return tuple(await asyncio.gather(*(scrape_target(client, t) for t in targets)))
    # trust_env=False: /metrics ports are cluster-internal or port-forwarded
    # to loopback; an HTTP(S)_PROXY from the shell would only get in the way.
    async with httpx.AsyncClient(timeout=timeout_s, trust_env=False) as own:
        return tuple(await asyncio.gather(*(scrape_target(own, t) for t in targets)))
