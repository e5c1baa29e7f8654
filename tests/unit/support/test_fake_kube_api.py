"""The fake Kubernetes API server (tests/support/fake_kube_api.py) against
the real `kubernetes` client: the adapters' tests rely on these shapes, and
no real API server can run here to compare with."""

import threading

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from support.fake_kube_api import CONFIG_MAPS, ENDPOINT_SLICES, FakeKubeApi

NS = "sluice"


def slice_obj(name: str, service: str, ip: str) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": 50061, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
    }


@pytest.fixture
def api():
    with FakeKubeApi(max_watch_s=5) as fake:
        yield fake


@pytest.fixture
def discovery(api):
    with api.api_client() as api_client:
        yield client.DiscoveryV1Api(api_client)


@pytest.fixture
def core(api):
    with api.api_client() as api_client:
        yield client.CoreV1Api(api_client)


def test_list_filters_by_label_selector_and_carries_the_revision(api, discovery):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", "replica-v1", "10.0.0.1"))
    api.put(ENDPOINT_SLICES, NS, slice_obj("v2-a", "replica-v2", "10.0.0.2"))
    api.put(ENDPOINT_SLICES, NS, slice_obj("other", "gateway", "10.0.0.3"))
    api.put(ENDPOINT_SLICES, "elsewhere", slice_obj("v1-x", "replica-v1", "10.0.0.4"))

    listed = discovery.list_namespaced_endpoint_slice(
        NS, label_selector="kubernetes.io/service-name in (replica-v1, replica-v2)")

    assert isinstance(listed, client.V1EndpointSliceList)
    assert sorted(s.metadata.name for s in listed.items) == ["v1-a", "v2-a"]
    assert listed.metadata.resource_version == str(api.revision)
    assert listed.items[0].endpoints[0].conditions.ready is True
    only_v1 = discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name=replica-v1")
    assert [s.metadata.name for s in only_v1.items] == ["v1-a"]
    not_v1 = discovery.list_namespaced_endpoint_slice(NS, label_selector="kubernetes.io/service-name!=replica-v1")
    assert sorted(s.metadata.name for s in not_v1.items) == ["other", "v2-a"]


def test_watch_from_a_revision_streams_later_changes_then_times_out(api, discovery):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", "replica-v1", "10.0.0.1"))
    start = discovery.list_namespaced_endpoint_slice(NS).metadata.resource_version
    changed = slice_obj("v1-a", "replica-v1", "10.0.0.1")
    changed["endpoints"][0]["conditions"]["ready"] = False
    api.put(ENDPOINT_SLICES, NS, changed)
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-b", "replica-v1", "10.0.0.2"))
    api.remove(ENDPOINT_SLICES, NS, "v1-b")

    events = list(watch.Watch().stream(
        discovery.list_namespaced_endpoint_slice, NS, resource_version=start, timeout_seconds=1))

    assert [(e["type"], e["object"].metadata.name) for e in events] == [
        ("MODIFIED", "v1-a"), ("ADDED", "v1-b"), ("DELETED", "v1-b")]
    assert isinstance(events[0]["object"], client.V1EndpointSlice)
    assert events[0]["object"].endpoints[0].conditions.ready is False
    assert events[-1]["object"].metadata.resource_version == str(api.revision)


def test_watch_without_a_revision_starts_with_what_exists(api, discovery):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", "replica-v1", "10.0.0.1"))

    events = list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, NS, timeout_seconds=1))

    assert [(e["type"], e["object"].metadata.name) for e in events] == [("ADDED", "v1-a")]


def test_a_compacted_revision_is_410_gone_to_the_client(api, discovery):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", "replica-v1", "10.0.0.1"))
    old = str(api.revision)
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-b", "replica-v1", "10.0.0.2"))
    api.compact()

    with pytest.raises(ApiException) as gone:
        list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, NS, resource_version=old,
                                  timeout_seconds=1))

    assert gone.value.status == 410
    fresh = discovery.list_namespaced_endpoint_slice(NS).metadata.resource_version
    assert list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, NS, resource_version=fresh,
                                     timeout_seconds=1)) == []


