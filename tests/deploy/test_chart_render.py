"""The chart renders with the real Helm SDK for the defaults and every
example, every object is valid Kubernetes at both ends of the chart's
kubeVersion range, and the checked-in manifests are the defaults rendered.

Validation uses the Kubernetes OpenAPI schemas kubernetes-validate ships, in
strict mode (unknown fields are errors). No API server is involved: what only
a cluster can check (admission, scheduling) is out of reach here.
"""

from __future__ import annotations

import json

import pytest

helm = pytest.importorskip("helm_python", reason="pip install helm-python-sdk")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
pytest.importorskip("kubernetes_validate.utils")
yaml = pytest.importorskip("yaml")

from chart_support import (  # noqa: E402
    CUSTOM_RESOURCE_API_VERSIONS,
    REPO_ROOT,
    example_names,
    example_values,
    kube_version_bounds,
    render,
    render_objects,
    renderings,
)

RENDERINGS = renderings()


def _validated_versions() -> list[str]:
    """The oldest and newest Kubernetes versions the chart admits that
    kubernetes-validate has schemas for."""
    lowest, highest = kube_version_bounds()
    shipped = sorted(set(kubernetes_validate.utils.all_versions()), key=_tuple)
    newest = shipped[-1] if highest is None else max(v for v in shipped if _tuple(v) < _tuple(highest))
    assert lowest in shipped, f"kubernetes-validate has no schemas for the chart's oldest version {lowest}"
    return [lowest, newest]


def _tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


KUBERNETES_VERSIONS = _validated_versions()


def test_the_examples_are_the_ones_the_docs_name() -> None:
    assert set(example_names()) >= {"cpu", "two-versions", "production"}


@pytest.mark.parametrize("kubernetes_version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_every_rendered_object_is_valid_kubernetes_strict(rendering: str, kubernetes_version: str) -> None:
    objects = render_objects(RENDERINGS[rendering]())
    assert objects, "nothing rendered"
    errors = []
    for obj in objects:
        if obj["apiVersion"] in CUSTOM_RESOURCE_API_VERSIONS:
            continue  # no schema in kubernetes-validate; see CUSTOM_RESOURCE_API_VERSIONS
        try:
            kubernetes_validate.validate(obj, kubernetes_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {error.message} at {list(error.path)}")
    assert not errors, "\n".join(errors)


def test_the_validated_range_spans_more_than_one_version() -> None:
    oldest, newest = KUBERNETES_VERSIONS
    assert _tuple(oldest) < _tuple(newest)


def test_rendering_the_default_values_equals_the_checked_in_manifests() -> None:
    checked_in = render.RENDERED.read_text()
    assert render.render_default() == checked_in, "deploy/k8s/sluice.yaml is stale: run `python deploy/render.py`"


@pytest.mark.parametrize("rendering", ["defaults", "example-production"])
def test_every_object_has_a_unique_kind_and_name(rendering: str) -> None:
    objects = render_objects(RENDERINGS[rendering]())
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys))
    namespaced = [o for o in objects if o["kind"] != "PriorityClass"]
    assert {o["metadata"]["namespace"] for o in namespaced} == {render.NAMESPACE}


@pytest.mark.parametrize("rendering", ["defaults", *(f"example-{n}" for n in example_names())])
def test_helm_lint_strict_finds_no_warnings_at_either_end_of_the_range(rendering: str) -> None:
    for version in KUBERNETES_VERSIONS:
        report = helm.lint(render.CHART_DIR, RENDERINGS[rendering](), strict=True, kube_version=f"v{version}")
        assert report["errors"] == [], version
        # Severity 1 is informational ("icon is recommended"); 2 = warning, 3 = error.
        assert [m for m in report["messages"] if m["severity"] >= 2] == [], version


@pytest.mark.parametrize(
    ("model_versions", "message"),
    [
        (
            [
                {"version": "m-1.0", "alias": "m", "modelPath": "a", "weight": 1},
                {"version": "m-1-0", "alias": "m", "modelPath": "b", "weight": 1},
            ],
            "same object names",
        ),
        ([{"version": "m-1", "alias": "m", "modelPath": "a", "weight": 0}], "weight 0"),
    ],
    ids=["colliding-names", "all-weights-zero"],
)
def test_the_chart_refuses_model_versions_the_router_or_cluster_would(model_versions, message) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render.render_documents({"modelVersions": model_versions})


def test_schema_rejects_the_latest_tag_and_unknown_keys() -> None:
    with helm.Chart.load(render.CHART_DIR) as chart:
        chart.validate_schema(example_values())
        for bad in (
            {"images": {"replica": {"tag": "latest"}}},
            {"replicaCount": 3},
            {"modelVersions": []},
            {"modelVersions": [{"version": "v1", "alias": "m", "modelPath": "m", "weight": -1}]},
            {"replicaDefaults": {"dtype": "int8"}},
            {"backends": {"database": "mysql"}},
            {"backends": {"limits": "memcached"}},
            {"gateway": {"storage": {"type": "hostPath"}}},
            {"replicaDefaults": {"autoscaling": {"kvOccupancy": 1.5}}},
        ):
            with pytest.raises(helm.HelmValuesError):
                chart.validate_schema(bad)


@pytest.mark.parametrize("bad", [
    {"scheduler": {"admission": {"tenantMaxKvShare": 1.5}}},
    {"scheduler": {"admission": {"interactiveTtftSloS": 0}}},
    {"scheduler": {"admission": {"tenantLimits": {"acme": {"max_share": 0.5}}}}},
    {"scheduler": {"admission": {"tenantLimits": {"acme": {"max_active_seqs": 0}}}}},
    {"scheduler": {"dispatch": {"batchMaxShare": 0}}},
    {"scheduler": {"dispatch": {"longPrefillsPerReplica": 0}}},
    {"scheduler": {"admission": {"sloS": 2}}},
    {"router": {"kvBlockSizeTokens": 0}},
    {"replicaDefaults": {"interactivePreemptAfterS": -1}},
    {"replicaDefaults": {"interactivePreemptAfterS": "never"}},
], ids=lambda bad: json.dumps(bad, separators=(",", ":")))
def test_schema_rejects_admission_knobs_the_code_would(bad: dict) -> None:
    with helm.Chart.load(render.CHART_DIR) as chart:
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(bad)


# ---- dev loop --------------------------------------------------------------------------


def test_skaffold_builds_both_images_and_deploys_this_chart() -> None:
    config = yaml.safe_load((REPO_ROOT / "skaffold.yaml").read_text())
    artifacts = {a["image"]: a for a in config["build"]["artifacts"]}
    assert set(artifacts) == {"sluice/control-plane", "sluice/replica"}
    for artifact in artifacts.values():
        assert (REPO_ROOT / artifact["context"] / artifact["docker"]["dockerfile"]).is_file()
    (release,) = config["deploy"]["helm"]["releases"]
    assert (REPO_ROOT / release["chartPath"] / "Chart.yaml").is_file()
    chart_values = yaml.safe_load((REPO_ROOT / release["chartPath"] / "values.yaml").read_text())
    for dotted in release["setValueTemplates"]:
        node = chart_values
        for key in dotted.split("."):
            node = node[key]  # KeyError = skaffold sets a value the chart does not have
    (forward,) = config["portForward"]
    assert (forward["resourceName"], forward["port"], forward["localPort"]) == ("sluice-gateway", 8000, 8000)
