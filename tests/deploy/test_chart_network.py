"""NetworkPolicies and scraping: each hop takes traffic from its caller
only, every metrics port (the gateway's included) only from the monitoring
peer, and the PodMonitor scrapes that port on every pod."""

from __future__ import annotations

import pytest
import yaml

pytest.importorskip("helm_python", reason="pip install helm-python-sdk")

from chart_support import (  # noqa: E402
    CHART_DIR,
    example_values,
    network_policy,
    of_kind,
    peer_components,
    port_of,
    render_objects,
    workloads,
)


@pytest.fixture(scope="module")
def production_objects() -> list[dict]:
    return render_objects(example_values())


def metrics_port() -> int:
    return example_values().get("metrics", {}).get("port") or chart_defaults()["metrics"]["port"]


def chart_defaults() -> dict:
    return yaml.safe_load((CHART_DIR / "values.yaml").read_text())


def test_network_policies_let_each_hop_in_from_its_caller_only(production_objects) -> None:
    port = metrics_port()
    expected_callers = {"router": {"gateway"}, "scheduler": {"router"}, "replica": {"router", "scheduler"}}
    for role, callers in expected_callers.items():
        policy = network_policy(production_objects, role)
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == role
        grpc_rules = [r for r in policy["spec"]["ingress"] if any(p["port"] != port for p in r["ports"])]
        (grpc_rule,) = grpc_rules
        assert peer_components(grpc_rule) == callers
        (metrics_rule,) = [r for r in policy["spec"]["ingress"] if r not in grpc_rules]
        assert [p["port"] for p in metrics_rule["ports"]] == [port]
        (peer,) = metrics_rule["from"]
        assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}


def test_the_gateway_takes_http_from_anywhere_and_metrics_from_monitoring_only(production_objects) -> None:
    values = example_values()
    gateway = network_policy(production_objects, "gateway")
    public, metrics = gateway["spec"]["ingress"]
    assert "from" not in public and [p["port"] for p in public["ports"]] == [8000]
    assert [p["port"] for p in metrics["ports"]] == [metrics_port()]
    (peer,) = metrics["from"]
    assert peer["podSelector"] == values["networkPolicy"]["metricsFrom"]["podSelector"]


def test_network_policies_can_be_turned_off() -> None:
    values = example_values()
    values["networkPolicy"]["enabled"] = False
    assert not of_kind(render_objects(values), "NetworkPolicy")


def test_the_pod_monitor_scrapes_the_metrics_port_every_pod_has(production_objects) -> None:
    (monitor,) = of_kind(production_objects, "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")
    for workload in workloads(production_objects):
        # The role's own container (the router's tokenizer-sync sidecar has no server).
        (container,) = [c for c in workload["spec"]["template"]["spec"]["containers"]
                        if c["name"] == workload["metadata"]["labels"]["app.kubernetes.io/component"]]
        assert port_of(container, "metrics") == metrics_port(), workload["metadata"]["name"]
