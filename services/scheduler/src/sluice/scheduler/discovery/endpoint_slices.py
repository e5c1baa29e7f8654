"""Follows the EndpointSlices of the replica Services with the `kubernetes`
client and reports the ready address set whenever it changes.

The client is synchronous, so list + watch runs in one thread:

    list (labelSelector, rv=R) ─> watch from R ─> events ─> ... ─> watch ends (timeoutSeconds)
      ^                                                                 │
      ├─ 410 Gone: history compacted past our rv; list again ───────────┤
      ├─ every resync_s: list again (a missed event cannot live longer) ┤
      └─ API or connection error: back off, list again ─────────────────┘

Each change is handed to the asyncio loop with `call_soon_threadsafe`, so
the scheduler's own state is only ever touched on its loop. `stop()` ends
the current stream at once (Watch.stop shuts its socket down) and joins.
"""

import asyncio
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import urllib3
from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from sluice.scheduler.discovery.endpoints import (
    EMPTY_READING,
    membership_change,
    read_endpoints,
    service_selector,
)
from sluice.scheduler.discovery.static import OnAddresses

log = logging.getLogger(__name__)

HTTP_GONE = 410

Publish = Callable[[frozenset[str]], object]


@dataclass(slots=True, frozen=True)
class WatchTiming:
    # How long one watch request stays open before it is renewed from the
    # last resourceVersion; the API server caps it too. Short enough that a
    # silently dead connection is noticed (the read timeout is this plus
    # read_margin_s), long enough to cost little.
    watch_timeout_s: int = 60
    read_margin_s: float = 10.0
    # A full list this often even when the watch is healthy, so a missed
    # event (a bug anywhere between etcd and here) cannot persist.
    resync_s: float = 300.0
    list_timeout_s: float = 10.0
    # After an error: wait, then list again; the wait grows per consecutive failure.
    backoff_s: tuple[float, ...] = (0.5, 1.0, 2.0, 5.0, 10.0)


def kube_api_client() -> client.ApiClient:
    """In a pod: the service account's token and CA (in-cluster config). Elsewhere: the kubeconfig
    ($KUBECONFIG or ~/.kube/config), so a scheduler run on a laptop can follow a cluster's slices."""
    try:
        config.load_incluster_config()
        log.info("Kubernetes API: in-cluster service account")
    except config.ConfigException:
        try:
            # $KUBECONFIG read now: the client's default is fixed when it is imported.
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG") or None)
        except (config.ConfigException, OSError) as error:
            raise RuntimeError(
                "SLUICE_REPLICA_DISCOVERY=endpointslices, but there is no Kubernetes API configuration: not in a "
                f"pod (no service account) and no usable kubeconfig ({error})") from error
        log.info("Kubernetes API: kubeconfig")
    return client.ApiClient()


