"""The scheduler finding its replicas from EndpointSlices, end to end: the
real four services and two real replica processes, the scheduler set to
SLUICE_REPLICA_DISCOVERY=endpointslices with a kubeconfig that points at
the fake Kubernetes API server of tests/support/fake_kube_api.py (no API
server can run here; the scheduler uses the real `kubernetes` client on it).

The two replicas listen on different ports of 127.0.0.1, so each has its own
slice (the EndpointSlice controller splits a Service's endpoints by port
set the same way), which also covers merging a Service's several slices."""

import asyncio
import json

import grpc
import httpx
import pytest

from integration.conftest import eventually, metric, scrape
from sluice.devstack.stack import LocalStack, StackPorts
from sluice.v1 import replica_pb2, replica_pb2_grpc
from support.fake_kube_api import ENDPOINT_SLICES, FakeKubeApi

pytestmark = [pytest.mark.stack, pytest.mark.timeout(240)]

NS = "sluice"
SERVICE = "sluice-replica-tiny-llama-v1"


def replica_slice(index: int, address: str, ready: bool) -> dict:
    host, port = address.rsplit(":", 1)
    return {
        "metadata": {"name": f"{SERVICE}-{index}", "labels": {"kubernetes.io/service-name": SERVICE}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": int(port), "protocol": "TCP"}],
        "endpoints": [{"addresses": [host], "conditions": {"ready": ready, "serving": ready, "terminating": False},
                       "targetRef": {"kind": "Pod", "name": f"replica-{index}"}}],
    }


@pytest.fixture(scope="module")
def kube_api():
    with FakeKubeApi(max_watch_s=30) as api:
        yield api


@pytest.fixture(scope="module")
def discovered(tiny_model_dir, tmp_path_factory, kube_api):
    workdir = tmp_path_factory.mktemp("discovered-replicas")
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": kube_api.url}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": NS}}]}))
    stack = LocalStack(
        model_dir=tiny_model_dir, log_dir=workdir / "logs", ports=StackPorts.ephemeral(num_replicas=2),
        cwd=workdir, num_replicas=2,
        extra_env={
            "SLUICE_REPLICA_DISCOVERY": "endpointslices",
            "SLUICE_REPLICA_SERVICES": SERVICE,
            "SLUICE_KUBERNETES_NAMESPACE": NS,
            "SLUICE_REPLICA_ADDRESSES": "",  # the static list is not what finds them
            "KUBECONFIG": str(kubeconfig),
            "SLUICE_MAX_NUM_SEQS": "1",  # one seat each: two concurrent requests need both replicas
            # Embedded defaults (SQLite ledger, in-process buckets); small KV so two replicas start quickly.
            "REDIS_URL": "", "SLUICE_DATABASE_URL": "", "SLUICE_KV_CACHE_BLOCKS": "256",
            "SLUICE_CANARY_INTERVAL_S": "1", "SLUICE_TORCH_THREADS": "1",
        },
    )
    for index, address in enumerate(stack.replica_addresses):
        kube_api.put(ENDPOINT_SLICES, NS, replica_slice(index, address, ready=True))
    with stack.running(timeout_s=180):
        yield stack


def placements(stack: LocalStack) -> dict[str, float]:
    samples = scrape(stack.metrics_url("scheduler"))
    return {replica: metric(samples, "sluice_placements_total", replica=replica) for replica in stack.replica_ids}


async def complete(client: httpx.AsyncClient, stack: LocalStack, content: str) -> None:
    response = await client.post(
        "/v1/chat/completions", headers={"Authorization": f"Bearer {stack.api_key}"},
        json={"model": "tiny-llama", "messages": [{"role": "user", "content": content}], "max_tokens": 24,
              "ignore_eos": True})
    assert response.status_code == 200, response.text


def replica_says_ready(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        stream = replica_pb2_grpc.ReplicaStub(channel).WatchState(replica_pb2.WatchStateRequest(), timeout=10)
        ready = next(iter(stream)).ready
        stream.cancel()
    return ready


async def test_the_scheduler_places_on_every_ready_pod_and_drops_one_its_slice_marks_not_ready(discovered, kube_api):
    stack = discovered
    scheduler_metrics = lambda: scrape(stack.metrics_url("scheduler"))  # noqa: E731
    assert metric(scheduler_metrics(), "sluice_scheduler_replicas_ready") == 2  # both found through the slices
    watches = [r for r in kube_api.requests if r.query.get("watch") == "true"]
    assert watches and watches[0].query["labelSelector"] == f"kubernetes.io/service-name in ({SERVICE})"

    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=60) as client:
        # One seat per replica: two at once land on both.
        await asyncio.gather(complete(client, stack, "first"), complete(client, stack, "second"))
        placed = placements(stack)
        assert all(count >= 1 for count in placed.values()), placed

        # replica-1's pod goes not ready (its readiness probe failed, say): the process and its
        # state stream are fine, yet it must leave placement now.
        kube_api.put(ENDPOINT_SLICES, NS, replica_slice(1, stack.replica_addresses[1], ready=False))
        eventually(lambda: metric(scheduler_metrics(), "sluice_scheduler_replicas_ready") == 1, timeout_s=10)
        assert f"replica {stack.replica_addresses[1]} (service {SERVICE}) leaves placement: not ready" in stack.log(
            "scheduler")
        assert "stopped watching replica" in stack.log("scheduler")
        assert stack.processes["replica-1"].poll() is None and replica_says_ready(stack.replica_addresses[1])

        before = placements(stack)
        for n in range(3):
            await complete(client, stack, f"after {n}")
        after = placements(stack)
        assert after["replica-1"] == before["replica-1"]
        assert after["replica-0"] == before["replica-0"] + 3

        # Ready again: it comes back without a scheduler restart.
        kube_api.put(ENDPOINT_SLICES, NS, replica_slice(1, stack.replica_addresses[1], ready=True))
        eventually(lambda: metric(scheduler_metrics(), "sluice_scheduler_replicas_ready") == 2, timeout_s=10)
        await asyncio.gather(complete(client, stack, "third"), complete(client, stack, "fourth"))
        assert placements(stack)["replica-1"] == after["replica-1"] + 1
    assert stack.processes["scheduler"].poll() is None
