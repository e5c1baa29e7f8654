"""Bad input gets a clear error in OpenAI's shape, surfacing as the SDK's
own exception classes, before any replica work."""

import httpx
import openai
import pytest

pytestmark = pytest.mark.stack


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0)


def _chat(client, **overrides):
    kwargs = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **overrides}
    return client.chat.completions.create(**kwargs)


def test_bad_key_is_401(stack):
    bad = openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as error:
        _chat(bad)
    assert error.value.code == "invalid_api_key"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as error:
        _chat(client, model="no-such-model")
    assert error.value.code == "model_not_found"


def test_invalid_field_is_400_naming_the_field(client):
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, n=2)
    assert error.value.param == "n"
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, temperature=5)
    assert error.value.param == "temperature"


def test_prompt_over_the_context_is_400_context_length_exceeded(client):
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, messages=[{"role": "user", "content": "word " * 5000}])
    assert error.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, max_tokens=5000)
    assert error.value.code == "context_length_exceeded"


def test_malformed_json_and_oversized_bodies(stack):
    headers = {"Authorization": f"Bearer {stack.api_key}", "Content-Type": "application/json"}
    url = stack.gateway_url + "/v1/chat/completions"
    response = httpx.post(url, content=b"{not json", headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    response = httpx.post(url, content=b"x" * (9 * 1024 * 1024), headers=headers)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_interactive_prompt_cap_is_below_the_context_and_flex_may_exceed_it(client):
    long_prompt = [{"role": "user", "content": "word " * 2500}]  # ~2.5K tokens: over the cap, under the context
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, messages=long_prompt)
    assert error.value.code == "context_length_exceeded"
    assert "interactive" in error.value.message
    result = _chat(client, messages=long_prompt, service_tier="flex", max_tokens=1)
    assert result.usage.prompt_tokens > 2048


def test_absurd_prompts_are_refused_at_the_gateway_before_tokenizing(stack, client):
    from integration.conftest import metric, scrape

    before = metric(scrape(stack.metrics_url("router")), "sluice_router_requests_total")
    with pytest.raises(openai.BadRequestError) as error:
        _chat(client, messages=[{"role": "user", "content": "x" * 2_000_001}])
    assert error.value.code == "context_length_exceeded"
    assert metric(scrape(stack.metrics_url("router")), "sluice_router_requests_total") == before
