"""The key the router's version choice hashes (relay.affinity_of)."""

from sluice.router.relay import affinity_of
from sluice.v1 import router_pb2


def test_an_idempotency_key_decides_the_version_not_the_attempt():
    first = router_pb2.GenerateRequest(request_id="attempt-1", tenant="acme", affinity_key="order-7")
    retry = router_pb2.GenerateRequest(request_id="attempt-2", tenant="acme", affinity_key="order-7")
    assert affinity_of(first) == affinity_of(retry)


def test_keys_are_per_tenant_and_no_key_falls_back_to_the_attempt():
    acme = router_pb2.GenerateRequest(request_id="a", tenant="acme", affinity_key="1")
    other = router_pb2.GenerateRequest(request_id="a", tenant="globex", affinity_key="1")
    assert affinity_of(acme) != affinity_of(other)
    assert affinity_of(router_pb2.GenerateRequest(request_id="attempt-9", tenant="acme")) == "attempt-9"
