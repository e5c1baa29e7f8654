"""What the chart tests share: rendering through deploy/render.py (the real
Helm v4 Go SDK in the `helm-python-sdk` wheel: no helm binary, cluster or
network) and small accessors over the rendered objects.

Imported by the tests in this folder as `chart_support` (pytest puts the
folder on sys.path: tests/ has no __init__.py).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "sluice"
GRPC_ROLES = ("router", "scheduler", "replica")
CONTROL_PLANE_ROLES = ("gateway", "router", "scheduler")
# Custom resources kubernetes-validate has no schema for (the Prometheus
# Operator's PodMonitor and PrometheusRule, KEDA's ScaledObject): schema
# validation skips them on purpose; their structure is tested directly
# (here and in tests/deploy/test_observability.py).
CUSTOM_RESOURCE_API_VERSIONS = {"monitoring.coreos.com/v1", "keda.sh/v1alpha1"}
WORKLOAD_KINDS = ("Deployment", "StatefulSet")


def _load_render_module():
    spec = importlib.util.spec_from_file_location("sluice_deploy_render", REPO_ROOT / "deploy" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render_module()


# ---- values -------------------------------------------------------------------


def example_values(name: str = "production") -> dict[str, Any]:
    """One of the chart's examples/values-<name>.yaml, parsed as `helm -f` would."""
    return render.load_values(render.EXAMPLES_DIR / f"values-{name}.yaml")


def example_names() -> list[str]:
    return sorted(p.stem.removeprefix("values-") for p in render.EXAMPLES_DIR.glob("values-*.yaml"))


def with_version_volume() -> dict[str, Any]:
    """The production example plus a version whose checkpoint has its own volume."""
    values = example_values()
    values["modelVersions"].append(
        {
            "version": "own-volume-v1",
            "alias": "own-volume",
            "modelPath": "checkpoint",
            "weight": 100,
            "volume": {"persistentVolumeClaim": {"claimName": "own-volume-v1", "readOnly": True}},
        }
    )
    return values


def without_policies_and_gateway_pdb() -> dict[str, Any]:
    values = example_values()
    values["networkPolicy"]["enabled"] = False
    values["gateway"]["pdb"] = {"enabled": False, "maxUnavailable": 1}
    return values


def renderings() -> dict[str, Any]:
    """Every values set the validity and policy tests cover: the defaults,
    each example file, and variants that switch optional objects."""
    cases: dict[str, Any] = {"defaults": lambda: None}
    for name in example_names():
        cases[f"example-{name}"] = lambda name=name: example_values(name)
    cases["per-version-volume"] = with_version_volume
    cases["no-policies-no-gateway-pdb"] = without_policies_and_gateway_pdb
    return cases


# ---- rendering ----------------------------------------------------------------


def render_objects(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [yaml.safe_load(document) for _, document in render.render_documents(values)]


def render_notes(values: dict[str, Any] | None) -> str:
    import helm_python as helm

    with helm.Chart.load(CHART_DIR) as chart:
        rendered = chart.render(values, name=render.RELEASE_NAME, namespace=render.NAMESPACE, is_install=True)
    return rendered["sluice/templates/NOTES.txt"]


def kube_version_bounds() -> tuple[str, str | None]:
    """(lowest, highest or None) Kubernetes version Chart.yaml's kubeVersion admits."""
    constraint = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())["kubeVersion"]
    lower = re.search(r">=\s*v?(\d+\.\d+\.\d+)", constraint)
    upper = re.search(r"<\s*v?(\d+\.\d+\.\d+)", constraint)
    assert lower, f"kubeVersion {constraint!r} has no lower bound"
    return lower.group(1), upper.group(1) if upper else None


# ---- accessors ----------------------------------------------------------------


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def component(obj: dict) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def workloads(objects: list[dict]) -> list[dict]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def deployments(objects: list[dict], role: str) -> list[dict]:
    return [d for d in workloads(objects) if component(d) == role]


def the_deployment(objects: list[dict], role: str) -> dict:
    (deployment,) = deployments(objects, role)
    return deployment


def pod_spec(workload: dict) -> dict:
    return workload["spec"]["template"]["spec"]


def containers(deployment: dict) -> list[dict]:
    return pod_spec(deployment)["containers"]


def all_containers(workload: dict) -> list[dict]:
    spec = pod_spec(workload)
    return spec.get("initContainers", []) + spec["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def env_values(container: dict) -> dict[str, str]:
    return {name: e["value"] for name, e in env_of(container).items() if "value" in e}


def port_of(container: dict, name: str) -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def network_policy(objects: list[dict], role: str) -> dict:
    (policy,) = [p for p in of_kind(objects, "NetworkPolicy") if component(p) == role]
    return policy


def peer_components(rule: dict) -> set[str]:
    return {
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"]
        for peer in rule["from"]
        if "podSelector" in peer and "namespaceSelector" not in peer
    }


def volumes_by_name(workload: dict) -> dict[str, dict]:
    return {v["name"]: v for v in pod_spec(workload).get("volumes", [])}


def selector_of(workload: dict) -> dict[str, str]:
    return workload["spec"]["selector"]["matchLabels"]
