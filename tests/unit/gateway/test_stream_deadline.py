"""A stream's backstop deadline: the class's allowance plus a time per
output token, only for a request that bounds its output."""

import time

import pytest

from sluice.gateway.auth import Tenant
from sluice.gateway.schemas import ChatCompletionRequest
from sluice.gateway.translate import StreamDeadline, generate_request
from sluice.v1 import common_pb2

DEADLINE = StreamDeadline(interactive_s=120.0, batch_s=7200.0, per_output_token_s=0.5)


def test_the_deadline_is_the_class_allowance_plus_time_per_token():
    assert DEADLINE.unix_s(common_pb2.SERVICE_CLASS_INTERACTIVE, 100, now_unix_s=1000.0) == 1000 + 120 + 50
    assert DEADLINE.unix_s(common_pb2.SERVICE_CLASS_UNSPECIFIED, 100, now_unix_s=1000.0) == 1000 + 120 + 50
    assert DEADLINE.unix_s(common_pb2.SERVICE_CLASS_BATCH, 100, now_unix_s=1000.0) == 1000 + 7200 + 50
    assert DEADLINE.unix_s(common_pb2.SERVICE_CLASS_INTERACTIVE, None, now_unix_s=1000.0) == 0.0  # unbounded: none


@pytest.mark.parametrize(("tier", "allowance_s"), [(None, 120.0), ("flex", 7200.0)])
def test_the_router_gets_it_as_deadline_unix_s(tier, allowance_s):
    body = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "service_tier": tier})
    before = time.time()
    request = generate_request(body, Tenant("acme"), "r1", default_max_tokens=0, deadline=DEADLINE)
    assert before + allowance_s + 5 <= request.deadline_unix_s <= time.time() + allowance_s + 5
    unbounded = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert generate_request(unbounded, Tenant("acme"), "r2", default_max_tokens=0, deadline=DEADLINE).deadline_unix_s == 0
