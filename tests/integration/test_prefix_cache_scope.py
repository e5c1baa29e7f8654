"""The prefix cache is scoped per tenant on the real stack: a prompt one
tenant sent is a cache hit for that tenant again, never for another (whose
first token would otherwise come sooner, telling it someone sent it)."""

import uuid

import pytest

from integration.test_keys_usage_limits import client, create_key, wait_until_accepted

pytestmark = pytest.mark.stack

SYSTEM = "You are the prefix-scope test's assistant; answer in one word. " * 10  # many full KV blocks


def cached_tokens(c, question: str) -> int:
    response = c.chat.completions.create(
        model="tiny-llama", max_tokens=1, extra_body={"ignore_eos": True},
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}])
    return response.usage.prompt_tokens_details.cached_tokens


def test_a_tenants_cached_prompt_is_never_another_tenants_hit(stack, stack_database_url):
    mine = client(stack, create_key(stack_database_url, f"scope-a-{uuid.uuid4().hex[:6]}"))
    theirs = client(stack, create_key(stack_database_url, f"scope-b-{uuid.uuid4().hex[:6]}"))
    wait_until_accepted(mine)
    wait_until_accepted(theirs)
    assert cached_tokens(mine, "first") == 0
    assert cached_tokens(mine, "again") > 100  # the system prompt's blocks, in its own scope
    assert cached_tokens(theirs, "first") == 0  # the same tokens, another tenant: computed afresh
    assert cached_tokens(theirs, "again") > 100
