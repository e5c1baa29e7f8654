"""The Helm chart renders, its objects are valid Kubernetes, and it says what
DESIGN.md says about deployment.

Rendering uses the real Helm v4 Go SDK (the `helm-python-sdk` wheel, ctypes
over libhelm_c: no helm binary, cluster or network). Every rendered object is
checked against the Kubernetes 1.30 OpenAPI schemas with `kubernetes-validate`
in strict mode (unknown fields are errors). No API server is involved: what
only a cluster can check (admission, scheduling) is out of reach here.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

helm = pytest.importorskip("helm_python", reason="pip install helm-python-sdk")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate")
yaml = pytest.importorskip("yaml")

REPO_ROOT = Path(__file__).resolve().parents[2]
KUBERNETES_VERSION = "1.30.0"
GRPC_ROLES = ("router", "scheduler", "replica")
CONTROL_PLANE_ROLES = ("gateway", "router", "scheduler")
# The Prometheus Operator's PrometheusRule and PodMonitor are custom resources:
# kubernetes-validate knows only the built-in kinds, so schema validation
# skips them here on purpose; tests/deploy/test_observability.py checks
# their structure instead.
OPERATOR_API_VERSIONS = {"monitoring.coreos.com/v1"}


def _load_render_module():
    spec = importlib.util.spec_from_file_location("sluice_deploy_render", REPO_ROOT / "deploy" / "render.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render = _load_render_module()


# ---- factories ---------------------------------------------------------------


def example_values() -> dict[str, Any]:
    return render.load_values(render.EXAMPLE_VALUES)


def render_objects(values: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [yaml.safe_load(document) for _, document in render.render_documents(values)]


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def component(obj: dict) -> str:
    return obj["metadata"]["labels"]["app.kubernetes.io/component"]


def deployments(objects: list[dict], role: str) -> list[dict]:
    return [d for d in of_kind(objects, "Deployment") if component(d) == role]


def the_deployment(objects: list[dict], role: str) -> dict:
    (deployment,) = deployments(objects, role)
    return deployment


def containers(deployment: dict) -> list[dict]:
    return deployment["spec"]["template"]["spec"]["containers"]


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


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


@pytest.fixture(scope="module")
def example_objects() -> list[dict]:
    return render_objects(example_values())


@pytest.fixture(scope="module")
def default_objects() -> list[dict]:
    return render_objects(None)


def with_version_volume() -> dict[str, Any]:
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


# ---- the rendering is valid Kubernetes ------------------------------------------


def without_policies_and_gateway_pdb() -> dict[str, Any]:
    values = example_values()
    values["networkPolicy"]["enabled"] = False
    values["gateway"]["pdb"] = {"enabled": False, "maxUnavailable": 1}
    return values


RENDERINGS = {
    "defaults": lambda: None,
    "example": example_values,
    "per-version-volume": with_version_volume,
    "no-policies-no-gateway-pdb": without_policies_and_gateway_pdb,
}


@pytest.mark.parametrize("rendering", sorted(RENDERINGS))
def test_every_rendered_object_is_valid_kubernetes_strict(rendering: str) -> None:
    objects = render_objects(RENDERINGS[rendering]())
    assert objects, "nothing rendered"
    errors = []
    for obj in objects:
        if obj["apiVersion"] in OPERATOR_API_VERSIONS:
            continue  # CRDs kubernetes-validate has no schema for; see OPERATOR_API_VERSIONS
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {error.message} at {list(error.path)}")
    assert not errors, "\n".join(errors)


def test_rendering_the_example_values_equals_the_checked_in_manifests() -> None:
    checked_in = render.RENDERED.read_text()
    assert render.render_example() == checked_in, "deploy/k8s/sluice.yaml is stale: run `python deploy/render.py`"


def test_every_object_has_a_unique_kind_and_name(example_objects: list[dict]) -> None:
    keys = [(o["kind"], o["metadata"]["name"]) for o in example_objects]
    assert len(keys) == len(set(keys))
    assert {o["metadata"]["namespace"] for o in example_objects} == {render.NAMESPACE}


@pytest.mark.parametrize("values_factory", [lambda: None, example_values], ids=["defaults", "example"])
def test_helm_lint_strict_finds_no_warnings(values_factory) -> None:
    report = helm.lint(render.CHART_DIR, values_factory(), strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    assert report["errors"] == []
    # Severity 1 is informational ("icon is recommended"); 2 = warning, 3 = error.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


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


# ---- images -------------------------------------------------------------------


def test_control_plane_images_are_not_the_replica_image(example_objects: list[dict]) -> None:
    values = example_values()["images"]
    control_plane = f"{values['controlPlane']['repository']}:{values['controlPlane']['tag']}"
    replica = f"{values['replica']['repository']}:{values['replica']['tag']}"
    assert control_plane != replica
    for role in CONTROL_PLANE_ROLES:
        assert [c["image"] for c in containers(the_deployment(example_objects, role))] == [control_plane]
    replica_deployments = deployments(example_objects, "replica")
    assert replica_deployments
    for deployment in replica_deployments:
        assert [c["image"] for c in containers(deployment)] == [replica]


def test_images_are_pinned_and_pulled_if_not_present(default_objects: list[dict]) -> None:
    for deployment in of_kind(default_objects, "Deployment"):
        for container in containers(deployment):
            repository, _, tag = container["image"].rpartition(":")
            assert repository and tag and tag != "latest", container["image"]
            assert container["imagePullPolicy"] == "IfNotPresent"


def test_schema_rejects_the_latest_tag_and_unknown_keys() -> None:
    with helm.Chart.load(render.CHART_DIR) as chart:
        chart.validate_schema(example_values())
        for bad in (
            {"images": {"replica": {"tag": "latest"}}},
            {"replicaCount": 3},
            {"modelVersions": []},
            {"modelVersions": [{"version": "v1", "alias": "m", "modelPath": "m", "weight": -1}]},
            {"replicaDefaults": {"dtype": "int8"}},
        ):
            with pytest.raises(helm.HelmValuesError):
                chart.validate_schema(bad)


# ---- GPUs, probes, shutdown -----------------------------------------------------


def test_every_replica_deployment_requests_a_gpu_and_nothing_else_does(example_objects: list[dict]) -> None:
    for deployment in of_kind(example_objects, "Deployment"):
        for container in containers(deployment):
            resources = container["resources"]
            if component(deployment) == "replica":
                assert resources["requests"]["nvidia.com/gpu"] >= 1
                assert resources["limits"]["nvidia.com/gpu"] == resources["requests"]["nvidia.com/gpu"]
            else:
                assert "nvidia.com/gpu" not in resources.get("requests", {})
                assert "nvidia.com/gpu" not in resources.get("limits", {})
            assert resources["requests"]["cpu"] and resources["requests"]["memory"]
            assert resources["limits"]["memory"]


def test_every_grpc_container_has_native_grpc_probes(example_objects: list[dict]) -> None:
    for role in GRPC_ROLES:
        for deployment in deployments(example_objects, role):
            for container in containers(deployment):
                grpc_port = port_of(container, "grpc")
                for probe in ("readinessProbe", "livenessProbe"):
                    assert container[probe]["grpc"] == {"port": grpc_port}, (role, probe)


def test_replica_probes_wait_for_model_load_and_restart_later_than_they_unready(
    example_objects: list[dict],
) -> None:
    for deployment in deployments(example_objects, "replica"):
        (container,) = containers(deployment)
        startup, readiness, liveness = (container[p] for p in ("startupProbe", "readinessProbe", "livenessProbe"))
        assert startup["grpc"] == {"port": port_of(container, "grpc")}
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model load
        assert liveness["periodSeconds"] * liveness["failureThreshold"] > (
            readiness["periodSeconds"] * readiness["failureThreshold"]
        )


def test_gateway_probes_are_http_healthz_and_readyz(example_objects: list[dict]) -> None:
    (container,) = containers(the_deployment(example_objects, "gateway"))
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_termination_grace_exceeds_the_shutdown_grace(example_objects: list[dict]) -> None:
    for deployment in of_kind(example_objects, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        shutdown_grace_s = float(env_of(container)["SLUICE_SHUTDOWN_GRACE_S"]["value"])
        assert pod["terminationGracePeriodSeconds"] > shutdown_grace_s, deployment["metadata"]["name"]


def test_pods_run_as_non_root_with_a_read_only_root(example_objects: list[dict]) -> None:
    for deployment in of_kind(example_objects, "Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            assert container["securityContext"]["allowPrivilegeEscalation"] is False


# ---- topology: services, addresses, scheduler -----------------------------------


def test_one_replica_deployment_headless_service_and_pdb_per_model_version(example_objects: list[dict]) -> None:
    versions = [v["version"] for v in example_values()["modelVersions"]]
    by_version = {
        kind: sorted(
            o["metadata"]["labels"]["sluice.dev/model-version"]
            for o in of_kind(example_objects, kind)
            if component(o) == "replica"
        )
        for kind in ("Deployment", "Service", "PodDisruptionBudget")
    }
    assert by_version == {kind: sorted(versions) for kind in by_version}
    for service in of_kind(example_objects, "Service"):
        if component(service) == "replica":
            assert service["spec"]["clusterIP"] == "None"
        else:
            assert service["spec"]["type"] == "ClusterIP"
    # Each version's selector picks its own pods only.
    for deployment in deployments(example_objects, "replica"):
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector["sluice.dev/model-version"] == deployment["metadata"]["labels"]["sluice.dev/model-version"]


def test_replica_env_configures_the_gpu_engine(example_objects: list[dict]) -> None:
    for deployment in deployments(example_objects, "replica"):
        (container,) = containers(deployment)
        env = env_of(container)
        assert env["SLUICE_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["SLUICE_DEVICE"]["value"] == "cuda"
        assert env["SLUICE_DTYPE"]["value"] == "bfloat16"
        assert env["SLUICE_KV_CACHE_BYTES"]["value"] == "0"
        assert 0 < float(env["SLUICE_GPU_MEMORY_FRACTION"]["value"]) <= 1
        assert env["SLUICE_REPLICA_ADDRESS"]["value"] == f"0.0.0.0:{port_of(container, 'grpc')}"
        assert env["SLUICE_MODEL_VERSION"]["value"] == deployment["metadata"]["labels"]["sluice.dev/model-version"]
        mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
        assert mounts["/models"]["readOnly"] is True


def test_scheduler_is_a_single_recreated_pod_that_knows_every_replica_service(example_objects: list[dict]) -> None:
    scheduler = the_deployment(example_objects, "scheduler")
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"] == {"type": "Recreate"}
    addresses = env_of(containers(scheduler)[0])["SLUICE_REPLICA_ADDRESSES"]["value"].split(",")
    services = [s for s in of_kind(example_objects, "Service") if component(s) == "replica"]
    expected = {
        f"{s['metadata']['name']}:{next(p['port'] for p in s['spec']['ports'] if p['name'] == 'grpc')}"
        for s in services
    }
    assert set(addresses) == expected and len(addresses) == len(expected)


def test_services_dial_each_other_through_their_services(example_objects: list[dict]) -> None:
    services = {component(s): s for s in of_kind(example_objects, "Service") if component(s) != "replica"}

    def address(role: str) -> str:
        service = services[role]
        port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
        return f"{service['metadata']['name']}:{port}"

    gateway_env = env_of(containers(the_deployment(example_objects, "gateway"))[0])
    router_env = env_of(containers(the_deployment(example_objects, "router"))[0])
    assert gateway_env["SLUICE_ROUTER_ADDRESS"]["value"] == address("router")
    assert gateway_env["SLUICE_GATEWAY_HOST"]["value"] == "0.0.0.0"
    assert router_env["SLUICE_SCHEDULER_ADDRESS"]["value"] == address("scheduler")
    assert router_env["SLUICE_ROUTER_ADDRESS"]["value"] == "0.0.0.0:50051"
    assert services["gateway"]["spec"]["ports"][0]["port"] == 8000


def test_pdbs_cover_gateway_router_and_every_replica_version(example_objects: list[dict]) -> None:
    covered = {component(p) for p in of_kind(example_objects, "PodDisruptionBudget")}
    assert covered == {"gateway", "router", "replica"}


# ---- model catalog ----------------------------------------------------------------


def _catalog(objects: list[dict]) -> dict:
    (config_map,) = [c for c in of_kind(objects, "ConfigMap") if "models.json" in c["data"]]
    return json.loads(config_map["data"]["models.json"])


@pytest.mark.parametrize("values_factory", [example_values, with_version_volume], ids=["example", "own-volume"])
def test_catalog_names_each_replica_versions_checkpoint_as_the_router_mounts_it(values_factory) -> None:
    values = values_factory()
    objects = render_objects(values)
    catalog = _catalog(objects)
    weights = {v["version"]: v["weight"] for v in values["modelVersions"]}
    aliases = {v["version"]: v["alias"] for v in values["modelVersions"]}
    listed = {v["version"]: (m["name"], v) for m in catalog["models"] for v in m["versions"]}
    assert set(listed) == set(weights)

    router = the_deployment(objects, "router")
    (router_container,) = containers(router)
    router_mounts = [m["mountPath"] for m in router_container["volumeMounts"]]
    models_file = Path(env_of(router_container)["SLUICE_MODELS_FILE"]["value"])
    assert str(models_file.parent) in router_mounts

    for deployment in deployments(objects, "replica"):
        (container,) = containers(deployment)
        env = env_of(container)
        alias, entry = listed[env["SLUICE_MODEL_VERSION"]["value"]]
        assert alias == aliases[entry["version"]] == env["SLUICE_MODEL_NAME"]["value"]
        assert entry["weight"] == weights[entry["version"]]
        model_dir = env["SLUICE_MODEL_DIR"]["value"]
        assert entry["path"] == model_dir
        # Both the replica and the router see the checkpoint under a read-only mount.
        for mounts in ([m for m in container["volumeMounts"]], router_container["volumeMounts"]):
            assert any(model_dir.startswith(m["mountPath"] + "/") and m.get("readOnly") for m in mounts)


def test_the_routers_catalog_parser_accepts_the_rendered_catalog(example_objects: list[dict], tmp_path: Path) -> None:
    from sluice.router.catalog import load_catalog

    path = tmp_path / "models.json"
    path.write_text(json.dumps(_catalog(example_objects)))
    aliases = {alias.name: alias for alias in load_catalog(path)}
    assert sorted(v.weight for v in aliases["llama-3.1-8b-instruct"].versions) == [10, 90]


def test_fallbacks_and_routes_reach_the_routers_catalog(tmp_path: Path) -> None:
    from sluice.router.catalog import load_catalog
    from sluice.router.routing_rules import RouteRule

    values = {
        "modelVersions": [
            {"version": "big-v1", "alias": "big", "modelPath": "big", "weight": 100, "fallback": "small-v1"},
            {"version": "small-v1", "alias": "small", "modelPath": "small", "weight": 100},
        ],
        "modelRoutes": {"big": [{"to": "small-v1", "max_prompt_tokens": 512, "max_output_tokens": 64,
                                 "classes": ["interactive"]}]},
    }
    path = tmp_path / "models.json"
    path.write_text(json.dumps(_catalog(render_objects(values))))
    aliases = {alias.name: alias for alias in load_catalog(path)}
    assert aliases["big"].versions[0].fallback == "small-v1"
    assert aliases["small"].versions[0].fallback == ""
    assert aliases["big"].routes == (
        RouteRule("small-v1", max_prompt_tokens=512, max_output_tokens=64, classes=frozenset({"interactive"})),)
    assert aliases["small"].routes == ()


@pytest.mark.parametrize(("values", "message"), [
    ({"modelVersions": [{"version": "a-1", "alias": "a", "modelPath": "a", "weight": 1, "fallback": "ghost"}]},
     "fallback \"ghost\""),
    ({"modelVersions": [{"version": "a-1", "alias": "a", "modelPath": "a", "weight": 1}],
      "modelRoutes": {"a": [{"to": "ghost"}]}}, "route to \"ghost\""),
], ids=["unknown-fallback", "unknown-route-target"])
def test_the_chart_refuses_a_stand_in_that_is_not_a_model_version(values, message) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render.render_documents(values)


def test_changing_rollout_weights_rolls_the_router() -> None:
    values = example_values()
    before = the_deployment(render_objects(values), "router")["spec"]["template"]["metadata"]["annotations"]
    values["modelVersions"][0]["weight"] = 50
    after = the_deployment(render_objects(values), "router")["spec"]["template"]["metadata"]["annotations"]
    assert before["checksum/catalog"] != after["checksum/catalog"]


# ---- secrets and API keys ------------------------------------------------------------


def test_backend_urls_are_optional_refs_to_the_existing_secret(example_objects, default_objects) -> None:
    env = env_of(containers(the_deployment(example_objects, "gateway"))[0])
    for name in ("REDIS_URL", "SLUICE_DATABASE_URL"):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "sluice-backends", "key": name, "optional": True}
    default_env = env_of(containers(the_deployment(default_objects, "gateway"))[0])
    assert "REDIS_URL" not in default_env and "SLUICE_DATABASE_URL" not in default_env
    assert not of_kind(default_objects, "Secret")


def test_the_gateway_gets_no_dev_api_key(example_objects: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_of(containers(the_deployment(example_objects, "gateway"))[0])
    assert env["SLUICE_DEV_API_KEY"] == {"name": "SLUICE_DEV_API_KEY", "value": ""}
    # Empty rather than unset, because unset falls back to the built-in dev key.
    from sluice.gateway.settings import GatewaySettings

    monkeypatch.setenv("SLUICE_DEV_API_KEY", env["SLUICE_DEV_API_KEY"]["value"])
    assert not GatewaySettings().dev_api_key


def test_behind_the_clusters_ingress_the_gateway_limits_no_client_address(example_objects: list[dict]) -> None:
    env = env_of(containers(the_deployment(example_objects, "gateway"))[0])
    assert env["SLUICE_HTTP_MAX_CONNECTIONS_PER_CLIENT"]["value"] == "0"  # every connection is the ingress's


def test_each_gateway_pod_keeps_its_share_of_the_limits_while_redis_is_away(example_objects: list[dict]) -> None:
    gateway = the_deployment(example_objects, "gateway")
    env = env_of(containers(gateway)[0])
    assert env["SLUICE_LIMITS_FALLBACK_GATEWAYS"]["value"] == str(gateway["spec"]["replicas"])


# ---- network policies ----------------------------------------------------------------


def test_network_policies_let_each_hop_in_from_its_caller_only(example_objects: list[dict]) -> None:
    metrics_port = example_values().get("metrics", {}).get("port", 9090)
    expected_callers = {"router": {"gateway"}, "scheduler": {"router"}, "replica": {"router", "scheduler"}}
    for role, callers in expected_callers.items():
        policy = network_policy(example_objects, role)
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == role
        grpc_rules = [r for r in policy["spec"]["ingress"] if any(p["port"] != metrics_port for p in r["ports"])]
        (grpc_rule,) = grpc_rules
        assert peer_components(grpc_rule) == callers
        metrics_rules = [r for r in policy["spec"]["ingress"] if r not in grpc_rules]
        (metrics_rule,) = metrics_rules
        assert [p["port"] for p in metrics_rule["ports"]] == [metrics_port]
        (peer,) = metrics_rule["from"]
        assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "monitoring"}
    gateway = network_policy(example_objects, "gateway")
    (rule,) = gateway["spec"]["ingress"]
    assert "from" not in rule and rule["ports"][0]["port"] == 8000


def test_network_policies_can_be_turned_off() -> None:
    values = example_values()
    values["networkPolicy"]["enabled"] = False
    assert not of_kind(render_objects(values), "NetworkPolicy")


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


# ---- admission and dispatch knobs ------------------------------------------------------

# Fields every service shares, or that the chart sets from its topology.
_NOT_ADMISSION_KNOBS = {"replica_addresses", "router_address", "scheduler_address", "metrics_host", "metrics_port",
                        "shutdown_grace_s", "model_dir", "model_name", "model_version", "log_level",
                        "stream_buffer_events"}


def _env_values(container: dict) -> dict[str, str]:
    return {name: e["value"] for name, e in env_of(container).items() if "value" in e}


def _scheduler_settings_from(objects: list[dict], monkeypatch: pytest.MonkeyPatch):
    from sluice.scheduler.settings import SchedulerSettings

    for name, value in _env_values(containers(the_deployment(objects, "scheduler"))[0]).items():
        monkeypatch.setenv(name, value)
    return SchedulerSettings()


def test_the_scheduler_gets_every_admission_knob(default_objects: list[dict]) -> None:
    from sluice.scheduler.settings import SchedulerSettings

    env = env_of(containers(the_deployment(default_objects, "scheduler"))[0])
    knobs = {f"SLUICE_{name.upper()}" for name in SchedulerSettings.model_fields} - {
        f"SLUICE_{name.upper()}" for name in _NOT_ADMISSION_KNOBS
    }
    assert knobs <= set(env), sorted(knobs - set(env))


def test_the_charts_default_knobs_are_the_codes(default_objects: list[dict], monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.replica.settings import DEVICE_DEFAULTS, ReplicaSettings
    from sluice.router.settings import RouterSettings
    from sluice.scheduler.settings import SchedulerSettings

    code = SchedulerSettings()
    rendered = _scheduler_settings_from(default_objects, monkeypatch)
    assert rendered.placement_config() == code.placement_config()
    assert rendered.schedule_interval_s == code.schedule_interval_s

    router_env = env_of(containers(the_deployment(default_objects, "router"))[0])
    for name in ("kv_block_size_tokens", "tokenize_per_tenant"):
        assert int(router_env[f"SLUICE_{name.upper()}"]["value"]) == RouterSettings.model_fields[name].default
    assert router_env["SLUICE_PREFIX_CACHE_SCOPE"]["value"] == RouterSettings.model_fields["prefix_cache_scope"].default
    for deployment in deployments(default_objects, "replica"):
        env = env_of(containers(deployment)[0])
        assert float(env["SLUICE_INTERACTIVE_PREEMPT_AFTER_S"]["value"]) == ReplicaSettings.model_fields[
            "interactive_preempt_after_s"].default
        for name in ("max_long_prefills_per_step", "long_prefill_threshold_tokens"):
            assert int(env[f"SLUICE_{name.upper()}"]["value"]) == ReplicaSettings.model_fields[name].default
        # The chunk caps' code defaults depend on the device: the chart states the ones for its device.
        rendered = ReplicaSettings(device=env["SLUICE_DEVICE"]["value"])
        for name in DEVICE_DEFAULTS:
            assert int(env[f"SLUICE_{name.upper()}"]["value"]) == rendered.for_device(name)


def test_tenant_limits_render_as_json_the_scheduler_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.admission.tenant_caps import TenantLimits

    values = example_values()
    values["scheduler"]["admission"]["tenantMaxActiveSeqs"] = 100
    values["scheduler"]["admission"]["tenantLimits"] = {
        "acme": {"max_active_seqs": 64, "max_kv_share": 0.8},
        "tiny": {"max_kv_share": 0.1},
    }
    tenants = _scheduler_settings_from(render_objects(values), monkeypatch).placement_config().tenants
    assert tenants.for_tenant("acme") == TenantLimits(max_active_seqs=64, max_kv_share=0.8)
    assert tenants.for_tenant("tiny") == TenantLimits(max_active_seqs=100, max_kv_share=0.1)
    assert tenants.for_tenant("anyone") == TenantLimits(max_active_seqs=100, max_kv_share=0.5)


def test_replica_preemption_can_be_turned_off_per_version(monkeypatch: pytest.MonkeyPatch) -> None:
    from sluice.replica.settings import ReplicaSettings

    values = example_values()
    values["modelVersions"][0]["interactivePreemptAfterS"] = "none"
    values["modelVersions"][1]["interactivePreemptAfterS"] = 1.5
    by_version = {
        env_of(containers(d)[0])["SLUICE_MODEL_VERSION"]["value"]: env_of(containers(d)[0])
        for d in deployments(render_objects(values), "replica")
    }
    expected = {values["modelVersions"][0]["version"]: None, values["modelVersions"][1]["version"]: 1.5}
    for version, after_s in expected.items():
        monkeypatch.setenv("SLUICE_INTERACTIVE_PREEMPT_AFTER_S",
                           by_version[version]["SLUICE_INTERACTIVE_PREEMPT_AFTER_S"]["value"])
        assert ReplicaSettings().interactive_preempt_after_s == after_s


@pytest.mark.parametrize(
    "bad",
    [
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
    ],
    ids=lambda bad: json.dumps(bad, separators=(",", ":")),
)
def test_schema_rejects_admission_knobs_the_code_would(bad: dict) -> None:
    with helm.Chart.load(render.CHART_DIR) as chart:
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(bad)
