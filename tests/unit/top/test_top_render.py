"""The rendered frame carries the view's numbers, and n/a where there are none."""

from rich.console import Console

from sluice.top.exposition import parse_page
from sluice.top.render import render_view
from sluice.top.scrape import TargetScrape
from sluice.top.view import build_view

from top_pages import INTERVAL_S, SCHEDULER, fleet


def rendered(view) -> str:
    console = Console(record=True, width=200, color_system=None)
    console.print(render_view(view))
    return console.export_text()


def test_the_frame_shows_the_key_numbers():
    text = rendered(build_view(fleet(False), fleet(True), INTERVAL_S, top_tenants=3))
    for expected in (
        "42.50s",  # batch queue's oldest age
        "190ms", "950ms",  # TTFT p50 / p99
        "14ms", "49ms",  # ITL p50 / p99
        "400.0",  # tok/s
        "75.0%",  # replica-0's KV occupancy
        "acme", "1,000.0", "other", "65.0",  # top tenant, and the rest folded
        "over_capacity", "3.00", "counted by the router",
        "1 batch_paused",
        "DOWN replica http://replica-1:9061/metrics",
        "replica-1 (scheduler's view)",
    ):
        assert expected in text, expected


def test_absent_signals_read_n_a():
    page = parse_page('# TYPE sluice_queue_length gauge\nsluice_queue_length{class="batch",model="m"} 2\n')
    scrape = (TargetScrape(SCHEDULER, page),)
    text = rendered(build_view(scrape, scrape, INTERVAL_S))
    batch_line = next(line for line in text.splitlines() if " batch " in line)
    assert batch_line.count("n/a") == 5  # oldest age and the four latency percentiles
    assert "Rejections (n/a)" in text
