"""The ConfigMap store against a fake Kubernetes API server (no API server
can run here: tests/support/fake_kube_api.py speaks its JSON shapes) with
the real `kubernetes` client and its models."""

import json

import pytest
from kubernetes import client

from support.fake_kube_api import CONFIG_MAPS, FakeKubeApi

from sluice.rollout.kube_store import COMMAND_ANNOTATION, STATUS_ANNOTATION, KubeCatalogStore
from sluice.rollout.machine import Command, Phase
from sluice.rollout.records import StatusRecord
from sluice.rollout.store import StoreError
from sluice.router.catalog import load_catalog

NAMESPACE = "serving"
NAME = "sluice-catalog"


def catalog(v1: int = 100, v2: int = 0) -> str:
    return json.dumps({"models": [{"name": "tiny-llama", "versions": [
        {"version": "tiny-llama-v1", "path": "/models/tiny-llama-v1", "weight": v1},
        {"version": "tiny-llama-v2", "path": "/models/tiny-llama-v2", "weight": v2}]}]})


@pytest.fixture()
def kube():
    with FakeKubeApi() as api:
        core = client.CoreV1Api(api.api_client())
        # Created through the client's own models, as `helm install` would have.
        core.create_namespaced_config_map(NAMESPACE, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=NAME, labels={"app.kubernetes.io/name": "sluice"},
                                         annotations={"meta.helm.sh/release-name": "sluice"}),
            data={"models.json": catalog()}))
        yield api, core


def store_of(core) -> KubeCatalogStore:
    return KubeCatalogStore(core, NAME, NAMESPACE)


def test_weights_are_patched_into_models_json_with_the_read_resource_version(kube, tmp_path):
    api, core = kube
    before = api.get(CONFIG_MAPS, NAMESPACE, NAME)
    store_of(core).write_weights("tiny-llama", "tiny-llama-v1", "tiny-llama-v2", 25)
    after = api.get(CONFIG_MAPS, NAMESPACE, NAME)
    # What the router would read from the mounted file.
    mounted = tmp_path / "models.json"
    mounted.write_text(after["data"]["models.json"])
    [alias] = load_catalog(mounted)
    assert [(v.version, v.weight) for v in alias.versions] == [("tiny-llama-v1", 75), ("tiny-llama-v2", 25)]
    assert after["metadata"]["annotations"] == before["metadata"]["annotations"]
    [patch] = [r for r in api.requests if r.method == "PATCH"]
    assert patch.body["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert patch.content_type.endswith("merge-patch+json")


def test_a_concurrent_edit_is_kept_and_the_weights_rewritten_on_top(kube):
    api, core = kube

    class EditedMeanwhile(client.CoreV1Api):
        """Someone edits the ConfigMap right after each of our first reads."""

        edits = 0

        def read_namespaced_config_map(self, name, namespace, **kwargs):
            seen = super().read_namespaced_config_map(name, namespace, **kwargs)
            if EditedMeanwhile.edits < 2:
                EditedMeanwhile.edits += 1
                current = api.get(CONFIG_MAPS, NAMESPACE, NAME)
                document = json.loads(current["data"]["models.json"])
                document["models"][0]["versions"][0]["path"] = f"/models/edited-{EditedMeanwhile.edits}"
                current["data"]["models.json"] = json.dumps(document)
                api.put(CONFIG_MAPS, NAMESPACE, current)
            return seen

    store = KubeCatalogStore(EditedMeanwhile(api.api_client()), NAME, NAMESPACE)
    store.write_weights("tiny-llama", "tiny-llama-v1", "tiny-llama-v2", 5)
    document = json.loads(api.get(CONFIG_MAPS, NAMESPACE, NAME)["data"]["models.json"])
    versions = document["models"][0]["versions"]
    assert versions[0]["path"] == "/models/edited-2"  # the other writer's edit survived
    assert [v["weight"] for v in versions] == [95, 5]
    assert sum(r.method == "PATCH" for r in api.requests) == 3  # two 409s, then the write


def test_status_and_commands_live_in_annotations_and_leave_the_catalog_alone(kube):
    api, core = kube
    store = store_of(core)
    assert store.read_status() is None and store.read_command() is None
    data_before = api.get(CONFIG_MAPS, NAMESPACE, NAME)["data"]
    status = StatusRecord("tiny-llama", "tiny-llama-v1", "tiny-llama-v2", Phase.STEPPING, 5, (1, 5, 100), 1,
                          "", "step 1% passed", "2030-01-01T00:00:00+00:00")
    store.write_status(status)
    first = store.send_command(Command.PAUSE, "2030-01-01T00:00:01+00:00")
    second = store.send_command(Command.ABORT, "2030-01-01T00:00:02+00:00")
    stored = api.get(CONFIG_MAPS, NAMESPACE, NAME)
    assert stored["data"] == data_before
    assert set(stored["metadata"]["annotations"]) == {"meta.helm.sh/release-name", STATUS_ANNOTATION,
                                                      COMMAND_ANNOTATION}
    # A second invocation (a new client) reads what the first wrote.
    other = store_of(client.CoreV1Api(api.api_client()))
    assert other.read_status() == status
    assert (first.seq, second.seq) == (1, 2) and other.read_command() == second


def test_api_failures_are_store_errors_that_say_what_to_fix(kube):
    api, core = kube
    with pytest.raises(StoreError, match="configmap serving/missing: HTTP 404 not found"):
        KubeCatalogStore(core, "missing", NAMESPACE).read_catalog()
    api.fail_next(1, code=403)
    with pytest.raises(StoreError, match="ServiceAccount needs get and patch"):
        store_of(core).read_catalog()
    stored = api.get(CONFIG_MAPS, NAMESPACE, NAME)
    stored["data"] = {"other.json": "{}"}
    api.put(CONFIG_MAPS, NAMESPACE, stored)
    with pytest.raises(StoreError, match="no 'models.json' key"):
        store_of(core).read_catalog()
