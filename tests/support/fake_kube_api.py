"""A small in-process stand-in for a Kubernetes API server.

No API server can run here (no etcd, no kube-apiserver binary, no cluster),
so the Kubernetes adapters are tested against this: a threaded HTTP server on
127.0.0.1 that speaks the API's JSON shapes for the calls Sluice makes, and
nothing more. The real `kubernetes` client talks to it unchanged
(`api_client()` gives one pointed at it).

What it does, generic over resources (`ResourceKind`):
- stores objects (dicts) by (api prefix, namespace, plural, name), stamping
  `metadata.resourceVersion` from one global counter that only grows, as
  etcd's revision does;
- list `GET /api/v1/namespaces/{ns}/{plural}` and
  `/apis/{group}/{version}/namespaces/{ns}/{plural}` with `labelSelector`
  (`k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`) and
  `fieldSelector` on `metadata.name` / `metadata.namespace`;
- watch (`watch=true|1`) streaming newline-delimited events as chunks:
  from `resourceVersion=N` the recorded events after N; without one (or
  "0") synthetic ADDED events for what exists, then changes. N older than
  the compaction point (`compact()`) gets the server's answer, an ERROR
  event carrying a 410 Status. `timeoutSeconds` ends the stream; BOOKMARK
  events go to watches that asked for them (`allowWatchBookmarks`) when the
  test calls `bookmark()`;
- get, create (POST), replace (PUT, 409 on a stale
  `metadata.resourceVersion`), patch (merge and strategic-merge patches
  both applied as a JSON merge patch, RFC 7386; JSON patch, RFC 6902, for
  add/replace/remove/test) and delete, each emitting its watch event.

Test-side methods (`put`, `remove`, `get`, `compact`, `bookmark`,
`end_watches`, `fail_next`) change state directly and emit the same events;
`requests` is the log of what the client sent. The HTTP framing lives in
kube_http.py, selectors in kube_selectors.py, patches in kube_patches.py.
"""

import copy
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

from support.kube_http import ApiError, handler_for
from support.kube_patches import PatchError, json_patch, merge_patch
from support.kube_selectors import matches_fields, matches_labels

Obj = dict[str, Any]


@dataclass(slots=True, frozen=True)
class ResourceKind:
    prefix: str  # "api/v1" or "apis/{group}/{version}"
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return self.prefix.removeprefix("api/").removeprefix("apis/")


CONFIG_MAPS = ResourceKind("api/v1", "configmaps", "ConfigMap")
SERVICES = ResourceKind("api/v1", "services", "Service")
PODS = ResourceKind("api/v1", "pods", "Pod")
ENDPOINT_SLICES = ResourceKind("apis/discovery.k8s.io/v1", "endpointslices", "EndpointSlice")
DEFAULT_KINDS = (CONFIG_MAPS, SERVICES, PODS, ENDPOINT_SLICES)


