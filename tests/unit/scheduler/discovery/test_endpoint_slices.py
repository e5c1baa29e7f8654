"""EndpointSliceDiscovery (the `kubernetes` client's list + watch) against
the fake API server in tests/support/fake_kube_api.py: no Kubernetes API
server can run here, so the fake speaks its list/watch shapes, 410 Gone and
bookmarks, and the real client parses them into its own models."""

import asyncio
import logging
import time

import pytest

from sluice.scheduler.discovery.endpoint_slices import EndpointSliceDiscovery, WatchTiming
from support.fake_kube_api import ENDPOINT_SLICES, FakeKubeApi

NS = "sluice"
FAST = WatchTiming(watch_timeout_s=5, read_margin_s=2, resync_s=300, list_timeout_s=3, backoff_s=(0.05, 0.1))


def slice_obj(name: str, ips: dict[str, bool | None], service: str = "replica-v1", port: int = 50061,
              terminating: frozenset[str] = frozenset()) -> dict:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ready, "terminating": ip in terminating}}
                      for ip, ready in ips.items()],
    }


class Seen:
    """What discovery handed the loop, in order."""

    def __init__(self) -> None:
        self.sets: list[frozenset[str]] = []

    def __call__(self, addresses: frozenset[str]) -> None:
        assert asyncio.get_running_loop()  # delivered on the loop, not the watch thread
        self.sets.append(addresses)

    async def until(self, expected: set[str], timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.sets or self.sets[-1] != expected:
            assert time.monotonic() < deadline, f"last address set {self.sets[-1:]} != {expected}"
            await asyncio.sleep(0.01)


@pytest.fixture
def api():
    with FakeKubeApi(max_watch_s=10) as fake:
        yield fake


async def running(api: FakeKubeApi, seen: Seen, timing: WatchTiming = FAST, clock=time.monotonic,
                  services=("replica-v1", "replica-v2")) -> EndpointSliceDiscovery:
    discovery = EndpointSliceDiscovery(api.api_client(), NS, services, "grpc", timing, clock)
    discovery.start(seen)
    return discovery


async def until_watching(api: FakeKubeApi) -> None:
    assert await asyncio.to_thread(api.wait_for, lambda a: a.open_watches == 1)


def lists(api: FakeKubeApi) -> int:
    return sum(1 for r in api.requests if r.method == "GET" and "watch" not in r.query)


async def test_initial_list_then_not_ready_new_and_deleted_slices(api, caplog):
    caplog.set_level(logging.INFO, logger="sluice.scheduler.discovery.endpoint_slices")
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.1": True, "10.0.0.2": True, "10.0.0.9": False}))
    api.put(ENDPOINT_SLICES, NS, slice_obj("gw", {"10.0.9.9": True}, service="gateway"))  # not selected
    seen = Seen()
    discovery = await running(api, seen)
    try:
        await seen.until({"10.0.0.1:50061", "10.0.0.2:50061"})
        assert api.requests[0].query["labelSelector"] == "kubernetes.io/service-name in (replica-v1,replica-v2)"
        await until_watching(api)

        api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.1": True, "10.0.0.2": False}))
        await seen.until({"10.0.0.1:50061"})
        api.put(ENDPOINT_SLICES, NS, slice_obj("v2-a", {"10.0.1.1": True}, service="replica-v2", port=50071))
        await seen.until({"10.0.0.1:50061", "10.0.1.1:50071"})
        api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.1": True}, terminating=frozenset({"10.0.0.1"})))
        await seen.until({"10.0.1.1:50071"})
        api.remove(ENDPOINT_SLICES, NS, "v2-a")
        await seen.until(set())
    finally:
        await discovery.stop()
    assert lists(api) == 1  # all of it from one list and its watch
    assert len(seen.sets) == 5  # one hand-off per change, none for unchanged sets
    messages = [r.getMessage() for r in caplog.records]
    assert "replica 10.0.0.2:50061 (service replica-v1) leaves placement: not ready" in messages
    assert "replica 10.0.0.1:50061 (service replica-v1) leaves placement: terminating" in messages
    assert "replica 10.0.1.1:50071 (service replica-v2) leaves placement: gone from the EndpointSlices" in messages
    assert "replica 10.0.1.1:50071 (service replica-v2) joins placement: endpoint ready" in messages


async def test_an_empty_first_list_is_still_handed_over(api):
    seen = Seen()
    discovery = await running(api, seen)
    try:
        await seen.until(set())
    finally:
        await discovery.stop()


async def test_410_gone_relists_and_catches_up(api):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.1": True}))
    seen = Seen()
    discovery = await running(api, seen)
    try:
        await seen.until({"10.0.0.1:50061"})
        await until_watching(api)
        # The watch drops; meanwhile a pod joins and history is compacted past what we saw.
        api.end_watches()
        api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.1": True, "10.0.0.2": True}))
        api.compact()
        await seen.until({"10.0.0.1:50061", "10.0.0.2:50061"})
    finally:
        await discovery.stop()
    assert lists(api) >= 2
    watches = [r for r in api.requests if "watch" in r.query]
    assert watches[0].query["allowWatchBookmarks"] == "true"


async def test_bookmarks_move_the_resume_point(api):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.1": True}))
    seen = Seen()
    discovery = await running(api, seen)
    try:
        await seen.until({"10.0.0.1:50061"})
        await until_watching(api)
        api.put(ENDPOINT_SLICES, NS, slice_obj("other", {"10.0.9.1": True}, service="gateway"))  # unseen change
        api.bookmark()
        assert await asyncio.to_thread(api.wait_for, lambda a: sum("watch" in r.query for r in a.requests) == 1)
        await asyncio.sleep(0.1)  # the bookmark reaches the client before the stream ends
        api.end_watches()
        assert await asyncio.to_thread(api.wait_for, lambda a: sum("watch" in r.query for r in a.requests) == 2)
    finally:
        await discovery.stop()
    second_watch = [r for r in api.requests if "watch" in r.query][1]
    assert second_watch.query["resourceVersion"] == str(api.revision)
    assert lists(api) == 1


async def test_resync_lists_again_while_the_watch_is_healthy(api):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.1": True}))
    now = [0.0]
    seen = Seen()
    discovery = await running(api, seen, WatchTiming(watch_timeout_s=5, resync_s=60, backoff_s=(0.05,)),
                              clock=lambda: now[0])
    try:
        await seen.until({"10.0.0.1:50061"})
        await until_watching(api)
        assert api.requests[-1].query["timeoutSeconds"] == "5"
        now[0] = 61.0  # the resync period passes while the watch is open
        api.end_watches()
        assert await asyncio.to_thread(api.wait_for, lambda a: lists(a) == 2)
        api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.2": True}))
        await seen.until({"10.0.0.2:50061"})
    finally:
        await discovery.stop()


async def test_api_errors_back_off_and_keep_the_last_known_replicas(api, caplog):
    api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.1": True}))
    api.fail_next(2, 503)
    seen = Seen()
    discovery = await running(api, seen)
    try:
        await seen.until({"10.0.0.1:50061"})
        await until_watching(api)
        api.fail_next(1, 500)
        api.end_watches()  # the next watch fails: the set stays, then list + watch resume
        assert await asyncio.to_thread(api.wait_for, lambda a: lists(a) == 4 and a.open_watches == 1)
        api.put(ENDPOINT_SLICES, NS, slice_obj("v1-a", {"10.0.0.2": True}))
        await seen.until({"10.0.0.2:50061"})
    finally:
        await discovery.stop()
    assert seen.sets == [{"10.0.0.1:50061"}, {"10.0.0.2:50061"}]
    assert sum("API answered 503" in r.getMessage() for r in caplog.records) == 2


async def test_stop_ends_an_open_watch_at_once(api):
    seen = Seen()
    discovery = await running(api, seen, WatchTiming(watch_timeout_s=600, resync_s=3600))
    await seen.until(set())
    await until_watching(api)

    await discovery.stop()

    assert not discovery._thread.is_alive()
    assert await asyncio.to_thread(api.wait_for, lambda a: a.open_watches == 0)


async def test_a_forbidden_list_names_the_permission_it_lacks(api, caplog):
    api.fail_next(1, 403)
    seen = Seen()
    discovery = await running(api, seen)
    try:
        await seen.until(set())
    finally:
        await discovery.stop()
    assert any("needs get/list/watch on discovery.k8s.io endpointslices in namespace sluice" in r.getMessage()
               for r in caplog.records)
