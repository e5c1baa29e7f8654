"""Router and scheduler as the chart wires them: the scheduler discovers
every replica pod through EndpointSlices with a Role allowing that alone, the
rollout identity may touch the catalog ConfigMap alone, the router sees its
catalog through a directory mount (hot reload) and each version's tokenizer
files without the weights (test_chart_tokenizer_sync.py), and the catalog
agrees with the replicas."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

helm = pytest.importorskip("helm_python", reason="pip install helm-python-sdk")

from chart_support import (  # noqa: E402
    component,
    containers,
    deployments,
    env_of,
    env_values,
    example_values,
    of_kind,
    pod_spec,
    render,
    render_objects,
    the_deployment,
    volumes_by_name,
    with_version_volume,
)

@pytest.fixture(scope="module")
def production_objects() -> list[dict]:
    return render_objects(example_values())


def catalog_of(objects: list[dict]) -> dict:
    (config_map,) = [c for c in of_kind(objects, "ConfigMap") if "models.json" in c["data"]]
    return json.loads(config_map["data"]["models.json"])


def named(objects: list[dict], kind: str, name: str) -> dict:
    (obj,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return obj


# ---- scheduler: discovery and its RBAC -----------------------------------------------


def test_scheduler_is_a_single_recreated_pod_that_follows_every_replica_services_slices(production_objects) -> None:
    scheduler = the_deployment(production_objects, "scheduler")
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["strategy"] == {"type": "Recreate"}
    env = env_of(containers(scheduler)[0])
    assert env["SLUICE_REPLICA_DISCOVERY"]["value"] == "endpointslices"
    assert env["SLUICE_KUBERNETES_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert "SLUICE_REPLICA_ADDRESSES" not in env  # the static list is for local runs
    services = [s for s in of_kind(production_objects, "Service") if component(s) == "replica"]
    followed = env["SLUICE_REPLICA_SERVICES"]["value"].split(",")
    assert sorted(followed) == sorted(s["metadata"]["name"] for s in services)
    port_name = env["SLUICE_REPLICA_PORT_NAME"]["value"]
    for service in services:
        # The slices' port carries the Service port's name.
        (grpc,) = [p for p in service["spec"]["ports"] if p["name"] == port_name]
        assert grpc["targetPort"] == "grpc"


def test_the_scheduler_may_only_read_endpointslices_in_its_namespace(production_objects) -> None:
    scheduler = the_deployment(production_objects, "scheduler")
    account = pod_spec(scheduler)["serviceAccountName"]
    named(production_objects, "ServiceAccount", account)
    binding = named(production_objects, "RoleBinding", account)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": render.NAMESPACE}]
    assert binding["roleRef"]["kind"] == "Role"
    role = named(production_objects, "Role", binding["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                              "verbs": ["get", "list", "watch"]}]
    assert not of_kind(production_objects, "ClusterRole") and not of_kind(production_objects, "ClusterRoleBinding")


def test_the_scheduler_reads_the_discovery_settings_the_chart_renders(production_objects, monkeypatch) -> None:
    from sluice.scheduler.settings import SchedulerSettings

    (container,) = containers(the_deployment(production_objects, "scheduler"))
    for name, value in env_values(container).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLUICE_KUBERNETES_NAMESPACE", render.NAMESPACE)  # the downward API's value
    settings = SchedulerSettings()
    assert settings.replica_discovery == "endpointslices"
    assert settings.kubernetes_namespace == render.NAMESPACE
    assert settings.replica_port_name == "grpc"
    assert settings.replica_resync_s == SchedulerSettings.model_fields["replica_resync_s"].default
    assert settings.replica_services.split(",") == env_values(container)["SLUICE_REPLICA_SERVICES"].split(",")


# ---- rollout RBAC ------------------------------------------------------------------


def test_the_rollout_identity_may_read_and_patch_the_catalog_configmap_only(production_objects) -> None:
    catalog_name = next(c["metadata"]["name"] for c in of_kind(production_objects, "ConfigMap")
                        if "models.json" in c["data"])
    account = named(production_objects, "ServiceAccount", f"{render.RELEASE_NAME}-rollout")
    role = named(production_objects, "Role", account["metadata"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [catalog_name],
                              "verbs": ["get", "list", "watch", "patch", "update"]}]
    binding = named(production_objects, "RoleBinding", account["metadata"]["name"])
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    extra = example_values()["rollout"]["rbac"]["extraSubjects"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": render.NAMESPACE}, *extra]


def test_rollout_rbac_is_on_by_default_and_can_be_turned_off() -> None:
    assert named(render_objects(None), "ServiceAccount", f"{render.RELEASE_NAME}-rollout")
    objects = render_objects({"rollout": {"rbac": {"enabled": False}}})
    assert [a["metadata"]["name"] for a in of_kind(objects, "ServiceAccount")] == [f"{render.RELEASE_NAME}-scheduler"]


# ---- router: catalog and tokenizers ------------------------------------------------


def test_the_catalog_is_a_directory_mount_so_the_kubelet_updates_it_in_place(production_objects) -> None:
    router = the_deployment(production_objects, "router")
    (container,) = [c for c in containers(router) if c["name"] == "router"]
    models_file = Path(env_of(container)["SLUICE_MODELS_FILE"]["value"])
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "catalog"]
    assert mount["mountPath"] == str(models_file.parent)
    assert "subPath" not in mount  # a subPath mount never sees a ConfigMap update
    assert "configMap" in volumes_by_name(router)["catalog"]


def test_by_default_a_weight_change_leaves_the_router_pods_alone(production_objects) -> None:
    values = example_values()
    before = the_deployment(production_objects, "router")["spec"]["template"]
    values["modelVersions"][0]["weight"] = 50
    after = the_deployment(render_objects(values), "router")["spec"]["template"]
    assert before == after  # the router hot-reloads the catalog file
    values["router"] = {"rollOnCatalogChange": True}
    rolled = the_deployment(render_objects(values), "router")["spec"]["template"]["metadata"]["annotations"]
    values["modelVersions"][0]["weight"] = 60
    rolled_again = the_deployment(render_objects(values), "router")["spec"]["template"]["metadata"]["annotations"]
    assert rolled["checksum/catalog"] != rolled_again["checksum/catalog"]


# The tokenizer copy (init container and sidecar): test_chart_tokenizer_sync.py.


@pytest.mark.parametrize("values_factory", [example_values, with_version_volume], ids=["example", "own-volume"])
def test_catalog_names_each_replica_versions_checkpoint_as_both_see_it(values_factory) -> None:
    values = values_factory()
    objects = render_objects(values)
    catalog = catalog_of(objects)
    weights = {v["version"]: v["weight"] for v in values["modelVersions"]}
    aliases = {v["version"]: v["alias"] for v in values["modelVersions"]}
    listed = {v["version"]: (m["name"], v) for m in catalog["models"] for v in m["versions"]}
    assert set(listed) == set(weights)
    for deployment in deployments(objects, "replica"):
        (container,) = containers(deployment)
        env = env_of(container)
        alias, entry = listed[env["SLUICE_MODEL_VERSION"]["value"]]
        assert alias == aliases[entry["version"]] == env["SLUICE_MODEL_NAME"]["value"]
        assert entry["weight"] == weights[entry["version"]]
        model_dir = env["SLUICE_MODEL_DIR"]["value"]
        assert entry["path"] == model_dir
        assert any(model_dir.startswith(m["mountPath"] + "/") and m.get("readOnly") for m in container["volumeMounts"])


def test_the_routers_catalog_parser_accepts_the_rendered_catalog(production_objects, tmp_path: Path) -> None:
    from sluice.router.catalog import load_catalog

    path = tmp_path / "models.json"
    path.write_text(json.dumps(catalog_of(production_objects)))
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
    path.write_text(json.dumps(catalog_of(render_objects(values))))
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


# ---- addresses and disruption budgets --------------------------------------------


def test_services_dial_each_other_through_their_services(production_objects) -> None:
    services = {component(s): s for s in of_kind(production_objects, "Service") if component(s) != "replica"}

    def address(role: str) -> str:
        service = services[role]
        port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
        return f"{service['metadata']['name']}:{port}"

    gateway_env = env_values(containers(the_deployment(production_objects, "gateway"))[0])
    router_env = env_values(containers(the_deployment(production_objects, "router"))[0])
    assert gateway_env["SLUICE_ROUTER_ADDRESS"] == address("router")
    assert gateway_env["SLUICE_GATEWAY_HOST"] == "0.0.0.0"
    assert router_env["SLUICE_SCHEDULER_ADDRESS"] == address("scheduler")
    assert router_env["SLUICE_ROUTER_ADDRESS"] == "0.0.0.0:50051"
    assert services["gateway"]["spec"]["ports"][0]["port"] == 8000


def test_pdbs_cover_gateway_router_and_every_replica_version(production_objects) -> None:
    covered = {component(p) for p in of_kind(production_objects, "PodDisruptionBudget")}
    assert covered == {"gateway", "router", "replica"}
