"""Idempotency-Key: one billed row per key, replay of a finished response,
409 while the first attempt still streams, a fresh run after a cancel."""

import concurrent.futures
import uuid

import httpx
import openai
import pytest

from integration.conftest import eventually
from sluice.ledger import LedgerStore

pytestmark = pytest.mark.stack

MESSAGES = [{"role": "user", "content": "Count to ten."}]


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0)


def _chat(client, key: str, **kwargs):
    return client.chat.completions.with_raw_response.create(
        model="tiny-llama", messages=MESSAGES, extra_headers={"Idempotency-Key": key},
        extra_body={"ignore_eos": True}, **kwargs,
    )


def _rows(database_url: str, request_id: str) -> tuple[int, int]:
    """(billed usage rows, unbilled attempts) for one request id of the dev tenant."""
    from sqlalchemy import text

    with LedgerStore(database_url) as ledger, ledger.engine.connect() as connection:
        usage = connection.execute(text("SELECT count(*) FROM usage WHERE request_id = :r"), {"r": request_id})
        attempts = connection.execute(text("SELECT count(*) FROM attempts WHERE request_id = :r"), {"r": request_id})
        return usage.scalar_one(), attempts.scalar_one()


def test_retry_after_finish_is_replayed_and_billed_once(client, stack_database_url):
    key = f"k-{uuid.uuid4().hex}"
    first = _chat(client, key, max_tokens=12, temperature=1.0, seed=None)
    again = _chat(client, key, max_tokens=12, temperature=1.0)
    assert again.headers.get("x-sluice-idempotent-replay") == "true"
    a, b = first.parse(), again.parse()
    assert (a.id, a.choices[0].message.content, a.usage) == (b.id, b.choices[0].message.content, b.usage)
    streamed = client.chat.completions.create(
        model="tiny-llama", messages=MESSAGES, max_tokens=12, stream=True, stream_options={"include_usage": True},
        extra_headers={"Idempotency-Key": key},
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == a.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12
    eventually(lambda: _rows(stack_database_url, key)[0] == 1)
    assert _rows(stack_database_url, key) == (1, 0)


def test_concurrent_retries_with_one_key_give_one_row(client, stack_database_url):
    key = f"k-{uuid.uuid4().hex}"

    def attempt(_: int) -> str:
        try:
            return _chat(client, key, max_tokens=8).headers.get("x-sluice-idempotent-replay", "ran")
        except openai.ConflictError:
            return "conflict"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(attempt, range(8)))
    assert outcomes.count("ran") == 1
    assert set(outcomes) <= {"ran", "conflict", "true"}
    eventually(lambda: _rows(stack_database_url, key)[0] == 1)
    assert _rows(stack_database_url, key)[0] == 1


def test_retry_while_streaming_is_a_conflict_then_replays(client, stack_database_url):
    key = f"k-{uuid.uuid4().hex}"
    stream = client.chat.completions.create(
        model="tiny-llama", messages=MESSAGES, max_tokens=64, stream=True,
        extra_headers={"Idempotency-Key": key}, extra_body={"ignore_eos": True},
    )
    iterator = iter(stream)
    next(iterator)
    with pytest.raises(openai.ConflictError) as conflict:
        _chat(client, key, max_tokens=64)
    assert conflict.value.code == "request_in_progress"
    text = "".join(c.choices[0].delta.content or "" for c in iterator if c.choices)
    replay = _chat(client, key, max_tokens=64)
    assert replay.headers.get("x-sluice-idempotent-replay") == "true"
    assert replay.parse().choices[0].message.content == text
    eventually(lambda: _rows(stack_database_url, key)[0] == 1)


def test_disconnect_is_recorded_unbilled_and_the_retry_runs_again(stack, client, stack_database_url):
    key = f"k-{uuid.uuid4().hex}"
    headers = {"Authorization": f"Bearer {stack.api_key}", "Idempotency-Key": key}
    body = {"model": "tiny-llama", "messages": MESSAGES, "max_tokens": 2000, "stream": True, "ignore_eos": True}
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", stack.gateway_url + "/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if '"content":"' in line and '"content":""' not in line:
                    break
    eventually(lambda: _rows(stack_database_url, key) == (0, 1))
    # The key was released: the retry runs the model (no replay) and is billed once.
    retry = _chat(client, key, max_tokens=5)
    assert "x-sluice-idempotent-replay" not in retry.headers
    eventually(lambda: _rows(stack_database_url, key) == (1, 1))


def test_a_bad_idempotency_key_is_400(client):
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, "x" * 300, max_tokens=1)
    assert error.value.param == "Idempotency-Key"
