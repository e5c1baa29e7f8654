"""API keys from the admin CLI, per-tenant limits, and GET /v1/usage
against the ledger in Postgres, through the real stack."""

import os
import re
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import httpx
import openai
import pytest

from integration.conftest import eventually
from sluice.ledger import LedgerStore

pytestmark = pytest.mark.stack

KEY_PROPAGATION_S = 5.0  # the promise: a running gateway honours key changes within 5 s


def sluice_cli(database_url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SLUICE_DATABASE_URL": database_url}
    sluice = os.path.join(os.path.dirname(sys.executable), "sluice")
    return subprocess.run([sluice, *args], env=env, capture_output=True, text=True, timeout=60)


def create_key(database_url: str, tenant: str, *limits: str) -> str:
    result = sluice_cli(database_url, "keys", "create", "--tenant", tenant, *limits)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("\n") == 1  # the key alone on stdout
    return result.stdout.strip()


def client(stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=key, max_retries=0)


def chat(c: openai.OpenAI, max_tokens: int = 4, **kwargs):
    return c.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=max_tokens, extra_body={"ignore_eos": True}, **kwargs)


def wait_until_accepted(c: openai.OpenAI) -> float:
    started = time.monotonic()
    while True:
        try:
            chat(c, max_tokens=1)
            return time.monotonic() - started
        except openai.AuthenticationError:
            assert time.monotonic() - started < KEY_PROPAGATION_S, "new key not honoured in time"
            time.sleep(0.2)


def test_new_key_works_and_revoked_key_stops_within_five_seconds(stack, stack_database_url):
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    key = create_key(stack_database_url, tenant)
    assert key.startswith("sk-sluice-")
    c = client(stack, key)
    wait_until_accepted(c)
    assert sluice_cli(stack_database_url, "keys", "revoke", key).returncode == 0
    started = time.monotonic()
    while True:
        try:
            chat(c, max_tokens=1)
        except openai.AuthenticationError:
            break
        assert time.monotonic() - started < KEY_PROPAGATION_S, "revoked key still accepted"
        time.sleep(0.2)


def test_usage_totals_match_the_ledger_and_stay_within_the_tenant(stack, stack_database_url):
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    c = client(stack, create_key(stack_database_url, tenant))
    wait_until_accepted(c)  # that probe is billed too: one token
    results = [chat(c, max_tokens=n) for n in (3, 5)]
    expected_prompt = sum(r.usage.prompt_tokens for r in results)
    headers = {"Authorization": f"Bearer {c.api_key}"}

    def usage(**params) -> dict:
        response = httpx.get(stack.gateway_url + "/v1/usage", params=params, headers=headers, timeout=10)
        assert response.status_code == 200, response.text
        return response.json()

    eventually(lambda: usage()["data"][0]["requests"] == 3)
    total = usage()["data"][0]
    assert total["completion_tokens"] == 1 + 3 + 5
    assert total["prompt_tokens"] == expected_prompt + results[0].usage.prompt_tokens  # the probe's prompt
    by_model = usage(group_by="model")["data"]
    assert [(row["model"], row["requests"]) for row in by_model] == [("tiny-llama", 3)]
    today = datetime.now(UTC).date().isoformat()
    assert [row["day"] for row in usage(group_by="day")["data"]] == [today]
    future = int((datetime.now(UTC) + timedelta(days=1)).timestamp())
    assert usage(start=future, end=future + 60)["data"][0]["requests"] == 0

    # Cost: none until the served version has a price (the session's ledger
    # starts with none), then exact, as a decimal string.
    assert total["cost"] is None
    [version] = total["unpriced_model_versions"]
    priced = sluice_cli(stack_database_url, "prices", "set", version, "--input", "1",
                        "--cached-input", "0.5", "--output", "2")
    assert priced.returncode == 0, priced.stderr
    total = usage()["data"][0]
    micros = ((total["prompt_tokens"] - total["cached_tokens"]) * 1_000_000 + total["cached_tokens"] * 500_000
              + total["completion_tokens"] * 2_000_000)
    assert total["cost"] == {"value": format((Decimal(micros) / 10**12).normalize(), "f"), "currency": "usd"}
    assert total["unpriced_model_versions"] == []
    [by_model_day] = usage(group_by="model,day")["data"]
    assert (by_model_day["model"], by_model_day["day"], by_model_day["cost"]) == ("tiny-llama", today, total["cost"])

    # The same totals straight from the ledger tables.
    with LedgerStore(stack_database_url) as ledger:
        (row,) = ledger.usage_summary(tenant, datetime.now(UTC) - timedelta(days=1), datetime.now(UTC), None)
    assert (row.requests, row.output_tokens) == (3, 9)

    # Another tenant may not look; an admin may.
    forbidden = httpx.get(stack.gateway_url + "/v1/usage", params={"tenant": "someone-else"}, headers=headers)
    assert forbidden.status_code == 403
    admin = create_key(stack_database_url, f"admin-{uuid.uuid4().hex[:6]}", "--admin")
    wait_until_accepted(client(stack, admin))
    seen = httpx.get(stack.gateway_url + "/v1/usage", params={"tenant": tenant},
                     headers={"Authorization": f"Bearer {admin}"}).json()
    assert seen["data"][0]["requests"] == 3


