"""Overload control on the real processes: two model versions (the tiny
model and a 2-layer fallback built the same way, same tokenizer), one
replica each. A driven overload of the big version's pool (two seats, a
queue of long requests behind them) takes it through the stages in order;
each stage's lever is seen from the client's side; when the load drops the
stages step back down and traffic comes back.

Routed and degraded answers say so (`model`, `system_fingerprint`,
`x-sluice-degraded`, `finish_reason`) and the ledger bills the version
that served.
"""

import asyncio
import json
import re
import time
import uuid
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from integration.conftest import eventually, metric, scrape
from integration.test_keys_usage_limits import sluice_cli
from sluice.devstack.stack import LocalStack, StackPorts

BIG, SMALL = "tiny-llama-v1", "tiny-llama-small-v1"
SEATS = 2
# Plain admission refuses nothing here: the SLO is far off, past what ten
# 1,500-token streams behind two seats predict even where a loaded CI
# machine relays a token every 20-50 ms (at 30 s, the load's own tail and
# the critical request were refused there). The stages come from the queue
# age alone, one per second at least (the entry hold), so each lasts long
# enough for the test to use it.
SLO_S = 600.0
NEVER = 1e9
STAGES = [
    {"enter_queue_age_s": 0.5 * n, "exit_queue_age_s": 0.5 * n - 0.25, "enter_predicted_start_s": NEVER,
     "exit_predicted_start_s": NEVER - 1, "enter_kv_occupancy": NEVER, "exit_kv_occupancy": NEVER - 1}
    for n in (1, 2, 3, 4)
]
EARLY_REJECT_S = 0.5
OUTPUT_CAP_TOKENS = 8
LOAD_STREAMS = 10
LOAD_TOKENS = 1500  # long enough that the queue behind the two seats ages for seconds


@pytest.fixture(scope="module")
def two_versions(tiny_model_dir: Path, small_model_dir: Path, tmp_path_factory, postgres_session_url: str):
    log_dir = tmp_path_factory.mktemp("overload")
    catalog = log_dir / "models.json"
    catalog.write_text(json.dumps({"models": [
        {"name": "tiny-llama",
         "versions": [{"version": BIG, "path": str(tiny_model_dir), "fallback": SMALL}]},
        {"name": "tiny-llama-small", "versions": [{"version": SMALL, "path": str(small_model_dir)}]},
        {"name": "auto", "versions": [{"version": BIG, "path": str(tiny_model_dir)}],
         "routes": [{"to": SMALL, "max_prompt_tokens": 64, "max_output_tokens": 16}]},
    ]}))
    local = LocalStack(
        model_dir=tiny_model_dir, log_dir=log_dir, ports=StackPorts.ephemeral(num_replicas=2), num_replicas=2,
        extra_env={
            "SLUICE_CANARY_INTERVAL_S": "1",
            "SLUICE_DATABASE_URL": postgres_session_url,
            "SLUICE_OUTBOX_PATH": str(log_dir / "outbox.db"),
            "SLUICE_MODELS_FILE": str(catalog),
            "SLUICE_INTERACTIVE_TTFT_SLO_S": str(SLO_S),
            "SLUICE_INTERACTIVE_MAX_QUEUE_WAIT_S": "60",
            "SLUICE_OVERLOAD_THRESHOLDS": json.dumps(STAGES),
            "SLUICE_OVERLOAD_REJECT_PREDICTED_START_S": str(EARLY_REJECT_S),
            "SLUICE_OVERLOAD_ENTER_HOLD_S": "1.0",
            "SLUICE_OVERLOAD_EXIT_HOLD_S": "1.0",
            "SLUICE_OVERLOAD_OUTPUT_CAP_TOKENS": str(OUTPUT_CAP_TOKENS),
            "SLUICE_TENANT_MAX_KV_SHARE": "1.0",
        },
        replica_env={
            0: {"SLUICE_MODEL_VERSION": BIG, "SLUICE_MAX_NUM_SEQS": str(SEATS)},
            1: {"SLUICE_MODEL_VERSION": SMALL, "SLUICE_MODEL_DIR": str(small_model_dir),
                "SLUICE_MODEL_NAME": "tiny-llama-small"},
        },
    )
    with local.running(timeout_s=180):
        yield local


def new_key(stack: LocalStack, database_url: str, tenant: str, *policy: str) -> str:
    result = sluice_cli(database_url, "keys", "create", "--tenant", tenant, *policy)
    assert result.returncode == 0, result.stderr
    key = result.stdout.strip()
    eventually(lambda: httpx.get(stack.gateway_url + "/v1/models",
                                 headers={"Authorization": f"Bearer {key}"}).status_code == 200, timeout_s=10)
    return key


