"""The relay tokenizes a short prompt on the event loop (a thread would not
free the loop for any of it: the encode and the chat template hold the
GIL) and a long one on a thread behind the tenant's gate; either way the
scheduler hears the same ids' count and block hashes the tokenizer gives.

The real Relay and model registry (the tiny model's tokenizer); the
placement client records the Enqueue and refuses it, so no replica is
needed."""

from __future__ import annotations

import asyncio

import pytest

from sluice.outcomes import Reason
from sluice.router import relay as relay_module
from sluice.router.cache_scope import CacheScope
from sluice.router.catalog import single_model_catalog
from sluice.router.metrics import RouterMetrics
from sluice.router.models import ModelRegistry
from sluice.router.relay import INLINE_TOKENIZE_MAX_CHARS, Relay, prompt_block_hashes
from sluice.router.replica_channels import ReplicaChannels
from sluice.rpc.errors import ServiceError
from sluice.v1 import router_pb2, scheduler_pb2

BLOCK_TOKENS = 16


class RefusingPlacement:
    def __init__(self) -> None:
        self.enqueued: list[scheduler_pb2.Enqueue] = []

    async def place(self, enqueue: scheduler_pb2.Enqueue, timeout_s: float) -> scheduler_pb2.Dispatch:
        self.enqueued.append(enqueue)
        raise ServiceError.of(Reason.OVER_CAPACITY, "refused by the test")

    def release(self, request_id: str, output_tokens: int = 0) -> None:
        pass


@pytest.fixture(scope="module")
def registry(tiny_model_dir) -> ModelRegistry:
    return ModelRegistry(single_model_catalog("tiny", "tiny-v1", tiny_model_dir), created_unix_s=0.0)


async def enqueue_of(registry: ModelRegistry, request: router_pb2.GenerateRequest,
                     monkeypatch: pytest.MonkeyPatch) -> tuple[scheduler_pb2.Enqueue, int]:
    """What the scheduler was asked, and how many jobs went to a thread."""
    threads = []
    real_to_thread = asyncio.to_thread

    async def counting_to_thread(*args, **kwargs):
        threads.append(args[0])
        return await real_to_thread(*args, **kwargs)

    monkeypatch.setattr(relay_module.asyncio, "to_thread", counting_to_thread)
    placement = RefusingPlacement()
    relay = Relay(registry, placement, ReplicaChannels(), RouterMetrics.create(), placement_timeout_s=1.0,
                  kv_block_size_tokens=BLOCK_TOKENS)
    with pytest.raises(ServiceError, match="refused by the test"):
        async for _ in relay.generate(request):
            pass
    (enqueue,) = placement.enqueued
    return enqueue, len(threads)


def chat(request_id: str, content: str) -> router_pb2.GenerateRequest:
    return router_pb2.GenerateRequest(
        request_id=request_id, tenant="acme", model="tiny", max_output_tokens=8,
        chat=router_pb2.ChatMessages(messages=[router_pb2.ChatMessage(role="user", content=content)]),
    )


@pytest.mark.parametrize("chars, on_a_thread", [(200, False), (INLINE_TOKENIZE_MAX_CHARS + 10, True)],
                         ids=["short-on-the-loop", "long-on-a-thread"])
async def test_a_prompt_is_tokenized_where_it_costs_least_with_the_same_ids(registry, monkeypatch, chars,
                                                                            on_a_thread):
    content = ("def hello(): return 'world' " * (chars // 28 + 1))[:chars]
    enqueue, threads = await enqueue_of(registry, chat("r1", content), monkeypatch)
    assert threads == (1 if on_a_thread else 0)
    ids = registry.version("tiny-v1").tokenizer.apply_chat_template([{"role": "user", "content": content}],
                                                                      add_generation_prompt=True)
    assert enqueue.prompt_tokens == len(ids) and len(ids) > chars // 10
    assert list(enqueue.prompt_block_hashes) == prompt_block_hashes(ids, BLOCK_TOKENS, CacheScope().salt_for("acme"))


async def test_a_plain_prompt_is_measured_by_its_text(registry, monkeypatch):
    request = router_pb2.GenerateRequest(request_id="r2", tenant="acme", model="tiny", max_output_tokens=8,
                                         prompt_text="x" * (INLINE_TOKENIZE_MAX_CHARS + 1))
    _, threads = await enqueue_of(registry, request, monkeypatch)
    assert threads == 1