def test_requests_per_minute_limit_answers_429_with_retry_after(stack, stack_database_url):
    c = client(stack, create_key(stack_database_url, f"t-{uuid.uuid4().hex[:8]}", "--requests-per-minute", "2"))
    wait_until_accepted(c)
    chat(c, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as refused:
        chat(c, max_tokens=1)
    response = refused.value.response
    assert refused.value.code == "rate_limit_exceeded"
    assert response.headers["x-sluice-reject-reason"] == "rate_limit_exceeded"
    assert 1 <= int(response.headers["retry-after"]) <= 30  # one request refills in 30 s at 2/min


def test_tokens_per_minute_limit_refuses_oversized_requests(stack, stack_database_url):
    c = client(stack, create_key(stack_database_url, f"t-{uuid.uuid4().hex[:8]}", "--tokens-per-minute", "200"))
    wait_until_accepted(c)
    with pytest.raises(openai.RateLimitError) as refused:
        chat(c, max_tokens=1000)  # the estimate alone is over the whole minute's budget
    assert refused.value.code == "rate_limit_exceeded"


def test_concurrency_cap_refuses_a_second_stream(stack, stack_database_url):
    c = client(stack, create_key(stack_database_url, f"t-{uuid.uuid4().hex[:8]}", "--max-concurrency", "1"))
    wait_until_accepted(c)
    stream = chat(c, max_tokens=400, stream=True)
    next(iter(stream))
    with pytest.raises(openai.RateLimitError) as refused:
        chat(c, max_tokens=1)
    assert refused.value.code == "tenant_concurrency"
    stream.close()
    eventually(lambda: _accepted(c))


def _accepted(c: openai.OpenAI) -> bool:
    try:
        chat(c, max_tokens=1)
        return True
    except openai.RateLimitError:
        return False


def test_an_oversized_count_is_400_and_leaks_nothing(stack, stack_database_url):
    c = client(stack, create_key(stack_database_url, f"t-{uuid.uuid4().hex[:8]}", "--max-concurrency", "1"))
    wait_until_accepted(c)
    for _ in range(2):
        with pytest.raises(openai.BadRequestError) as error:
            c.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                      max_tokens=2**32, extra_headers={"Idempotency-Key": "big"})
        assert error.value.param == "max_tokens"
    chat(c, max_tokens=1)  # the single concurrency slot is free


def test_tenants_may_use_the_same_idempotency_key(stack, stack_database_url):
    key = f"shared-{uuid.uuid4().hex[:6]}"
    clients = [client(stack, create_key(stack_database_url, f"t-{uuid.uuid4().hex[:8]}")) for _ in range(2)]
    for c in clients:
        wait_until_accepted(c)
    results = [c.chat.completions.with_raw_response.create(
        model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        extra_headers={"Idempotency-Key": key}, extra_body={"ignore_eos": True}) for c in clients]
    assert [r.headers.get("x-sluice-idempotent-replay") for r in results] == [None, None]  # both ran
    assert all(r.parse().usage.completion_tokens == 3 for r in results)


def test_rate_limit_headers_report_the_tenants_buckets(stack, stack_database_url):
    c = client(stack, create_key(stack_database_url, f"t-{uuid.uuid4().hex[:8]}",
                                 "--requests-per-minute", "4", "--tokens-per-minute", "10000"))
    wait_until_accepted(c)  # the first of the four requests
    raw = c.chat.completions.with_raw_response.create(
        model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    headers = raw.headers
    assert headers["x-ratelimit-limit-requests"] == "4" and headers["x-ratelimit-limit-tokens"] == "10000"
    assert headers["x-ratelimit-remaining-requests"] == "2"
    assert 9_900 < int(headers["x-ratelimit-remaining-tokens"]) < 10_000
    assert re.fullmatch(r"\d+(\.\d+)?s", headers["x-ratelimit-reset-requests"])  # 2 requests at 4/min: ~30 s
    assert re.fullmatch(r"\d+(ms|(\.\d+)?s)", headers["x-ratelimit-reset-tokens"])
    with c.chat.completions.with_streaming_response.create(
            model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2, stream=True) as stream:
        assert stream.headers["x-ratelimit-remaining-requests"] == "1"
        for _ in stream.iter_lines():
            pass
    chat(c, max_tokens=1)
    with pytest.raises(openai.RateLimitError) as refused:
        chat(c, max_tokens=1)
    refusal = refused.value.response.headers
    assert refusal["x-ratelimit-remaining-requests"] == "0" and refusal["x-ratelimit-limit-requests"] == "4"
    assert "retry-after-ms" in refusal
