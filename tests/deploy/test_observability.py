"""Dashboards and Prometheus rules: generated without drift, checked and unit
tested by the real promtool (Debian's prometheus package, installed by `make
observability-tools`), and shipped by the chart as the Grafana sidecar and
the Prometheus Operator expect.

The PrometheusRule and PodMonitor are custom resources that kubernetes-validate
has no schema for; their structure is checked here instead.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

helm = pytest.importorskip("helm_python", reason="pip install helm-python-sdk")
yaml = pytest.importorskip("yaml")
pytest.importorskip("grafanalib", reason="pip install grafanalib")

REPO_ROOT = Path(__file__).resolve().parents[2]
OBSERVABILITY_DIR = REPO_ROOT / "deploy" / "observability"
RULES_TEST = OBSERVABILITY_DIR / "rules_test.yaml"
RUNBOOK = REPO_ROOT / "docs" / "runbook.md"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load("sluice_deploy_render", REPO_ROOT / "deploy" / "render.py")
# generate.py imports its siblings by plain name, as when run as a script.
sys.path.insert(0, str(OBSERVABILITY_DIR))
generate = _load("sluice_observability_generate", OBSERVABILITY_DIR / "generate.py")
rules = sys.modules["rules"]


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool is missing: run `make observability-tools` (apt-get install prometheus)"
    return path


def render_objects(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [yaml.safe_load(document) for _, document in render.render_documents(values)]


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


@pytest.fixture(scope="module")
def example_objects() -> list[dict]:
    return render_objects(render.load_values(render.EXAMPLE_VALUES))


def rules_configmap(objects: list[dict]) -> dict:
    (configmap,) = [c for c in of_kind(objects, "ConfigMap") if "sluice-rules.yaml" in c["data"]]
    return configmap


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a document's headings (lowercase, punctuation
    but - and _ dropped, spaces to dashes)."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


# ---- generated, checked, tested --------------------------------------------------


def test_the_generated_dashboards_and_rules_are_up_to_date() -> None:
    assert generate.stale(generate.outputs()) == [], "run `python deploy/observability/generate.py`"


def test_promtool_checks_the_rules_file() -> None:
    result = subprocess.run([promtool(), "check", "rules", str(generate.RULES_FILE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_of_the_rules_pass() -> None:
    result = subprocess.run([promtool(), "test", "rules", str(RULES_TEST)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load(RULES_TEST.read_text())["tests"]
    fired = {case["alertname"] for test in tests for case in test.get("alert_rule_test", []) if case["exp_alerts"]}
    assert {a.name for a in rules.alerts()} <= fired


def test_every_alert_links_a_runbook_section_and_says_what_and_why() -> None:
    anchors = github_anchors(RUNBOOK.read_text())
    for alert in rules.alerts():
        assert alert.summary and alert.description, alert.name
        assert alert.runbook_anchor in anchors, f"{alert.name}: docs/runbook.md has no section #{alert.runbook_anchor}"


# ---- the chart ships them --------------------------------------------------------


def test_the_rendered_rules_file_passes_promtool_with_the_runbook_base(example_objects, tmp_path: Path) -> None:
    rules_file = tmp_path / "sluice-rules.yaml"
    rules_file.write_text(rules_configmap(example_objects)["data"]["sluice-rules.yaml"])
    result = subprocess.run([promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    base = render.load_values(render.EXAMPLE_VALUES)["observability"]["runbookBaseUrl"]
    urls = [r["annotations"]["runbook_url"] for g in yaml.safe_load(rules_file.read_text())["groups"]
            for r in g["rules"] if "alert" in r]
    assert urls and all(url.startswith(f"{base}docs/runbook.md#") for url in urls)


def test_the_prometheus_rule_carries_exactly_the_plain_files_rules(example_objects) -> None:
    (rule,) = of_kind(example_objects, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    plain = yaml.safe_load(rules_configmap(example_objects)["data"]["sluice-rules.yaml"])["groups"]
    assert rule["spec"]["groups"] == plain
    for group in plain:
        assert set(group) == {"name", "rules"}
        for r in group["rules"]:
            assert ("alert" in r) != ("record" in r) and r["expr"].strip(), r
    names = [r.get("alert") or r["record"] for g in plain for r in g["rules"]]
    assert {a.name for a in rules.alerts()} <= set(names)


def test_operator_objects_are_off_by_default_and_the_plain_rules_and_dashboards_on() -> None:
    objects = render_objects(None)
    assert of_kind(objects, "PrometheusRule") == [] and of_kind(objects, "PodMonitor") == []
    rules_configmap(objects)
    runbook_urls = [r["annotations"]["runbook_url"]
                    for g in yaml.safe_load(rules_configmap(objects)["data"]["sluice-rules.yaml"])["groups"]
                    for r in g["rules"] if "alert" in r]
    assert all(url.startswith("docs/runbook.md#") for url in runbook_urls)


def test_each_dashboard_is_a_configmap_the_grafana_sidecar_loads(example_objects) -> None:
    dashboards = [c for c in of_kind(example_objects, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard") == "1"]
    files = {path.name: path.read_text() for path in generate.DASHBOARDS_DIR.glob("*.json")}
    assert len(files) == 4
    shipped = {}
    for configmap in dashboards:
        assert configmap["metadata"]["annotations"] == {"grafana_folder": "Sluice"}
        (name,) = configmap["data"]
        shipped[name] = configmap["data"][name]
    assert {name: json.loads(text) for name, text in shipped.items()} == {name: json.loads(text) for name, text in files.items()}


def test_dashboards_template_datasource_model_and_class_and_describe_every_panel() -> None:
    for path in sorted(generate.DASHBOARDS_DIR.glob("*.json")):
        dashboard = json.loads(path.read_text())
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        assert set(variables) == {"datasource", "model", "class"}, path.name
        assert variables["datasource"]["type"] == "datasource"
        assert dashboard["panels"], path.name
        for panel in dashboard["panels"]:
            assert panel["description"], f"{path.name}: {panel['title']}"
            assert panel["datasource"] == "${datasource}"
            assert panel["targets"] and all(t["expr"] for t in panel["targets"])


def test_the_pod_monitor_scrapes_a_port_every_sluice_pod_has(example_objects) -> None:
    (monitor,) = of_kind(example_objects, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    endpoint_ports = {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]}
    assert all(e["path"] == "/metrics" and e["interval"] == "15s" for e in monitor["spec"]["podMetricsEndpoints"])
    pods = [d["spec"]["template"] for d in of_kind(example_objects, "Deployment")]
    assert pods
    for pod in pods:
        assert selector.items() <= pod["metadata"]["labels"].items()
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        assert ports & endpoint_ports, pod["metadata"]["labels"]
