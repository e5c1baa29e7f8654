"""`sluice rollout` in the chart: the settings ConfigMap read back with the
real settings loader of sluice.rollout, and the rollout Job's command line
parsed by the real CLI parser, its mounts against the rendered catalog, its
hook and deadline, and every refusal naming what to fix. Rendering is the
real Helm SDK (chart_support); no cluster is involved."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

helm = pytest.importorskip("helm_python", reason="pip install helm-python-sdk")

from chart_support import example_values, of_kind, pod_spec, render, render_notes, render_objects  # noqa: E402
from sluice.rollout.cli import build_parser  # noqa: E402
from sluice.rollout.settings import DEFAULTS, build_settings, load_config_file, merged  # noqa: E402

SETTINGS_NAME = "sluice-rollout-settings"
ALIAS = "llama-3.1-8b-instruct"
SERVING, CANDIDATE = "llama-3.1-8b-instruct-v1", "llama-3.1-8b-instruct-v2"


def the_object(objects: list[dict], kind: str, name: str) -> dict:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def rendered_settings(objects: list[dict], tmp_path: Path) -> dict:
    """The ConfigMap's settings.json, written to a file and read as `--config FILE` reads it."""
    path = tmp_path / "settings.json"
    path.write_text(the_object(objects, "ConfigMap", SETTINGS_NAME)["data"]["settings.json"])
    return load_config_file(path)


def the_job(values: dict | None) -> dict:
    (job,) = of_kind(render_objects(values), "Job")
    return job


def with_job(**job: object) -> dict:
    values = example_values("two-versions")
    values["rollout"]["job"].update(job)
    return values