class EndpointSliceDiscovery:
    """`start(on_addresses)` on the asyncio loop; `on_addresses` gets the
    full ready set (a frozenset of host:port) on the loop, first after the
    initial list, then on each change. Only the watch thread writes
    `_slices` and `_reading`."""

    def __init__(
        self,
        api_client: client.ApiClient,
        namespace: str,
        services: Sequence[str],
        port_name: str = "grpc",
        timing: WatchTiming = WatchTiming(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = client.DiscoveryV1Api(api_client)
        self._namespace = namespace
        self._selector = service_selector(services)
        self._port_name = port_name
        self._timing = timing
        self._clock = clock
        self._slices: dict[str, client.V1EndpointSlice] = {}
        self._reading = EMPTY_READING
        self._published = False
        self._stopping = threading.Event()
        self._watch: watch.Watch | None = None
        self._thread: threading.Thread | None = None

    def start(self, on_addresses: OnAddresses) -> None:
        loop = asyncio.get_running_loop()
        publish = lambda addresses: loop.call_soon_threadsafe(on_addresses, addresses)  # noqa: E731
        self._thread = threading.Thread(target=self._run, args=(publish,), name="endpointslice-watch", daemon=True)
        self._thread.start()
        log.info("following EndpointSlices %s in namespace %s, port %r", self._selector, self._namespace,
                 self._port_name)

    async def stop(self) -> None:
        self._stopping.set()
        deadline_s = time.monotonic() + self._timing.list_timeout_s + 1
        while self._thread is not None and self._thread.is_alive() and time.monotonic() < deadline_s:
            # Again each turn: a Watch created just before `_stopping` was set has not opened its
            # response yet when first told to stop, and Watch.stream clears its stop flag on entry.
            current = self._watch
            if current is not None:
                current.stop()
            await asyncio.to_thread(self._thread.join, 0.05)

    # ---- the watch thread
    def _run(self, publish: Publish) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                resource_version = self._list(publish)
                listed_at_s = self._clock()
                failures = 0
                while not self._stopping.is_set() and self._clock() - listed_at_s < self._timing.resync_s:
                    resource_version = self._watch_once(resource_version, listed_at_s, publish)
                continue  # resync due (or stopping): list again
            except ApiException as error:
                if error.status == HTTP_GONE:
                    log.info("EndpointSlice watch expired (410 Gone); listing again")
                    continue
                problem = f"API answered {error.status} {error.reason}"
                if error.status in (401, 403):
                    problem += (f" (the scheduler's ServiceAccount needs get/list/watch on "
                                f"discovery.k8s.io endpointslices in namespace {self._namespace})")
            except (urllib3.exceptions.HTTPError, OSError) as error:
                problem = f"connection failed: {error}"
            except Exception as error:  # noqa: BLE001 - a malformed object must not end discovery for good
                log.exception("EndpointSlice list/watch failed unexpectedly")
                problem = repr(error)
            if self._stopping.is_set():
                break
            failures += 1
            delay_s = self._timing.backoff_s[min(failures, len(self._timing.backoff_s)) - 1]
            log.warning("EndpointSlice list/watch: %s; listing again in %.1fs (keeping the last known replicas)",
                        problem, delay_s)
            self._stopping.wait(delay_s)

    def _list(self, publish: Publish) -> str:
        listed = self._api.list_namespaced_endpoint_slice(
            self._namespace, label_selector=self._selector, _request_timeout=self._timing.list_timeout_s)
        self._slices = {s.metadata.name: s for s in listed.items}
        self._apply(publish)
        return listed.metadata.resource_version

    def _watch_once(self, resource_version: str, listed_at_s: float, publish: Publish) -> str:
        """One watch request, to its timeout or the next resync; returns the rv to go on from."""
        until_resync_s = self._timing.resync_s - (self._clock() - listed_at_s)
        timeout_s = max(1, min(self._timing.watch_timeout_s, math.ceil(until_resync_s)))
        self._watch = watch.Watch()
        try:
            for event in self._watch.stream(
                self._api.list_namespaced_endpoint_slice,
                self._namespace,
                label_selector=self._selector,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout_s,
                _request_timeout=(self._timing.list_timeout_s, timeout_s + self._timing.read_margin_s),
            ):
                resource_version = self._on_event(event, resource_version, publish)
                if self._stopping.is_set():
                    break
        finally:
            self._watch = None
        return resource_version

    def _on_event(self, event: dict, resource_version: str, publish: Publish) -> str:
        kind = event["type"]
        if kind in ("ADDED", "MODIFIED"):
            self._slices[event["object"].metadata.name] = event["object"]
            self._apply(publish)
        elif kind == "DELETED":
            self._slices.pop(event["object"].metadata.name, None)
            self._apply(publish)
        elif kind != "BOOKMARK":
            log.warning("EndpointSlice watch: unexpected event type %r ignored", kind)
            return resource_version
        # A bookmark carries only a resourceVersion: where to resume without replaying history.
        raw_meta = (event.get("raw_object") or {}).get("metadata") or {}
        return raw_meta.get("resourceVersion") or resource_version

    def _apply(self, publish: Publish) -> None:
        """Recompute the ready set from the slices held; tell the loop when it changed (and after the
        first list, even if empty, so the scheduler knows discovery has answered)."""
        before, reading = self._reading, read_endpoints(self._slices.values(), self._port_name)
        self._reading = reading
        if reading.slices_without_port and reading.slices_without_port != before.slices_without_port:
            log.warning("EndpointSlices without a port named %r (their endpoints are ignored): %s",
                        self._port_name, ", ".join(reading.slices_without_port))
        change = membership_change(before, reading)
        for address in change.added:
            log.info("replica %s (service %s) joins placement: endpoint ready", address, reading.services[address])
        for address, why in change.removed:
            log.info("replica %s (service %s) leaves placement: %s", address, before.services[address], why)
        if change or not self._published:
            self._published = True
            publish(reading.ready_addresses())