def body(max_tokens: int, model: str = "tiny-llama", **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "ignore_eos": True, **extra}


async def first_chunk(client: httpx.AsyncClient, key: str, payload: dict) -> dict:
    """The first SSE chunk of a streamed request, then the client leaves
    (which cancels the generation): enough to see which version serves it."""
    async with client.stream("POST", "/v1/chat/completions", json={**payload, "stream": True},
                             headers={"Authorization": f"Bearer {key}"}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                return json.loads(line[6:])
    raise AssertionError("the stream ended without a chunk")


async def post(client: httpx.AsyncClient, key: str, payload: dict, **headers: str) -> dict:
    started_s = time.monotonic()
    response = await client.post("/v1/chat/completions", json=payload,
                                 headers={"Authorization": f"Bearer {key}", **headers})
    return {"status": response.status_code, "headers": response.headers, "body": response.json(),
            "elapsed_s": time.monotonic() - started_s}


def stage(stack: LocalStack, version: str = BIG) -> float:
    return metric(scrape(stack.metrics_url("scheduler")), "sluice_overload_stage", model=version)


async def until_stage(stack: LocalStack, at_least: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while await asyncio.to_thread(stage, stack) < at_least:
        assert time.monotonic() < deadline, f"stage {at_least} not reached"
        await asyncio.sleep(0.05)


def stage_changes(stack: LocalStack) -> list[tuple[str, str]]:
    return re.findall(rf"overload stage of {BIG}: (\w+) -> (\w+)", stack.log("scheduler"))


def billed(database_url: str, request_id: str) -> tuple[str, str, str] | None:
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                text("SELECT model, model_version, service_class FROM usage WHERE request_id = :id"),
                {"id": request_id}).first()
    finally:
        engine.dispose()
    return None if row is None else (row.model, row.model_version, row.service_class)


def test_the_small_model_takes_easy_requests_routed_by_rule(two_versions, postgres_session_url):
    key = new_key(two_versions, postgres_session_url, f"auto-{uuid.uuid4().hex[:6]}")

    async def run():
        async with httpx.AsyncClient(base_url=two_versions.gateway_url, timeout=60) as client:
            easy = await post(client, key, body(8, model="auto"))
            hard = await post(client, key, body(100, model="auto"))
            # Up to the context's room with ignore_eos: seconds of tokens on
            # a slow CPU; the first chunk already names the serving version.
            unbounded = await first_chunk(client, key, {**body(8, model="auto"), "max_tokens": None})
            return easy, hard, unbounded

    easy, hard, unbounded = asyncio.run(run())
    assert easy["status"] == 200, easy["body"]
    assert (easy["body"]["model"], easy["body"]["system_fingerprint"]) == ("tiny-llama-small", SMALL)
    assert "x-sluice-degraded" not in easy["headers"]  # policy, not degradation
    assert hard["status"] == 200 and hard["body"]["system_fingerprint"] == BIG
    assert hard["body"]["model"] == "auto"
    # No max_tokens: nothing says the answer is short, so the rule does not apply.
    assert unbounded["system_fingerprint"] == BIG


def test_a_driven_overload_goes_through_the_stages_in_order_and_comes_back(two_versions, postgres_session_url):
    suffix = uuid.uuid4().hex[:6]
    load_key = new_key(two_versions, postgres_session_url, f"load-{suffix}")
    capped_key = new_key(two_versions, postgres_session_url, f"capped-{suffix}", "--degradable")
    fallback_key = new_key(two_versions, postgres_session_url, f"fallback-{suffix}", "--allow-fallback")
    critical_key = new_key(two_versions, postgres_session_url, f"critical-{suffix}", "--priority", "critical")
    fallback_id = f"fallback-{suffix}"
    capped_id = f"capped-{suffix}"
    batch_id = f"batch-{suffix}"

    async def run():
        seen = {}
        async with httpx.AsyncClient(base_url=two_versions.gateway_url, timeout=120) as client:
            load = [asyncio.create_task(post(client, load_key, body(LOAD_TOKENS))) for _ in range(LOAD_STREAMS)]
            await until_stage(two_versions, 1)
            seen["batch"] = await post(client, load_key, body(4, service_tier="flex"))
            await until_stage(two_versions, 2)
            # Queued with its cap; it runs once the load is gone.
            capped = asyncio.create_task(post(client, capped_key, body(200), **{"Idempotency-Key": capped_id}))
            await until_stage(two_versions, 3)
            seen["fallback"] = await post(client, fallback_key, body(6), **{"Idempotency-Key": fallback_id})
            await until_stage(two_versions, 4)
            seen["early"] = await post(client, load_key, body(4))
            critical = asyncio.create_task(post(client, critical_key, body(4)))
            seen["ready"] = (await client.get("/readyz")).status_code
            seen["replicas_ready"] = metric(scrape(two_versions.metrics_url("scheduler")),
                                            "sluice_scheduler_replicas_ready")
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
            seen["critical"] = await critical
            seen["capped"] = await capped
            deadline = time.monotonic() + 30
            while await asyncio.to_thread(stage, two_versions) > 0:
                assert time.monotonic() < deadline, "the stages never came back down"
                await asyncio.sleep(0.1)
            seen["batch_after"] = await post(client, load_key, body(4, service_tier="flex"),
                                             **{"Idempotency-Key": batch_id})
        return seen

    seen = asyncio.run(run())

    # Stage 1: live batch refused at once, told when batch resumes.
    batch = seen["batch"]
    assert batch["status"] == 429 and batch["body"]["error"]["code"] == "batch_paused", batch["body"]
    assert batch["headers"]["x-sluice-reject-reason"] == "batch_paused"
    assert float(batch["headers"]["retry-after-ms"]) >= 1000  # at least the stage's exit hold
    assert batch["elapsed_s"] < 1.0

    # Stage 2: the degradable key's output was capped, and the answer says so.
    capped = seen["capped"]
    assert capped["status"] == 200, capped["body"]
    assert capped["headers"]["x-sluice-degraded"] == "output_capped"
    assert capped["body"]["choices"][0]["finish_reason"] == "length"
    assert capped["body"]["usage"]["completion_tokens"] == OUTPUT_CAP_TOKENS

    # Stage 3: the key that allows it was served by the fallback, and billed as it.
    fallback = seen["fallback"]
    assert fallback["status"] == 200, fallback["body"]
    assert (fallback["body"]["model"], fallback["body"]["system_fingerprint"]) == ("tiny-llama-small", SMALL)
    assert fallback["headers"]["x-sluice-degraded"] == "fallback"
    assert fallback["elapsed_s"] < 2.0  # the small pool is not overloaded: no queueing behind the big one

    # Stage 4: everyone else refused early with a Retry-After; critical keys served.
    early = seen["early"]
    assert early["status"] == 429 and early["body"]["error"]["code"] == "over_capacity", early["body"]
    assert early["elapsed_s"] < 1.0 and int(early["headers"]["retry-after-ms"]) > 0
    assert seen["critical"]["status"] == 200, seen["critical"]["body"]
    # Probes and the replicas' canaries never queue: all still ready.
    assert seen["ready"] == 200 and seen["replicas_ready"] == 2

    # In order up, in order down, and batch is taken again.
    names = ["normal", "batch_paused", "output_capped", "fallback", "rejecting"]
    changes = stage_changes(two_versions)
    ups = [(a, b) for a, b in changes if names.index(b) > names.index(a)]
    downs = [(a, b) for a, b in changes if names.index(b) < names.index(a)]
    assert ups[:4] == list(zip(names, names[1:]))
    assert all(names.index(b) == names.index(a) + 1 for a, b in ups)
    assert all(names.index(b) == names.index(a) - 1 for a, b in downs)
    assert changes[-1][1] == "normal"
    assert seen["batch_after"]["status"] == 200, seen["batch_after"]["body"]

    eventually(lambda: billed(postgres_session_url, fallback_id) is not None, timeout_s=10)
    assert billed(postgres_session_url, fallback_id) == ("tiny-llama-small", SMALL, "interactive")
    eventually(lambda: billed(postgres_session_url, capped_id) is not None, timeout_s=10)
    assert billed(postgres_session_url, capped_id) == ("tiny-llama", BIG, "interactive")
    eventually(lambda: billed(postgres_session_url, batch_id) is not None, timeout_s=10)
    assert billed(postgres_session_url, batch_id) == ("tiny-llama", BIG, "batch")  # priced at the batch discount
    levers = scrape(two_versions.metrics_url("scheduler"))
    assert metric(levers, "sluice_overload_levers_total", lever="fallback") >= 1
    assert metric(levers, "sluice_overload_levers_total", lever="output_capped") >= 1
