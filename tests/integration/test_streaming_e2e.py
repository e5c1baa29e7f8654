"""Chat completions through all four processes with the unmodified openai SDK."""

import openai
import pytest

pytestmark = pytest.mark.stack

MESSAGES = [{"role": "user", "content": "Write a Python function that adds two numbers."}]


@pytest.fixture
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0)


def test_streamed_chat_completion_arrives_in_order_with_usage(client):
    stream = client.chat.completions.create(
        model="tiny-llama", messages=MESSAGES, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert text
    usage = chunks[-1].usage
    assert chunks[-1].choices == []
    assert usage.completion_tokens == 16
    assert usage.prompt_tokens > len("Write a Python function") // 8  # templated and tokenized by the router
    assert usage.total_tokens == usage.prompt_tokens + 16
    assert {c.id for c in chunks} == {chunks[0].id}
    assert chunks[0].system_fingerprint == "tiny-llama-v1"


def test_greedy_stream_and_non_stream_produce_the_same_text(client):
    kwargs = dict(model="tiny-llama", messages=MESSAGES, max_tokens=24, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs)
    streamed = "".join(
        c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs) if c.choices
    )
    assert whole.choices[0].message.content == streamed
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 24
    assert whole.object == "chat.completion"


async def test_async_client_streams_concurrent_requests(stack):
    import asyncio

    client = openai.AsyncOpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0)

    async def one(i: int) -> int:
        stream = await client.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": f"request {i}"}],
            max_tokens=8, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
        )
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
        return usage.completion_tokens

    assert await asyncio.gather(*(one(i) for i in range(6))) == [8] * 6
    await client.close()


def test_completions_endpoint_streams_text(client):
    result = client.completions.create(model="tiny-llama", prompt="def add(a, b):", max_tokens=5,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert result.object == "text_completion"
    assert result.usage.completion_tokens == 5
    assert result.choices[0].text


def test_models_lists_the_served_alias(client):
    assert [m.id for m in client.models.list()] == ["tiny-llama"]


def test_stop_string_cuts_the_text_and_ends_with_stop(client):
    # A prompt of several KV blocks, so the repeats below hit the prefix cache.
    messages = [{"role": "user", "content": "Write a Python function that adds two numbers. " * 4}]
    kwargs = dict(model="tiny-llama", messages=messages, temperature=0, extra_body={"ignore_eos": True})
    full = client.chat.completions.create(max_tokens=40, **kwargs).choices[0].message.content
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert len(stop) == 3
    expected = full[: full.find(stop)]
    cut = client.chat.completions.create(max_tokens=40, stop=[stop, "\u2603never"], **kwargs)
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == expected
    assert cut.usage.completion_tokens < 40
    # Ended by the router on a stop string, the same prompt's cached prefix is still reported (and billed so).
    assert cut.usage.prompt_tokens >= 33 and cut.usage.prompt_tokens_details.cached_tokens >= 16
    streamed = client.chat.completions.create(max_tokens=40, stop=stop, stream=True, **kwargs)
    chunks = list(streamed)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_max_completion_tokens_and_continuous_usage(client):
    stream = client.chat.completions.create(
        model="tiny-llama", messages=MESSAGES, max_completion_tokens=6, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True}, extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    counts = [c.usage.completion_tokens for c in chunks if c.usage is not None]
    assert counts == sorted(counts) and counts[-1] == 6
    assert len(counts) >= 6  # usage on every content chunk, not only the last


def test_seeded_sampling_is_reproducible(client):
    kwargs = dict(model="tiny-llama", messages=MESSAGES, max_tokens=16, temperature=1.0, top_p=0.9, seed=1234,
                  extra_body={"ignore_eos": True, "top_k": 50})
    first = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs).choices[0].message.content == first


def test_min_tokens_and_content_parts(client):
    result = client.chat.completions.create(
        model="tiny-llama", max_tokens=5,
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}],
        extra_body={"min_tokens": 5},
    )
    assert result.usage.completion_tokens == 5


def test_completions_stream(client):
    chunks = list(client.completions.create(model="tiny-llama", prompt="import os\n", max_tokens=4, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    assert chunks[-1].usage.completion_tokens == 4
    assert all(c.object == "text_completion" for c in chunks)


async def test_async_client_non_streaming(stack):
    client = openai.AsyncOpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0)
    result = await client.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=4,
                                                  extra_body={"ignore_eos": True})
    assert result.choices[0].finish_reason == "length"
    assert result.usage.completion_tokens == 4
    assert result.usage.prompt_tokens_details.cached_tokens == 0
    await client.close()
