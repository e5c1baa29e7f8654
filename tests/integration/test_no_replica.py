"""Without a ready replica the gateway stays ready (its own stores work) and
requests get an early, clear 503 with Retry-After instead of hanging or, as
an unready gateway out of its Service would give them, connection errors.
/readyz/route says that no route exists."""

import httpx
import openai
import pytest

from sluice.devstack.stack import LocalStack, StackPorts

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def headless(tiny_model_dir, tmp_path_factory):
    stack = LocalStack(
        model_dir=tiny_model_dir,
        log_dir=tmp_path_factory.mktemp("headless-logs"),
        ports=StackPorts.ephemeral(),
        services=("scheduler", "router", "gateway"),
        cwd=tmp_path_factory.mktemp("headless-cwd"),
    )
    stack.start()
    try:
        stack.wait_alive()
        yield stack
    finally:
        stack.stop()


def test_the_gateway_stays_ready_without_a_ready_replica_and_says_no_route(headless):
    assert httpx.get(headless.gateway_url + "/readyz", timeout=5).status_code == 200
    assert httpx.get(headless.gateway_url + "/readyz/route", timeout=5).status_code == 503
    assert httpx.get(headless.gateway_url + "/healthz", timeout=5).status_code == 200


def test_requests_fail_fast_with_503_and_retry_after(headless):
    client = openai.OpenAI(base_url=headless.gateway_url + "/v1", api_key=headless.api_key, max_retries=0)
    with pytest.raises(openai.InternalServerError) as error:
        client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    response = error.value.response
    assert response.status_code == 503
    assert response.headers["x-sluice-reject-reason"] in {"no_replica", "scheduler_unavailable"}
    assert int(response.headers["retry-after"]) >= 1
