"""The router's catalog hot reload on the real processes: two versions of
tiny-llama (the 4-layer model as v1, the 2-layer one with the same
tokenizer as v2), one replica each, the router reading the devstack's
catalog file and polling it every 0.2 s.

At weights 100/0 every request (distinct idempotency keys) is served by
v1; the catalog is rewritten to 0/100 and, with no restart, new requests
go to v2 while a stream that started on v1 before the change finishes
there normally; then a malformed catalog is written, refused, and traffic
goes on under the last good one. Each response's system_fingerprint names
the version that served it.
"""

import asyncio
import json
import time
import uuid

import httpx
import pytest

from integration.conftest import metric, scrape
from sluice.devstack.catalog import V1, V2, two_versions
from sluice.devstack.stack import LocalStack, StackPorts

pytestmark = pytest.mark.stack

POLL_S = 0.2
SWITCH_TIMEOUT_S = 20.0  # the poll is 0.2 s; this bounds a slow CI machine, not the expectation
# Long enough that the stream is still going when the router applies the
# new catalog (the tiny model took ~10 s for 1,500 here;
# the apply comes within a poll, 0.2 s).
LONG_STREAM_TOKENS = 500


@pytest.fixture(scope="module")
def two_version_stack(tiny_model_dir, small_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("router-reload")
    stack = LocalStack(
        model_dir=tiny_model_dir, log_dir=workdir / "logs", ports=StackPorts.ephemeral(num_replicas=2),
        cwd=workdir, num_replicas=2, catalog=two_versions(tiny_model_dir, small_model_dir, (100, 0)),
        # Embedded defaults (SQLite ledger, in-process buckets); small KV so two replicas start quickly.
        extra_env={"REDIS_URL": "", "SLUICE_DATABASE_URL": "", "SLUICE_KV_CACHE_BLOCKS": "256",
                   "SLUICE_CANARY_INTERVAL_S": "1", "SLUICE_CATALOG_RELOAD_INTERVAL_S": str(POLL_S)},
    )
    with stack.running(timeout_s=180):
        yield stack


def body(max_tokens: int, **extra) -> dict:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens,
            "ignore_eos": True, **extra}


async def served_by(client: httpx.AsyncClient, stack: LocalStack) -> str:
    """The version that served a one-token request with a fresh idempotency key."""
    response = await client.post("/v1/chat/completions", json=body(1), headers={
        "Authorization": f"Bearer {stack.api_key}", "Idempotency-Key": uuid.uuid4().hex})
    assert response.status_code == 200, response.text
    return response.json()["system_fingerprint"]


async def stream_all(client: httpx.AsyncClient, stack: LocalStack, first_chunk: asyncio.Event) -> list[dict]:
    chunks = []
    async with client.stream("POST", "/v1/chat/completions", json=body(LONG_STREAM_TOKENS, stream=True,
                             stream_options={"include_usage": True}),
                             headers={"Authorization": f"Bearer {stack.api_key}"}) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                chunks.append({"done": True, "at_s": time.monotonic()})
            elif line.startswith("data: "):
                chunks.append({**json.loads(line[6:]), "at_s": time.monotonic()})
                first_chunk.set()
    return chunks


def router_metric(stack: LocalStack, name: str, **labels: str) -> float:
    return metric(scrape(stack.metrics_url("router")), name, **labels)


async def wait_until(check, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.1)


async def test_weights_switch_live_and_a_bad_catalog_is_refused(two_version_stack):
    stack = two_version_stack
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60.0) as client:
        assert {await served_by(client, stack) for _ in range(12)} == {V1}
        assert router_metric(stack, "sluice_router_catalog_generation") == 1

        first_chunk = asyncio.Event()
        stream = asyncio.create_task(stream_all(client, stack, first_chunk))
        await asyncio.wait_for(first_chunk.wait(), 30.0)
        stack.write_catalog(stack.catalog.with_weights(0, 100))
        await wait_until(lambda: asyncio.to_thread(
            lambda: router_metric(stack, "sluice_router_catalog_generation") == 2), SWITCH_TIMEOUT_S)
        applied_s = time.monotonic()
        assert not stream.done()  # the swap happened under the open stream

        async def on_v2() -> bool:
            return await served_by(client, stack) == V2
        await wait_until(on_v2, SWITCH_TIMEOUT_S)
        assert {await served_by(client, stack) for _ in range(12)} == {V2}

        chunks = await asyncio.wait_for(stream, 120.0)
        assert chunks[-1].get("done") and {c["system_fingerprint"] for c in chunks[:-1]} == {V1}
        assert any(c["at_s"] > applied_s for c in chunks[:-1])  # tokens kept coming after the swap
        finishes = [choice["finish_reason"] for c in chunks[:-1] for choice in c["choices"] if choice["finish_reason"]]
        assert finishes == ["length"]
        assert chunks[-2]["usage"]["completion_tokens"] == LONG_STREAM_TOKENS

        stack.models_file.write_text('{"models": [{"name": "tiny-llama", "versions": [')
        await wait_until(lambda: asyncio.to_thread(
            lambda: router_metric(stack, "sluice_router_catalog_reloads_total", outcome="rejected") == 1),
            SWITCH_TIMEOUT_S)
        assert {await served_by(client, stack) for _ in range(6)} == {V2}  # the last good catalog serves
        models = await client.get("/v1/models", headers={"Authorization": f"Bearer {stack.api_key}"})
        assert [m["id"] for m in models.json()["data"]] == ["tiny-llama"]
    assert router_metric(stack, "sluice_router_catalog_generation") == 2
    assert "catalog change rejected" in stack.log("router")
    assert stack.processes["router"].poll() is None  # never restarted