@dataclass(slots=True, frozen=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any  # parsed JSON, or None


@dataclass(slots=True, frozen=True)
class _Event:
    resource_version: int
    kind: ResourceKind
    namespace: str
    type: str  # ADDED | MODIFIED | DELETED
    obj: Obj


_PATH = re.compile(r"^/(api/v1|apis/[^/]+/[^/]+)/namespaces/([^/]+)/([^/]+)(?:/([^/]+))?$")
_TRUE = {"true", "1"}  # how clients spell a boolean query parameter


class FakeKubeApi:
    """`with FakeKubeApi() as api:`; `api.url`; `api.api_client()`.
    Every field below is guarded by `_lock`; watch threads wait on `_changed`."""

    def __init__(self, kinds: tuple[ResourceKind, ...] = DEFAULT_KINDS, max_watch_s: float = 30.0) -> None:
        self._kinds = {(k.prefix, k.plural): k for k in kinds}
        self._max_watch_s = max_watch_s  # a watch without timeoutSeconds still ends, so no test hangs on one
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._objects: dict[tuple[ResourceKind, str, str], Obj] = {}
        self._events: list[_Event] = []
        self._revision = 0
        self._compacted_at = 0
        self._bookmarks = 0  # bumped by bookmark(); each open watch sends one BOOKMARK per bump
        self._watch_generation = 0  # bumped by end_watches() and stop()
        self._open_watches = 0
        self._failures: list[int] = []
        self._requests: list[RecordedRequest] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-kube-api", daemon=True)

    # ---- lifecycle
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "FakeKubeApi":
        self._thread.start()
        return self

    def stop(self) -> None:
        self.end_watches()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> "FakeKubeApi":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def api_client(self) -> Any:
        """A real `kubernetes.client.ApiClient` aimed at this server."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)

    # ---- test-side state changes (each emits the watch event a real server would)
    def put(self, kind: ResourceKind, namespace: str, obj: Obj) -> Obj:
        """Create or replace by name, ignoring resourceVersion; returns the stored copy."""
        with self._lock:
            name = obj["metadata"]["name"]
            exists = (kind, namespace, name) in self._objects
            return self._store(kind, namespace, obj, "MODIFIED" if exists else "ADDED")

    def remove(self, kind: ResourceKind, namespace: str, name: str) -> None:
        with self._lock:
            self._delete(kind, namespace, name)

    def get(self, kind: ResourceKind, namespace: str, name: str) -> Obj | None:
        with self._lock:
            found = self._objects.get((kind, namespace, name))
            return copy.deepcopy(found) if found is not None else None

    def compact(self) -> int:
        """Forget history up to now: a watch from an older resourceVersion gets 410 Gone."""
        with self._lock:
            self._compacted_at = self._revision
            self._events.clear()
            return self._revision

    def bookmark(self) -> None:
        """Send each open watch that allowed bookmarks a BOOKMARK at the current revision."""
        with self._changed:
            self._bookmarks += 1
            self._changed.notify_all()

    def end_watches(self) -> None:
        """Close every open watch stream now, as a restarting API server or a broken connection would."""
        with self._changed:
            self._watch_generation += 1
            self._changed.notify_all()

    def fail_next(self, count: int = 1, code: int = 503) -> None:
        """Answer the next `count` requests with this status (a Status body), whatever they ask."""
        with self._lock:
            self._failures.extend([code] * count)

    @property
    def revision(self) -> int:
        with self._lock:
            return self._revision

    @property
    def open_watches(self) -> int:
        with self._lock:
            return self._open_watches

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._requests)

    def wait_for(self, predicate: Any, timeout_s: float = 5.0) -> bool:
        """Poll `predicate(self)` until true or `timeout_s` passes (for tests that wait on the client)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self):
                return True
            time.sleep(0.01)
        return bool(predicate(self))

    # ---- store internals (call with _lock held)
    def _store(self, kind: ResourceKind, namespace: str, obj: Obj, event_type: str) -> Obj:
        self._revision += 1
        stored = copy.deepcopy(obj)
        stored["apiVersion"], stored["kind"] = kind.api_version, kind.kind
        meta = stored.setdefault("metadata", {})
        previous = self._objects.get((kind, namespace, meta["name"]))
        meta["namespace"] = namespace
        meta["resourceVersion"] = str(self._revision)
        meta.setdefault("uid", previous["metadata"]["uid"] if previous else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2024-01-01T00:00:00Z")
        self._objects[(kind, namespace, meta["name"])] = stored
        self._events.append(_Event(self._revision, kind, namespace, event_type, copy.deepcopy(stored)))
        self._changed.notify_all()
        return copy.deepcopy(stored)

    def _delete(self, kind: ResourceKind, namespace: str, name: str) -> Obj:
        gone = self._objects.pop((kind, namespace, name), None)
        if gone is None:
            raise ApiError(404, "NotFound", f'{kind.plural} "{name}" not found')
        self._revision += 1
        gone["metadata"]["resourceVersion"] = str(self._revision)
        self._events.append(_Event(self._revision, kind, namespace, "DELETED", copy.deepcopy(gone)))
        self._changed.notify_all()
        return gone

    def _existing(self, kind: ResourceKind, namespace: str, name: str) -> Obj:
        found = self._objects.get((kind, namespace, name))
        if found is None:
            raise ApiError(404, "NotFound", f'{kind.plural} "{name}" not found')
        return found

    def _selected(self, kind: ResourceKind, namespace: str, query: dict[str, str], obj: Obj) -> bool:
        meta = obj.get("metadata", {})
        return (matches_labels(query.get("labelSelector", ""), meta.get("labels") or {})
                and matches_fields(query.get("fieldSelector", ""), meta.get("name", ""), namespace))

    # ---- the HTTP verbs, called by the handler
    def handle(self, method: str, path: str, query: dict[str, str], content_type: str, body: Any) -> Obj:
        with self._lock:
            self._record(RecordedRequest(method, path, query, content_type, body))
            kind, namespace, name = self._route(path, query)
            if method == "GET" and name is None:
                items = [copy.deepcopy(o) for (k, ns, _), o in sorted(self._objects.items(), key=lambda kv: kv[0][2])
                         if k == kind and ns == namespace and self._selected(kind, namespace, query, o)]
                return {"kind": f"{kind.kind}List", "apiVersion": kind.api_version,
                        "metadata": {"resourceVersion": str(self._revision)}, "items": items}
            if method == "GET":
                return copy.deepcopy(self._existing(kind, namespace, name))
            if method == "POST" and name is None:
                return self._create(kind, namespace, body)
            if method == "PUT" and name is not None:
                return self._replace(kind, namespace, name, body)
            if method == "PATCH" and name is not None:
                return self._patch(kind, namespace, name, content_type, body)
            if method == "DELETE" and name is not None:
                self._delete(kind, namespace, name)
                return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}
            raise ApiError(405, "MethodNotAllowed", f"{method} {path} is not supported")

    def _record(self, request: RecordedRequest) -> None:
        """Log the request; answer it with an injected failure if one is pending (call with _lock held)."""
        self._requests.append(request)
        if self._failures:
            code = self._failures.pop(0)
            raise ApiError(code, "ServiceUnavailable" if code == 503 else "InternalError", "injected failure")

    def _route(self, path: str, query: dict[str, str]) -> tuple[ResourceKind, str, str | None]:
        matches_labels(query.get("labelSelector", ""), {})  # a bad selector is a 400 before anything else
        matches_fields(query.get("fieldSelector", ""), "", "")
        found = _PATH.match(path)
        kind = self._kinds.get((found.group(1), found.group(3))) if found else None
        if found is None or kind is None:
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
        return kind, found.group(2), found.group(4)

    def _create(self, kind: ResourceKind, namespace: str, body: Obj) -> Obj:
        name = (body.get("metadata") or {}).get("name")
        if not name:
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if (kind, namespace, name) in self._objects:
            raise ApiError(409, "AlreadyExists", f'{kind.plural} "{name}" already exists')
        body["metadata"].pop("resourceVersion", None)
        return self._store(kind, namespace, body, "ADDED")

    def _replace(self, kind: ResourceKind, namespace: str, name: str, body: Obj) -> Obj:
        current = self._existing(kind, namespace, name)
        sent = (body.get("metadata") or {}).get("resourceVersion")
        if sent and sent != current["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on {kind.plural} "{name}": '
                           "the object has been modified; please apply your changes to the latest version")
        body.setdefault("metadata", {})["name"] = name
        return self._store(kind, namespace, body, "MODIFIED")

    def _patch(self, kind: ResourceKind, namespace: str, name: str, content_type: str, body: Any) -> Obj:
        current = copy.deepcopy(self._existing(kind, namespace, name))
        if content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            sent = ((body or {}).get("metadata") or {}).get("resourceVersion")
            if sent and sent != current["metadata"]["resourceVersion"]:
                raise ApiError(409, "Conflict", f'the object {kind.plural} "{name}" has been modified')
            patched = merge_patch(current, body)
        elif content_type == "application/json-patch+json":
            try:
                patched = json_patch(current, body)
            except PatchError as error:
                raise ApiError(422, "Invalid", str(error)) from error
        else:
            raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format: "
                           f"{content_type}")
        patched["metadata"]["name"] = name
        return self._store(kind, namespace, patched, "MODIFIED")

    # ---- watch
    def open_watch(self, path: str, query: dict[str, str],
                   client_gone: Callable[[], bool] = lambda: False) -> Iterator[Obj]:
        """Checks the request and fixes where the stream starts; the returned iterator yields events until
        timeoutSeconds, end_watches(), stop() or `client_gone()` (it runs in the handler thread)."""
        timeout_s = min(float(query.get("timeoutSeconds") or self._max_watch_s), self._max_watch_s)
        with self._lock:
            self._record(RecordedRequest("GET", path, query, "", None))
            kind, namespace, name = self._route(path, query)
            if name is not None:
                raise ApiError(405, "MethodNotAllowed", "watch a collection, not one object")
            start = query.get("resourceVersion", "")
            if start in ("", "0"):
                initial = [{"type": "ADDED", "object": copy.deepcopy(o)} for (k, ns, _), o in self._objects.items()
                           if k == kind and ns == namespace and self._selected(kind, namespace, query, o)]
                return self._events_after(kind, namespace, query, self._revision, initial, timeout_s, client_gone)
            if int(start) < self._compacted_at:
                expired = ApiError(410, "Expired", f"too old resource version: {start} ({self._compacted_at})")
                # the real server answers 200, sends this one event and closes the stream
                return iter([{"type": "ERROR", "object": expired.status()}])
            return self._events_after(kind, namespace, query, int(start), [], timeout_s, client_gone)

    def _events_after(self, kind: ResourceKind, namespace: str, query: dict[str, str], after: int,
                      pending: list[Obj], timeout_s: float, client_gone: Callable[[], bool]) -> Iterator[Obj]:
        deadline = time.monotonic() + timeout_s
        bookmarks_on = query.get("allowWatchBookmarks", "").lower() in _TRUE
        with self._lock:
            self._open_watches += 1
            generation, bookmarks_seen = self._watch_generation, self._bookmarks
        try:
            while True:
                yield from pending
                with self._changed:
                    while True:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0 or generation != self._watch_generation or client_gone():
                            return
                        pending = [{"type": e.type, "object": copy.deepcopy(e.obj)} for e in self._events
                                   if e.resource_version > after and e.kind == kind and e.namespace == namespace
                                   and self._selected(kind, namespace, query, e.obj)]
                        after = self._revision  # every event up to here has now been considered
                        if bookmarks_on and self._bookmarks != bookmarks_seen:
                            bookmarks_seen = self._bookmarks
                            pending.append({"type": "BOOKMARK", "object": {
                                "kind": kind.kind, "apiVersion": kind.api_version,
                                "metadata": {"resourceVersion": str(self._revision)}}})
                        if pending:
                            break
                        # Short waits: a client that hung up is noticed soon, so open_watches drops to 0.
                        self._changed.wait(timeout=min(remaining, 0.05))
        finally:
            with self._lock:
                self._open_watches -= 1
