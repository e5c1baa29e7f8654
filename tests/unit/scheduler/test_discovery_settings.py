"""SLUICE_REPLICA_DISCOVERY and its settings, validated once at start, and
the discovery they build (the Kubernetes configuration found the way a
laptop finds it: a kubeconfig, here one pointing at the fake API server of
tests/support/fake_kube_api.py, since no real one can run here)."""

import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from sluice.scheduler.__main__ import replica_discovery
from sluice.scheduler.discovery.endpoint_slices import EndpointSliceDiscovery, kube_api_client
from sluice.scheduler.discovery.static import StaticDiscovery
from sluice.scheduler.settings import SchedulerSettings
from support.fake_kube_api import ENDPOINT_SLICES, FakeKubeApi


def test_static_is_the_default_and_hands_over_its_list_once():
    settings = SchedulerSettings(replica_addresses="10.0.0.1:1, 10.0.0.2:2,")
    seen = []

    replica_discovery(settings).start(seen.append)

    assert settings.replica_discovery == "static"
    assert seen == [frozenset({"10.0.0.1:1", "10.0.0.2:2"})]


@pytest.mark.parametrize(("missing", "fields"), [
    ("SLUICE_REPLICA_SERVICES", {"kubernetes_namespace": "sluice"}),
    ("SLUICE_KUBERNETES_NAMESPACE", {"replica_services": "replica-v1"}),
    ("SLUICE_REPLICA_PORT_NAME", {"replica_services": "a", "kubernetes_namespace": "sluice", "replica_port_name": " "}),
])
def test_endpointslices_refuses_to_start_without_what_it_needs(missing, fields):
    with pytest.raises(ValidationError, match=f"SLUICE_REPLICA_DISCOVERY=endpointslices needs {missing}"):
        SchedulerSettings(replica_discovery="endpointslices", **fields)


def test_an_unknown_discovery_is_refused():
    with pytest.raises(ValidationError, match="static"):
        SchedulerSettings(replica_discovery="dns")


def test_the_environment_names_are_the_charts(monkeypatch):
    for name, value in {"SLUICE_REPLICA_DISCOVERY": "endpointslices", "SLUICE_REPLICA_SERVICES": "r-v1, r-v2",
                        "SLUICE_KUBERNETES_NAMESPACE": "prod", "SLUICE_REPLICA_PORT_NAME": "rpc",
                        "SLUICE_REPLICA_RESYNC_S": "30"}.items():
        monkeypatch.setenv(name, value)
    settings = SchedulerSettings()
    assert (settings.replica_service_list(), settings.kubernetes_namespace, settings.replica_port_name,
            settings.replica_resync_s) == (["r-v1", "r-v2"], "prod", "rpc", 30.0)


def test_endpointslices_follow_the_api_of_the_kubeconfig(tmp_path, monkeypatch):
    with FakeKubeApi() as api:
        api.put(ENDPOINT_SLICES, "prod", {
            "metadata": {"name": "r-v1-a", "labels": {"kubernetes.io/service-name": "r-v1"}},
            "addressType": "IPv4", "ports": [{"name": "grpc", "port": 50061}],
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}]})
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(json.dumps({  # JSON is YAML; the client reads either
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
            "users": [{"name": "fake", "user": {}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
        settings = SchedulerSettings(replica_discovery="endpointslices", replica_services="r-v1",
                                     kubernetes_namespace="prod")

        discovery = replica_discovery(settings)

        assert isinstance(discovery, EndpointSliceDiscovery)
        from kubernetes import client
        listed = client.DiscoveryV1Api(kube_api_client()).list_namespaced_endpoint_slice("prod")
        assert [s.metadata.name for s in listed.items] == ["r-v1-a"]


def test_no_kubernetes_configuration_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(RuntimeError, match="no Kubernetes API configuration: not in a pod"):
        kube_api_client()


def test_static_discovery_never_loads_the_kubernetes_client():
    code = ("import sys; from sluice.scheduler.__main__ import replica_discovery; "
            "from sluice.scheduler.settings import SchedulerSettings; "
            "replica_discovery(SchedulerSettings(replica_addresses='10.0.0.1:1')).start(print); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'kubernetes'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.splitlines() == ["frozenset({'10.0.0.1:1'})", "[]"]
