"""A real Prometheus scrapes the running stack, and every dashboard query and
every rule evaluates against what it scraped.

Debian's `prometheus` (installed by `make observability-tools`) runs on a
loopback port with deploy/observability/prometheus_local.py's config for the
stack's ports, scraping every 1 s and loading the generated rules. After a
short bounded load (streamed interactive requests, a few flex ones, refusals)
and two more scrapes, each panel's PromQL (dashboard variables set to "All")
and each rule goes through /api/v1/query: a parse error fails, and so does
an empty result, except for the queries in EMPTY_IN_A_HEALTHY_RUN. Alerts are
judged by their `signal` (the thresholded quantity): a healthy run fires
none, so their conditions are only parsed.
"""

from __future__ import annotations

import concurrent.futures
import json
import math
import time

import httpx
import openai
import pytest

from support.prometheus_server import load_observability_module, running_prometheus

pytestmark = pytest.mark.stack

SCRAPE_INTERVAL_S = 1.0
STREAMED_REQUESTS = 20
FLEX_REQUESTS = 3

# Queries whose series cannot exist in a short healthy run. Keep this short:
# a metric of the contract that is simply missing does not belong here.
EMPTY_IN_A_HEALTHY_RUN = {
    # The scheduler refuses nothing while the pool keeps up (no over_capacity,
    # queue_timeout, ...); its reason/class counter has no child until it does.
    'sum by (reason, class) (rate(sluice_rejections_total{class=~".+"}[1m]))',
    # A tenant's gauge child is created the first time one of its requests is
    # in a scheduler queue at a publish; 4 streams at a time on the tiny model
    # are dispatched at once and never wait there.
    'max by (tenant, class) (sluice_tenant_queue_oldest_age_seconds{model=~".+", class=~".+"})',
}


prometheus_local = load_observability_module("prometheus_local")
rules = load_observability_module("rules")


def dashboard_queries() -> list[tuple[str, str]]:
    """(dashboard / panel, expr with the variables at "All") of every panel target."""
    queries = []
    for path in sorted(prometheus_local.DASHBOARDS_DIR.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                expr = (target["expr"].replace("$__rate_interval", "1m")
                        .replace("$model", ".+").replace("$class", ".+"))
                queries.append((f"{dashboard['title']} / {panel['title']}", expr))
    return queries


@pytest.fixture(scope="module")
def prometheus(stack, tmp_path_factory: pytest.TempPathFactory):
    """Prometheus on a loopback port scraping `stack`; stopped after the module."""
    with running_prometheus(stack, tmp_path_factory.mktemp("prometheus"), SCRAPE_INTERVAL_S) as url:
        yield url


def query(url: str, expr: str) -> dict:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    return response.json()


def drive_load(stack) -> None:
    client = openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0, timeout=30)

    def stream(index: int, tier: str | None) -> None:
        extra = {"service_tier": tier} if tier else {}
        chunks = client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": f"count to ten, take {index}"}],
            max_tokens=16, stream=True, extra_body={"ignore_eos": True}, **extra)
        assert sum(1 for chunk in chunks if chunk.choices and chunk.choices[0].delta.content) > 1

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        jobs = [pool.submit(stream, i, None) for i in range(STREAMED_REQUESTS)]
        jobs += [pool.submit(stream, i, "flex") for i in range(FLEX_REQUESTS)]
        for job in jobs:
            job.result()
    # Refused by the router: an interactive prompt over its cap (flex may exceed it).
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "word " * 2500}],
                                       max_tokens=2)
    # Refused by the gateway itself: a wrong key.
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key="sk-wrong", max_retries=0).models.list()


def wait_for_scrapes_after(url: str, moment_s: float, scrapes: int, timeout_s: float) -> None:
    """Until every target had `scrapes` successful scrapes after `moment_s`
    (and the rules one evaluation on them). Counting successes, not the last
    timestamp: on a busy machine a scrape may time out, and a rate needs two
    samples."""
    deadline = time.monotonic() + timeout_s
    while True:
        since_s = max(1, math.ceil(time.time() - moment_s))
        result = query(url, f"min(sum_over_time(up[{since_s}s]))")["data"]["result"]
        if result and float(result[0]["value"][1]) >= scrapes:
            time.sleep(SCRAPE_INTERVAL_S)  # one more rule evaluation
            return
        assert time.monotonic() < deadline, f"targets not all scraped {scrapes} times: {query(url, 'up')}"
        time.sleep(0.25)


# The stack itself may take up to 180 s to start (a shared session fixture);
# the body, Prometheus included, is bounded well under 90 s.
@pytest.mark.timeout(300)
def test_every_panel_query_and_rule_returns_series_from_the_scraped_stack(stack, prometheus) -> None:
    drive_load(stack)
    wait_for_scrapes_after(prometheus, time.time(), scrapes=2, timeout_s=20)

    expressions = dashboard_queries()
    expressions += [(f"record {r.record}", r.expr) for r in rules.records()]
    expressions += [(f"alert {a.name} (signal)", a.signal) for a in rules.alerts()]
    parse_errors, empty = [], []
    for where, expr in expressions:
        answer = query(prometheus, expr)
        if answer["status"] != "success":
            parse_errors.append(f"{where}: {answer.get('error')}\n    {expr}")
        elif not answer["data"]["result"] and expr not in EMPTY_IN_A_HEALTHY_RUN:
            empty.append(f"{where}\n    {expr}")
    for alert in rules.alerts():  # the conditions parse; a healthy run fires none
        answer = query(prometheus, alert.expr)
        if answer["status"] != "success":
            parse_errors.append(f"alert {alert.name}: {answer.get('error')}")
    assert not parse_errors, "\n".join(parse_errors)
    assert not empty, "no series:\n" + "\n".join(empty)


def test_the_allowlisted_queries_are_panel_queries(prometheus) -> None:
    # An allowlist entry that matches no query any more hides nothing: drop it.
    assert EMPTY_IN_A_HEALTHY_RUN <= {expr for _, expr in dashboard_queries()}
