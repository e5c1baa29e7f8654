"""Hypothesis-driven bodies through the real gateway, chat template,
tokenizer and detokenizer: arbitrary Unicode (lone surrogates, control
characters, combining marks, astral planes), deep and odd JSON, extreme
numbers. Whatever is sent: no 5xx, and a served stream is valid UTF-8 JSON
events ending in [DONE]. Bounded: a few dozen examples, max_tokens <= 4."""

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.stack

# Every code point, surrogates included (JSON can carry them as \ud800).
ANY_CHAR = st.characters(codec=None, categories=None)
TEXT = st.text(alphabet=ANY_CHAR, max_size=40) | st.sampled_from(
    ["e\u0301\u0301\u0301", "\x00\x07\x1b[2J", "\ufeff\u202e", "\U0001F469\u200d\U0001F4BB", "\udbff", ""])
NUMBER = st.integers(min_value=-(2**80), max_value=2**80) | st.floats(allow_nan=False) | st.sampled_from(
    [0, -1, 2**32, 2**63, 1e308, -0.0])
JSON_VALUE = st.recursive(st.none() | st.booleans() | NUMBER | TEXT,
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
                          max_leaves=12)

MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "developer"]) | TEXT,
     "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)
     | JSON_VALUE},
    optional={"name": TEXT},
)
BODY = st.fixed_dictionaries(
    {"model": st.just("tiny-llama") | TEXT, "messages": st.lists(MESSAGE, min_size=0, max_size=3) | JSON_VALUE},
    optional={
        "max_tokens": st.integers(min_value=1, max_value=4) | NUMBER | TEXT,
        "temperature": NUMBER | TEXT, "top_p": NUMBER, "seed": NUMBER, "min_tokens": NUMBER,
        "stop": TEXT | st.lists(TEXT, max_size=5), "stream": st.booleans(), "n": NUMBER,
        "service_tier": st.sampled_from(["auto", "default", "flex"]) | TEXT,
        "metadata": JSON_VALUE, "user": TEXT, "stream_options": JSON_VALUE,
    },
)


def _check_stream(response: httpx.Response) -> None:
    lines = response.read().split(b"\n")
    events = [line[6:] for line in lines if line.startswith(b"data: ")]
    assert events and events[-1] == b"[DONE]"
    for event in events[:-1]:
        json.loads(event.decode("utf-8"))  # strict UTF-8, whole JSON


@pytest.fixture(scope="module")
def http(stack):
    with httpx.Client(base_url=stack.gateway_url, timeout=60.0,
                      headers={"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"}) as c:
        yield c


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(body=BODY)
def test_no_body_gets_a_server_error(http, body):
    if isinstance(body.get("max_tokens"), int) and not 1 <= body["max_tokens"] <= 4:
        body["max_tokens"] = 4  # keep any served request short
    body.setdefault("max_tokens", 2)
    raw = json.dumps(body).encode()  # \ud800 stays an escape: valid JSON, no valid text
    with http.stream("POST", "/v1/chat/completions", content=raw) as response:
        assert response.status_code < 500, response.read()[:500]
        if response.status_code == 200 and body.get("stream") is True:
            _check_stream(response)
        elif response.status_code != 200:
            assert "error" in json.loads(response.read())


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(codec="utf-8"), min_size=1, max_size=60))
def test_any_text_streams_back_as_valid_utf8(http, text):
    body = {"model": "tiny-llama", "messages": [{"role": "user", "content": text}], "max_tokens": 4,
            "stream": True, "stop": [text[:3]]}
    with http.stream("POST", "/v1/chat/completions", content=json.dumps(body).encode()) as response:
        assert response.status_code == 200, response.read()[:500]
        _check_stream(response)
