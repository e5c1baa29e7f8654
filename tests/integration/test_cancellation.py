"""A client that goes away cancels the work at every hop: the gateway's
stream, the router's relay, the scheduler's reservation and the replica's
sequence (whose KV blocks come back)."""

import time

import httpx
import pytest

from integration.conftest import eventually, metric, scrape

pytestmark = pytest.mark.stack

LONG_OUTPUT_TOKENS = 3000  # minutes of CPU decoding if nothing cancelled it


def _all_metrics(stack) -> dict[str, dict]:
    return {
        "gateway": scrape(stack.gateway_url + "/metrics"),
        "router": scrape(stack.metrics_url("router")),
        "scheduler": scrape(stack.metrics_url("scheduler")),
        "replica": scrape(stack.metrics_url("replica")),
    }


def _body(stream: bool) -> dict:
    return {
        "model": "tiny-llama",
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": LONG_OUTPUT_TOKENS,
        "ignore_eos": True,
        "stream": stream,
    }


def _assert_everything_released(stack, before: dict, *, gateway_outcome: str) -> None:
    def settled() -> bool:
        now = _all_metrics(stack)
        return (
            metric(now["gateway"], "sluice_gateway_streams_active") == 0
            and metric(now["gateway"], "sluice_gateway_requests_total", outcome="cancelled")
            == metric(before["gateway"], "sluice_gateway_requests_total", outcome="cancelled") + 1
            and metric(now["router"], "sluice_router_streams_active") == 0
            and metric(now["router"], "sluice_router_requests_total", outcome="cancelled")
            == metric(before["router"], "sluice_router_requests_total", outcome="cancelled") + 1
            and metric(now["scheduler"], "sluice_scheduler_reservations") == 0
            and metric(now["replica"], "sluice_replica_requests_cancelled_total")
            == metric(before["replica"], "sluice_replica_requests_cancelled_total") + 1
            and metric(now["replica"], "sluice_num_requests_running") == 0
        )

    eventually(settled, timeout_s=20)
    after = _all_metrics(stack)
    # Every KV block is free again (the canary's one-token probes come and go).
    eventually(lambda: metric(scrape(stack.metrics_url("replica")), "sluice_kv_blocks", state="used") == 0)
    # The replica stopped generating for it long before max_tokens...
    generated = metric(after["replica"], "sluice_replica_generation_tokens_total") - metric(
        before["replica"], "sluice_replica_generation_tokens_total"
    )
    assert generated < LONG_OUTPUT_TOKENS / 2
    # ...and stays stopped (only the once-a-second canary token remains).
    time.sleep(1.5)
    later = metric(scrape(stack.metrics_url("replica")), "sluice_replica_generation_tokens_total")
    assert later - metric(after["replica"], "sluice_replica_generation_tokens_total") <= 3


def test_streaming_client_disconnect_cancels_every_hop(stack):
    before = _all_metrics(stack)
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", stack.gateway_url + "/v1/chat/completions", json=_body(True),
                           headers=headers) as response:
            assert response.status_code == 200
            content_events = 0
            for line in response.iter_lines():
                if line.startswith("data:") and '"content":"' in line and '"content":""' not in line:
                    content_events += 1
                if content_events == 3:
                    break
        # Leaving the block closes the connection mid-stream.
    running = metric(scrape(stack.metrics_url("replica")), "sluice_replica_generation_tokens_total")
    assert running - metric(before["replica"], "sluice_replica_generation_tokens_total") >= 3
    _assert_everything_released(stack, before, gateway_outcome="cancelled")


def test_non_streaming_client_disconnect_cancels_every_hop(stack):
    before = _all_metrics(stack)
    headers = {"Authorization": f"Bearer {stack.api_key}"}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(stack.gateway_url + "/v1/chat/completions", json=_body(False), headers=headers, timeout=1.5)
    _assert_everything_released(stack, before, gateway_outcome="cancelled")