def when_watching(api: FakeKubeApi, action) -> threading.Thread:
    """Run `action()` once the client's watch is open on the server (from another thread, as the
    client blocks reading the stream)."""
    thread = threading.Thread(target=lambda: api.wait_for(lambda a: a.open_watches > 0) and action())
    thread.start()
    return thread


def test_bookmarks_reach_watches_that_asked_and_move_the_revision(api, discovery):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", "replica-v1", "10.0.0.1"))
    start = str(api.revision)
    api.put(CONFIG_MAPS, NS, {"metadata": {"name": "unrelated"}, "data": {}})  # moves the revision, not this watch
    w = watch.Watch()
    bookmarker = when_watching(api, api.bookmark)

    seen = [e["type"] for e in w.stream(discovery.list_namespaced_endpoint_slice, NS, resource_version=start,
                                         allow_watch_bookmarks=True, timeout_seconds=1)]

    bookmarker.join()
    assert seen == ["BOOKMARK"]
    assert w.resource_version == str(api.revision)


def test_watches_without_bookmarks_get_none(api, discovery):
    bookmarker = when_watching(api, api.bookmark)
    seen = list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, NS, resource_version="0",
                                     timeout_seconds=1))
    bookmarker.join()
    assert seen == []


def test_configmap_get_patch_replace_and_conflict(api, core):
    core.create_namespaced_config_map(NS, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="catalog"), data={"models.json": '{"models": []}'}))

    patched = core.patch_namespaced_config_map("catalog", NS, {
        "metadata": {"annotations": {"sluice.dev/rollout": "paused"}}, "data": {"models.json": "{}"}})

    assert patched.data == {"models.json": "{}"}
    assert patched.metadata.annotations == {"sluice.dev/rollout": "paused"}
    assert api.requests[-1].content_type == "application/strategic-merge-patch+json"
    listed = core.list_namespaced_config_map(NS)
    assert isinstance(listed, client.V1ConfigMapList) and listed.items[0].data == {"models.json": "{}"}

    stale = core.read_namespaced_config_map("catalog", NS)
    core.patch_namespaced_config_map("catalog", NS, [{"op": "replace", "path": "/data/models.json", "value": "[]"}])
    assert api.requests[-1].content_type == "application/json-patch+json"
    assert api.get(CONFIG_MAPS, NS, "catalog")["data"] == {"models.json": "[]"}

    stale.data = {"models.json": "lost update"}
    with pytest.raises(ApiException) as conflict:
        core.replace_namespaced_config_map("catalog", NS, stale)
    assert conflict.value.status == 409
    fresh = core.read_namespaced_config_map("catalog", NS)
    fresh.data = {"models.json": "kept"}
    assert core.replace_namespaced_config_map("catalog", NS, fresh).data == {"models.json": "kept"}


def test_errors_are_status_objects(api, core):
    with pytest.raises(ApiException) as missing:
        core.read_namespaced_config_map("absent", NS)
    assert missing.value.status == 404
    api.fail_next(1, 503)
    with pytest.raises(ApiException) as unavailable:
        core.list_namespaced_config_map(NS)
    assert unavailable.value.status == 503
    with pytest.raises(ApiException) as bad:
        core.list_namespaced_config_map(NS, label_selector="a in (b")
    assert bad.value.status == 400
    core.create_namespaced_config_map(NS, {"metadata": {"name": "one"}})
    with pytest.raises(ApiException) as exists:
        core.create_namespaced_config_map(NS, {"metadata": {"name": "one"}})
    assert exists.value.status == 409


def test_end_watches_closes_open_streams_before_their_timeout(api, discovery):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", "replica-v1", "10.0.0.1"))
    ender = when_watching(api, api.end_watches)

    events = list(watch.Watch().stream(discovery.list_namespaced_endpoint_slice, NS,
                                       resource_version=str(api.revision), timeout_seconds=30))

    ender.join()
    assert events == []
    assert api.wait_for(lambda a: a.open_watches == 0)
    assert api.requests[-1].query["resourceVersion"] == str(api.revision)