def refused(values: dict, message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render.render_documents(values)


# ---- the settings ConfigMap -----------------------------------------------------------


def test_default_values_render_exactly_the_codes_defaults(tmp_path: Path) -> None:
    document = rendered_settings(render_objects(None), tmp_path)
    assert merged(document) == DEFAULTS
    # Every setting is spelled out, so the file reads on its own; only the
    # Prometheus URL is left to the code's default while none is set.
    expected = copy.deepcopy(DEFAULTS)
    del expected["prometheus"]["url"]
    assert document == expected
    build_settings(merged(document), alias="m", serving="m-1", candidate="m-2")


def test_values_overrides_reach_the_settings_the_cli_builds(tmp_path: Path) -> None:
    values = {"rollout": {
        "plan": {"steps": [10, 50, 100], "dwellSeconds": 60, "minRequests": 5, "maxStepSeconds": 900, "pollSeconds": 2},
        "slo": {"class": "batch", "minWindowSeconds": 15, "maxTtftP99Seconds": None, "maxErrorRate": 0.05,
                "relativeSlackSeconds": 0},
        "quality": {"skip": True, "minGreedyAgreement": 0.5, "maxLogprobDrop": 0.3, "maxCheckRegressions": 2},
        "prometheusUrl": "http://prometheus.monitoring:9090",
    }}
    settings = build_settings(merged(rendered_settings(render_objects(values), tmp_path)),
                              alias="m", serving="m-1", candidate="m-2")
    plan = settings.plan
    assert (plan.steps_pct, plan.dwell_s, plan.min_requests, plan.max_step_s) == ((10, 50, 100), 60, 5, 900)
    assert settings.poll_s == 2
    assert plan.slo.max_ttft_p99_s is None  # null in values: the gate is off
    assert plan.slo.max_error_rate == 0.05 and plan.slo.relative_slack_s == 0
    assert plan.slo.max_itl_p99_s == DEFAULTS["slo"]["maxItlP99Seconds"]  # untouched keys keep the default
    assert plan.quality_gate is False
    assert (settings.quality.min_greedy_agreement, settings.quality.max_logprob_drop,
            settings.quality.max_check_regressions) == (0.5, 0.3, 2)
    assert settings.metrics.prometheus_url == "http://prometheus.monitoring:9090"
    assert settings.metrics.service_class == "batch" and settings.metrics.min_window_s == 15


def test_a_gate_turned_off_in_a_values_file_is_off(tmp_path: Path) -> None:
    # Through Helm's own YAML reader, where null drops the key from the values.
    values = helm.values_from_yaml("rollout:\n  slo:\n    maxErrorRate: null\n  plan:\n    maxStepSeconds: null\n")
    document = rendered_settings(render_objects(values), tmp_path)
    assert document["slo"]["maxErrorRate"] is None and document["maxStepSeconds"] is None
    assert document["slo"]["maxErrorRateIncrease"] == DEFAULTS["slo"]["maxErrorRateIncrease"]


@pytest.mark.parametrize("bad", [
    {"plan": {"stepz": [1, 100]}},
    {"plan": {"steps": [0, 100]}},
    {"plan": {"steps": [5, 101]}},
    {"plan": {"steps": [1, 5, 50]}},
    {"plan": {"steps": [1.5, 100]}},
    {"plan": {"minRequests": 0}},
    {"plan": {"pollSeconds": 0}},
    {"slo": {"class": "gold"}},
    {"slo": {"maxErrorRate": 1.5}},
    {"slo": {"maxTtftP99Seconds": 0}},
    {"slo": {"maxTtftP99Ratio": -1}},
    {"slo": {"maxTtftP99": 2}},
    {"quality": {"minGreedyAgreement": 1.2}},
    {"quality": {"maxCheckRegressions": -1}},
    {"quality": {"device": "tpu"}},
    {"quality": {"enabled": False}},
    {"prometheusUrl": "prometheus:9090"},
    {"job": {"backoffLimit": 3}},
    {"job": {"activeDeadlineSeconds": -1}},
    {"job": {"deadlineFactor": 0.5}},
], ids=lambda bad: json.dumps(bad, separators=(",", ":")))
def test_schema_refuses_unknown_keys_and_out_of_range_values(bad: dict) -> None:
    with helm.Chart.load(render.CHART_DIR) as chart:
        chart.validate_schema({"rollout": {"prometheusUrl": "http://p:9090"}})  # the baseline passes
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema({"rollout": bad})


@pytest.mark.parametrize(("plan", "message"), [
    ({"steps": [50, 25, 100]}, "steps must increase"),
    ({"dwellSeconds": 600, "maxStepSeconds": 300}, "maxStepSeconds .300. must be at least dwellSeconds"),
])
def test_the_chart_refuses_a_plan_the_cli_would(plan: dict, message: str) -> None:
    refused({"rollout": {"plan": plan}}, message)
    with pytest.raises(ValueError):  # the same settings from a file: the CLI refuses them too
        build_settings(merged(plan), alias="m", serving="m-1", candidate="m-2")


# ---- the Job ----------------------------------------------------------------------


def test_no_job_unless_enabled() -> None:
    assert of_kind(render_objects(None), "Job") == []
    values = example_values("two-versions")
    values["rollout"]["job"]["enabled"] = False
    assert of_kind(render_objects(values), "Job") == []


def test_the_job_is_a_hook_per_candidate_that_replaces_its_predecessor_and_never_retries() -> None:
    job = the_job(example_values("two-versions"))
    assert job["metadata"]["name"] == "sluice-rollout-llama-3-1-8b-instruct-v2"
    annotations = job["metadata"]["annotations"]
    assert set(annotations["helm.sh/hook"].split(",")) == {"post-install", "post-upgrade"}
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation"
    assert job["spec"]["backoffLimit"] == 0
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0


def test_the_job_runs_start_with_the_mounted_settings_on_the_catalog_configmap() -> None:
    objects = render_objects(example_values("two-versions"))
    (job,) = of_kind(objects, "Job")
    (container,) = pod_spec(job)["containers"]
    assert container["command"][:3] == ["python", "-m", "sluice.rollout"]
    args = build_parser().parse_args(container["command"][3:] + container["args"])
    assert (args.command, args.alias, args.candidate, args.serving) == ("start", ALIAS, CANDIDATE, None)
    assert (args.configmap, args.namespace, args.device) == ("sluice-catalog", render.NAMESPACE, "cuda")
    the_object(objects, "ConfigMap", args.configmap)
    # --config is the settings ConfigMap's key, as mounted.
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    mount = mounts[str(args.config.parent)]
    assert mount["readOnly"] is True
    assert volumes[mount["name"]]["configMap"]["name"] == SETTINGS_NAME
    assert args.config.name in the_object(objects, "ConfigMap", SETTINGS_NAME)["data"]


def test_the_job_runs_as_the_rollout_account_the_role_binds() -> None:
    objects = render_objects(example_values("two-versions"))
    (job,) = of_kind(objects, "Job")
    account = pod_spec(job)["serviceAccountName"]
    assert pod_spec(job)["automountServiceAccountToken"] is True
    the_object(objects, "ServiceAccount", account)
    binding = the_object(objects, "RoleBinding", account)
    assert {"kind": "ServiceAccount", "name": account, "namespace": render.NAMESPACE} in binding["subjects"]
    role = the_object(objects, "Role", binding["roleRef"]["name"])
    (rule,) = role["rules"]
    assert rule["resourceNames"] == ["sluice-catalog"] and "patch" in rule["verbs"]


def test_the_job_runs_the_replica_image_with_a_gpu_only_for_a_cuda_check() -> None:
    values = example_values("two-versions")
    (container,) = pod_spec(the_job(values))["containers"]
    replica = render.load_values(render.CHART_DIR / "values.yaml")["images"]["replica"]
    assert container["image"] == f"{replica['repository']}:{replica['tag']}"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    for quality in ({"device": "cpu"}, {"device": "cuda", "skip": True}):
        values = example_values("two-versions")
        values["rollout"]["quality"] = quality
        (container,) = pod_spec(the_job(values))["containers"]
        assert "nvidia.com/gpu" not in container["resources"]["limits"]
        assert "nvidia.com/gpu" not in container["resources"]["requests"]


def _catalog_paths(objects: list[dict]) -> dict[str, str]:
    catalog = json.loads(the_object(objects, "ConfigMap", "sluice-catalog")["data"]["models.json"])
    (model,) = [m for m in catalog["models"] if m["name"] == ALIAS]
    return {v["version"]: v["path"] for v in model["versions"]}


def _volume_at(workload: dict, path: str) -> dict:
    """The volume source (minus its name) a pod reads `path` from, read-only."""
    containers = pod_spec(workload)["containers"]
    mounts = [m for c in containers for m in c.get("volumeMounts", [])
              if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/")]
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    assert mount.get("readOnly") is True, mount
    (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    return {k: v for k, v in volume.items() if k != "name"}


def test_the_job_reads_each_versions_weights_where_the_catalog_and_the_replicas_do() -> None:
    values = example_values("two-versions")
    values["modelVersions"].append({
        "version": "llama-3.1-8b-instruct-v3", "alias": ALIAS, "modelPath": "ckpt", "weight": 0,
        "volume": {"persistentVolumeClaim": {"claimName": "llama-v3", "readOnly": True}},
    })
    values["modelVersions"].append({"version": "other-v1", "alias": "other", "modelPath": "other", "weight": 100,
                                    "volume": {"persistentVolumeClaim": {"claimName": "other", "readOnly": True}}})
    values["rollout"]["job"]["candidate"] = "llama-3.1-8b-instruct-v3"
    objects = render_objects(values)
    (job,) = of_kind(objects, "Job")
    paths = _catalog_paths(objects)
    assert set(paths) == {SERVING, CANDIDATE, "llama-3.1-8b-instruct-v3"}
    for version, path in paths.items():
        (replica,) = [d for d in of_kind(objects, "Deployment")
                      if d["metadata"]["labels"].get("sluice.dev/model-version") == version]
        assert _volume_at(job, path) == _volume_at(replica, path), version
    claims = [v["persistentVolumeClaim"]["claimName"] for v in pod_spec(job)["volumes"] if "persistentVolumeClaim" in v]
    assert "other" not in claims  # another alias's weights are not the Job's business


def test_the_deadline_covers_the_quality_check_and_every_step_or_is_the_value_given() -> None:
    job = the_job(example_values("two-versions"))
    # qualityCheckSeconds + deadlineFactor x steps x dwellSeconds, at the defaults.
    assert job["spec"]["activeDeadlineSeconds"] == 1800 + 2 * 5 * 300
    values = example_values("two-versions")
    values["rollout"]["plan"] = {"steps": [50, 100], "dwellSeconds": 60, "maxStepSeconds": 900}
    values["rollout"]["job"].update(qualityCheckSeconds=600, deadlineFactor=1.5)
    assert the_job(values)["spec"]["activeDeadlineSeconds"] == 600 + 1.5 * 2 * 900  # a step may wait maxStepSeconds
    values["rollout"]["job"]["activeDeadlineSeconds"] = 7200
    assert the_job(values)["spec"]["activeDeadlineSeconds"] == 7200


def test_a_named_serving_version_is_passed_on() -> None:
    (container,) = pod_spec(the_job(with_job(serving=SERVING)))["containers"]
    assert build_parser().parse_args(container["command"][3:] + container["args"]).serving == SERVING


@pytest.mark.parametrize(("change", "message"), [
    ({"job": {"alias": ""}}, r"rollout\.job\.alias must be set"),
    ({"job": {"candidate": ""}}, r"rollout\.job\.candidate must be set"),
    ({"prometheusUrl": ""}, r"rollout\.prometheusUrl must be set"),
    ({"rbac": {"enabled": False}}, r"needs rollout\.rbac\.enabled"),
    ({"job": {"alias": "llama"}}, r'rollout\.job\.alias "llama" is not an alias in modelVersions \(they have: llama-3\.1'),
    ({"job": {"candidate": "llama-3.1-8b-instruct-v9"}},
     r'candidate "llama-3\.1-8b-instruct-v9" is not a version of alias "llama-3\.1-8b-instruct" in modelVersions'),
    ({"job": {"serving": CANDIDATE}}, r"rollout\.job\.serving .* must be another version"),
    ({"job": {"serving": "other-v1"}}, r"rollout\.job\.serving .* must be another version"),
    ({"plan": {"dwellSeconds": 0}, "job": {"qualityCheckSeconds": 0}}, r"set rollout\.job\.activeDeadlineSeconds"),
], ids=["no-alias", "no-candidate", "no-prometheus", "no-rbac", "unknown-alias", "unknown-candidate",
        "serving-is-candidate", "serving-elsewhere", "zero-deadline"])
def test_the_chart_refuses_a_job_that_could_not_do_its_work(change: dict, message: str) -> None:
    values = example_values("two-versions")
    for block, settings in change.items():
        if isinstance(settings, dict):
            values["rollout"].setdefault(block, {}).update(settings)
        else:
            values["rollout"][block] = settings
    refused(values, message)


def test_the_chart_refuses_a_job_for_a_candidate_that_already_has_everything() -> None:
    # After a completed rollout the values say candidate 100, old 0: a
    # helm upgrade with the Job still on would start it again from 1 %.
    values = example_values("two-versions")
    for entry in values["modelVersions"]:
        entry["weight"] = 100 if entry["version"] == CANDIDATE else 0
    refused(values, r"already has all of alias .* the rollout is done: set rollout\.job\.enabled false")


def test_an_alias_with_one_version_has_nothing_to_roll_out_from() -> None:
    values = example_values("two-versions")
    values["modelVersions"] = [v for v in values["modelVersions"] if v["version"] == CANDIDATE]
    values["modelVersions"][0]["weight"] = 100
    refused(values, "has no version besides")


def test_network_policies_leave_the_jobs_egress_open() -> None:
    # The Job reaches Prometheus and the API server; the chart's policies
    # restrict ingress only. An egress policy would need a rule for it.
    objects = render_objects(example_values("two-versions"))
    policies = of_kind(objects, "NetworkPolicy")
    assert policies
    assert all(p["spec"]["policyTypes"] == ["Ingress"] for p in policies)


def test_notes_say_how_to_watch_the_rollout() -> None:
    notes = render_notes(example_values("two-versions"))
    assert "kubectl -n sluice logs -f job/sluice-rollout-llama-3-1-8b-instruct-v2" in notes
    assert "sluice rollout status --configmap sluice-catalog --namespace sluice" in notes
    assert "logs -f job/" not in render_notes(None)
