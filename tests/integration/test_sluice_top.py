"""`sluice top --once --json` against the real four-process stack: it reads
every service's /metrics and shows the replica's KV and the tokens served."""

import json
import subprocess
import sys
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.stack

MAX_TOKENS = 8
REQUESTS = 3


def test_sluice_top_shows_the_replicas_kv_and_the_tokens_served(stack):
    client = openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0)
    for _ in range(REQUESTS):
        chunks = list(client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "Count to ten."}], max_tokens=MAX_TOKENS,
            temperature=0, stream=True, extra_body={"ignore_eos": True},
        ))
        assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]

    sluice = Path(sys.executable).with_name("sluice")  # the console script of this venv
    result = subprocess.run(
        [str(sluice), "top", "--once", "--json", "--interval-s", "0.5",
         "--scheduler", stack.metrics_url("scheduler"), "--router", stack.metrics_url("router"),
         "--gateway", stack.gateway_url + "/metrics", "--replica", stack.metrics_url("replica")],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    view = json.loads(result.stdout)

    assert [(t["kind"], t["up"]) for t in view["targets"]] == [
        ("scheduler", True), ("router", True), ("gateway", True), ("replica", True)], view["targets"]
    replica = next(r for r in view["replicas"] if r["replica"] == "replica-0")
    assert replica["source"] == "replica" and replica["ready"] is True
    assert replica["kv_free_blocks"] > 0 and replica["kv_free_blocks"] + replica["kv_used_blocks"] > 0
    assert replica["kv_reserved_blocks"] is not None  # the scheduler's ledger for it
    # The shared stack may have served other tests first: at least ours.
    assert replica["generated_tokens"] >= REQUESTS * MAX_TOKENS
    model = next(m for m in view["models"] if m["model"] == "tiny-llama-v1")
    assert model["generated_tokens"] >= REQUESTS * MAX_TOKENS and model["overload_stage_name"] == "normal"
    assert view["replicas_ready"] == 1
    # The gateway's TTFT histogram has the alias's series (its percentiles
    # are over the last interval, which may hold no request: n/a is honest).
    assert any(c["model"] == "tiny-llama" for c in view["classes"]), view["classes"]
    assert view["rejections_source"] in ("gateway", "router")
