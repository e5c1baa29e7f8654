"""GET /v1/usage reports cost beside tokens: the real route on a real
migrated SQLite ledger, called over ASGI. The authenticator is a fixed map
of keys to tenants (key handling is not what is tested here)."""

from datetime import UTC, datetime
from decimal import Decimal
from types import SimpleNamespace

import httpx
import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from sluice.gateway.auth import Tenant
from sluice.gateway.routes import usage
from sluice.ledger import LedgerStore, UsageRecord, upgrade_database

DAY1 = datetime(2025, 3, 1, 12, 0, tzinfo=UTC)
DAY2 = datetime(2025, 3, 2, 12, 0, tzinfo=UTC)
MARCH = {"start": "2025-03-01", "end": "2025-04-01"}
ACME = {"Authorization": "Bearer acme-key"}


class FixedKeys:
    def tenant_for(self, api_key: str) -> Tenant | None:
        return {"acme-key": Tenant("acme"), "ops-key": Tenant("ops", is_admin=True)}.get(api_key)


def record(request_id: str, model: str, version: str, at: datetime, service_class: str = "interactive",
           prompt: int = 1000, cached: int = 0, output: int = 1000, tenant: str = "acme") -> UsageRecord:
    return UsageRecord(tenant=tenant, request_id=request_id, model=model, model_version=version,
                       prompt_tokens=prompt, cached_tokens=cached, output_tokens=output,
                       finish_reason="stop", finished_at=at, service_class=service_class)


@pytest.fixture
def ledger(tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    upgrade_database(url)
    store = LedgerStore(url)
    store.set_price("alpha-v1", Decimal("1"), Decimal("0.5"), Decimal("2"), batch_discount=Decimal("0.5"))
    store.write_usage([
        record("a", "alpha", "alpha-v1", DAY1, cached=400),            # 600 + 200 + 2000 -> 0.0028
        record("b", "alpha", "alpha-v1", DAY1, service_class="batch"),  # (1000 + 2000) / 2 -> 0.0015
        record("c", "beta", "beta-v3", DAY2),                          # no price
        record("d", "alpha", "alpha-v1", DAY2, tenant="globex"),
    ])
    yield store
    store.close()


@pytest.fixture
async def client(ledger):
    app = Starlette(routes=[Route("/v1/usage", usage.usage, methods=["GET"])])
    app.state.gateway = SimpleNamespace(authenticator=FixedKeys(), resources=SimpleNamespace(ledger=ledger))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as http:
        yield http


async def get_usage(client, headers=ACME, **params) -> dict:
    response = await client.get("/v1/usage", params={**MARCH, **params}, headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


async def test_buckets_per_model_and_day_carry_an_exact_cost_or_null(client):
    body = await get_usage(client, group_by="model,day")
    assert body["group_by"] == "model,day"
    assert [(b["day"], b["model"], b["requests"], b["completion_tokens"], b["cost"], b["unpriced_model_versions"])
            for b in body["data"]] == [
        ("2025-03-01", "alpha", 2, 2000, {"value": "0.0043", "currency": "usd"}, []),
        ("2025-03-02", "beta", 1, 1000, None, ["beta-v3"]),
    ]


async def test_a_total_over_an_unpriced_version_is_null_until_it_is_priced(client, ledger):
    [total] = (await get_usage(client))["data"]
    assert (total["requests"], total["cost"], total["unpriced_model_versions"]) == (3, None, ["beta-v3"])
    ledger.set_price("beta-v3", Decimal("0.1"), Decimal("0.1"), Decimal("0.1"))  # 2000 x 0.1 -> 0.0002
    [total] = (await get_usage(client))["data"]
    assert (total["cost"], total["unpriced_model_versions"]) == ({"value": "0.0045", "currency": "usd"}, [])


async def test_by_model_and_by_day_keep_their_shape_and_gain_cost(client):
    by_model = (await get_usage(client, group_by="model"))["data"]
    assert [(b["model"], b["day"], b["cost"]) for b in by_model] == [
        ("alpha", None, {"value": "0.0043", "currency": "usd"}), ("beta", None, None)]
    by_day = (await get_usage(client, group_by="day"))["data"]
    assert [(b["day"], b["model"], b["cost"]) for b in by_day] == [
        ("2025-03-01", None, {"value": "0.0043", "currency": "usd"}), ("2025-03-02", None, None)]


async def test_an_admin_sees_every_tenants_cost(client):
    body = await get_usage(client, headers={"Authorization": "Bearer ops-key"}, tenant="*", group_by="model")
    alpha = next(b for b in body["data"] if b["model"] == "alpha")
    # acme's 0.0043 plus globex's 0.003 (1000 x 1 + 1000 x 2, interactive)
    assert (alpha["requests"], alpha["cost"]) == (3, {"value": "0.0073", "currency": "usd"})


async def test_a_quiet_range_costs_zero(client):
    [total] = (await get_usage(client, start="2024-01-01", end="2024-02-01"))["data"]
    assert (total["requests"], total["cost"]) == (0, {"value": "0", "currency": "usd"})


async def test_an_unknown_grouping_is_a_400_naming_the_choices(client):
    response = await client.get("/v1/usage", params={"group_by": "version"}, headers=ACME)
    assert response.status_code == 400
    assert "'model,day'" in response.json()["error"]["message"]
