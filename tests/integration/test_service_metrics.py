"""Each service's /metrics on the real processes after streamed traffic:
the replica's request phases and batch composition, the scheduler's tenant
queue age family, and every service's process collectors.

Counts are read as the difference between a scrape before and one after,
since the stack is shared with the other integration tests."""

import httpx
import openai
import pytest

from integration.conftest import metric, scrape

pytestmark = pytest.mark.stack

NUM_REQUESTS = 3
MAX_TOKENS = 8


def stream_one(client: openai.OpenAI, i: int) -> int:
    chunks = list(client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "user", "content": f"count to {i}"}], max_tokens=MAX_TOKENS,
        temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
    ))
    return chunks[-1].usage.completion_tokens


def test_streamed_requests_show_in_the_replica_phase_and_step_metrics(stack):
    client = openai.OpenAI(base_url=stack.gateway_url + "/v1", api_key=stack.api_key, max_retries=0)
    replica_url = stack.metrics_url("replica")
    before = scrape(replica_url)
    assert [stream_one(client, i) for i in range(NUM_REQUESTS)] == [MAX_TOKENS] * NUM_REQUESTS
    after = scrape(replica_url)

    def grew(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    interactive = {"replica": "replica-0", "class": "interactive"}
    for phase in ("queue", "prefill", "decode"):
        assert grew(f"sluice_request_{phase}_time_seconds_count", **interactive) >= NUM_REQUESTS, phase
        assert metric(after, f"sluice_request_{phase}_time_seconds_sum", **interactive) > 0, phase
    # Every output token after the first is one decode token of a step.
    assert grew("sluice_engine_step_tokens_total", kind="decode") >= NUM_REQUESTS * (MAX_TOKENS - 1)
    assert grew("sluice_engine_step_tokens_total", kind="prefill") >= NUM_REQUESTS
    assert grew("sluice_engine_step_duration_seconds_count") >= MAX_TOKENS
    assert any(name == "sluice_replica_canary_failures_total" for name, _ in after)


def test_every_service_serves_the_process_collectors(stack):
    for service in ("router", "scheduler", "replica"):
        samples = scrape(stack.metrics_url(service))
        assert metric(samples, "process_cpu_seconds_total") > 0, service
        assert metric(samples, "process_resident_memory_bytes") > 0, service


def test_the_scheduler_declares_the_tenant_queue_age(stack):
    # A series exists only while a tenant has work queued at a publish (the
    # unit tests check its values); the family is always declared.
    text = httpx.get(stack.metrics_url("scheduler"), timeout=5.0).text
    assert "# TYPE sluice_tenant_queue_oldest_age_seconds gauge" in text
