"""The gateway's readiness and metrics endpoints, on the real app: real
GatewayResources (a migrated SQLite ledger and outbox in a temporary
directory, in-process limits) and a router address nothing listens on, so
no route to a replica exists. Starlette's TestClient runs the app's
lifespan, as uvicorn does."""

import socket

import httpx
import pytest
from starlette.testclient import TestClient

from sluice.gateway.app import create_app
from sluice.gateway.settings import GatewaySettings
from sluice.ledger import Outbox


def unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def settings_for(tmp_path, **overrides) -> GatewaySettings:
    return GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        outbox_path=str(tmp_path / "outbox.db"),
        router_address=f"127.0.0.1:{unused_port()}",
        dev_api_key="sk-test",
        **overrides,
    )


@pytest.fixture
def gateway(tmp_path):
    with TestClient(create_app(settings_for(tmp_path))) as client:
        yield client


def test_readyz_is_ready_on_its_own_stores_while_no_replica_can_be_reached(gateway):
    response = gateway.get("/readyz")
    assert response.status_code == 200
    assert response.json() == {"status": "ready", "outbox_pending": 0, "limits": "process"}
    # The old question, "is there a route to a ready replica", stays answerable.
    route = gateway.get("/readyz/route")
    assert route.status_code == 503
    assert route.json() == {"status": "no route to a ready replica"}


def test_a_request_meanwhile_gets_a_503_with_retry_after_from_the_ready_gateway(gateway):
    response = gateway.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-test"},
                            json={"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}]})
    assert response.status_code == 503
    assert int(response.headers["retry-after"]) >= 1


def test_readyz_is_503_when_the_outbox_cannot_be_read(gateway, tmp_path):
    # A closed outbox stands in for one whose volume went away; the
    # flusher keeps its own (open) one, so only the probe sees the loss.
    resources = gateway.app.state.gateway.resources
    lost = Outbox(tmp_path / "lost-outbox.db")
    lost.close()
    serving, resources.outbox = resources.outbox, lost
    try:
        response = gateway.get("/readyz")
    finally:
        resources.outbox = serving
    assert response.status_code == 503
    assert response.json()["status"] == "outbox unusable"


def test_metrics_stay_on_the_http_port_when_no_metrics_port_is_set(gateway):
    response = gateway.get("/metrics")
    assert response.status_code == 200
    assert "sluice_gateway_requests_total" in response.text


def test_a_metrics_port_moves_metrics_off_the_http_port(tmp_path):
    port = unused_port()
    app = create_app(settings_for(tmp_path, metrics_port=port, metrics_host="127.0.0.1"))
    with TestClient(app) as client:
        assert client.get("/metrics").status_code == 404
        scraped = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert scraped.status_code == 200
        assert "sluice_gateway_requests_total" in scraped.text
        # OpenMetrics (the exemplars' format) on request, as on the HTTP port before.
        openmetrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5,
                                headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    # The lifespan's end closes the metrics server with the app.
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_on_started_runs_once_its_stores_are_open_before_the_first_request(tmp_path):
    seen = []
    app = create_app(settings_for(tmp_path), on_started=lambda: seen.append(app.state.gateway is not None))
    with TestClient(app) as client:
        assert seen == [True]  # once, with the gateway's state (stores, keys, router) in place
        assert client.get("/healthz").status_code == 200
    assert seen == [True]
