"""A two-replica devstack: two replica processes on their own ports with
their own ids, and the scheduler watching both."""

import grpc
import httpx
import openai
import pytest

from integration.conftest import metric, scrape
from sluice.devstack.stack import LocalStack, StackPorts
from sluice.v1 import replica_pb2, replica_pb2_grpc

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def two_replicas(tiny_model_dir, tmp_path_factory):
    workdir = tmp_path_factory.mktemp("two-replicas")
    stack = LocalStack(
        model_dir=tiny_model_dir, log_dir=workdir / "logs", ports=StackPorts.ephemeral(num_replicas=2),
        cwd=workdir, num_replicas=2,
        # Embedded defaults (SQLite ledger, in-process buckets); small KV so two replicas start quickly.
        extra_env={"REDIS_URL": "", "SLUICE_DATABASE_URL": "", "SLUICE_KV_CACHE_BLOCKS": "256",
                   "SLUICE_CANARY_INTERVAL_S": "1"},
    )
    with stack.running(timeout_s=180):
        yield stack


def test_the_scheduler_sees_both_replicas_ready(two_replicas):
    samples = scrape(two_replicas.metrics_url("scheduler"))
    assert metric(samples, "sluice_scheduler_replicas_ready") == 2
    assert set(two_replicas.processes) == {"gateway", "router", "scheduler", "replica", "replica-1"}


def test_each_replica_reports_its_own_id_on_its_own_port(two_replicas):
    ids = []
    for address in two_replicas.replica_addresses:
        with grpc.insecure_channel(address) as channel:
            stream = replica_pb2_grpc.ReplicaStub(channel).WatchState(replica_pb2.WatchStateRequest(), timeout=10)
            ids.append(next(iter(stream)).replica_id)
            stream.cancel()
    assert ids == ["replica-0", "replica-1"]
    for index in range(2):
        assert httpx.get(two_replicas.metrics_url("replica", index), timeout=5).status_code == 200
        assert two_replicas.log("replica", index)


def test_a_request_is_served(two_replicas):
    client = openai.OpenAI(base_url=two_replicas.gateway_url + "/v1", api_key=two_replicas.api_key, max_retries=0)
    reply = client.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, extra_body={"ignore_eos": True})
    assert reply.usage.completion_tokens == 4
