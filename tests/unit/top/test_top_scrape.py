"""Scraping real HTTP servers on loopback: a page that parses is up; a
refused port, an error status and a garbage page are down, never raised."""

import asyncio

from sluice.devstack.stack import free_port
from sluice.top.scrape import scrape_fleet
from sluice.top.targets import Target, TargetKind

def test_one_scrape_per_target_in_order_and_failures_are_down(server):
    """`server` (conftest) serves /metrics, /broken (500) and /garbage."""
    targets = (
        Target(TargetKind.REPLICA, server + "/metrics"),
        Target(TargetKind.ROUTER, server + "/broken"),
        Target(TargetKind.GATEWAY, server + "/garbage"),
        Target(TargetKind.SCHEDULER, f"http://127.0.0.1:{free_port()}/metrics"),  # nothing listens
    )
    up, broken, garbage, refused = asyncio.run(scrape_fleet(targets, timeout_s=2.0))
    assert [s.target for s in (up, broken, garbage, refused)] == list(targets)
    assert up.up and up.page.series("sluice_num_requests_running")[0].value == 12
    assert not broken.up and broken.error == "HTTP 500"
    assert not garbage.up and garbage.error.startswith("unparseable page")
    assert not refused.up and "ConnectError" in refused.error
