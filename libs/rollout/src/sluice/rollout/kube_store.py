"""The rollout store for Kubernetes: the chart's catalog ConfigMap.

    data["models.json"]                         the router's catalog; only the weights change
    annotations["sluice.dev/rollout-status"]    the controller's status (JSON)
    annotations["sluice.dev/rollout-command"]   the operator's latest command (JSON)

Every write is a patch that carries the resourceVersion it was computed
from, so a concurrent edit (a `helm upgrade`, another operator) makes it
409 and it is recomputed on the fresh object instead of silently undoing
the other edit. The annotations never touch `data`, so writing a status
does not change the file the router reads.

RBAC: get and patch on this one ConfigMap (the chart's `<release>-rollout`
Role).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sluice.rollout.machine import Command
from sluice.rollout.records import CommandRecord, RecordError, StatusRecord
from sluice.rollout.store import StoreError
from sluice.rollout.weights import parse_catalog, render_catalog, with_weights

CATALOG_KEY = "models.json"
STATUS_ANNOTATION = "sluice.dev/rollout-status"
COMMAND_ANNOTATION = "sluice.dev/rollout-command"
# Optimistic-concurrency retries: each conflict means someone else just
# wrote; a handful is plenty unless something rewrites the object in a loop.
MAX_CONFLICT_RETRIES = 5

T = TypeVar("T")


def core_api_from_environment(context: str | None = None) -> client.CoreV1Api:
    """In a pod, its ServiceAccount; elsewhere the kubeconfig (its current
    context, or `context`)."""
    try:
        if context is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
        else:
            config.load_kube_config(context=context)
    except (config.ConfigException, OSError) as error:
        raise StoreError(f"no Kubernetes credentials (in-cluster or kubeconfig): {error}") from None
    return client.CoreV1Api()


class KubeCatalogStore:
    def __init__(self, api: client.CoreV1Api, name: str, namespace: str, *, catalog_key: str = CATALOG_KEY) -> None:
        if not name or not namespace:
            raise ValueError("the catalog ConfigMap needs a name and a namespace")
        self.api = api
        self.name = name
        self.namespace = namespace
        self.catalog_key = catalog_key

    @property
    def where(self) -> str:
        return f"configmap {self.namespace}/{self.name}"

    def read_catalog(self) -> dict[str, Any]:
        return self._catalog_of(self._read())

    def write_weights(self, alias: str, serving: str, candidate: str, candidate_pct: int) -> None:
        def attempt() -> None:
            current = self._read()
            document = with_weights(self._catalog_of(current), alias, serving, candidate, candidate_pct)
            self._patch({"metadata": {"resourceVersion": current.metadata.resource_version},
                         "data": {self.catalog_key: render_catalog(document)}})

        self._retrying(attempt)

    def read_command(self) -> CommandRecord | None:
        return self._annotation(self._read(), COMMAND_ANNOTATION, CommandRecord.from_json)

    def send_command(self, command: Command, at: str) -> CommandRecord:
        def attempt() -> CommandRecord:
            current = self._read()
            previous = self._annotation(current, COMMAND_ANNOTATION, CommandRecord.from_json)
            record = CommandRecord(command, (previous.seq if previous else 0) + 1, at)
            self._patch({"metadata": {"resourceVersion": current.metadata.resource_version,
                                      "annotations": {COMMAND_ANNOTATION: record.to_json()}}})
            return record

        return self._retrying(attempt)

    def read_status(self) -> StatusRecord | None:
        return self._annotation(self._read(), STATUS_ANNOTATION, StatusRecord.from_json)

    def write_status(self, status: StatusRecord) -> None:
        # No resourceVersion: the controller is the status's only writer,
        # and the patch touches nothing else.
        self._patch({"metadata": {"annotations": {STATUS_ANNOTATION: status.to_json()}}})

    # ---- internals
    def _read(self) -> client.V1ConfigMap:
        try:
            return self.api.read_namespaced_config_map(self.name, self.namespace)
        except ApiException as error:
            raise self._error("read", error) from None

    def _patch(self, body: dict[str, Any]) -> None:
        try:
            self.api.patch_namespaced_config_map(self.name, self.namespace, body)
        except ApiException as error:
            if error.status == 409:
                raise _Conflict() from None
            raise self._error("patch", error) from None

    def _retrying(self, attempt: Callable[[], T]) -> T:
        for _ in range(MAX_CONFLICT_RETRIES):
            try:
                return attempt()
            except _Conflict:
                continue
        raise StoreError(f"{self.where} changed under every one of {MAX_CONFLICT_RETRIES} attempts to write it")

    def _catalog_of(self, config_map: client.V1ConfigMap) -> dict[str, Any]:
        text = (config_map.data or {}).get(self.catalog_key)
        if text is None:
            raise StoreError(f"{self.where} has no {self.catalog_key!r} key")
        return parse_catalog(text, f"{self.where} key {self.catalog_key}")

    def _annotation(self, config_map: client.V1ConfigMap, key: str, parse: Callable[[str], T]) -> T | None:
        text = (config_map.metadata.annotations or {}).get(key)
        if text is None:
            return None
        try:
            return parse(text)
        except RecordError as error:
            raise StoreError(f"{self.where} annotation {key}: {error}") from None

    def _error(self, verb: str, error: ApiException) -> StoreError:
        hint = {
            401: "the credentials were refused",
            403: "forbidden: the rollout's ServiceAccount needs get and patch on this ConfigMap",
            404: "not found (is the release installed in this namespace?)",
        }.get(error.status or 0, _message(error))
        return StoreError(f"cannot {verb} {self.where}: HTTP {error.status} {hint}")


class _Conflict(Exception):
    """A 409: the object changed since it was read."""


def _message(error: ApiException) -> str:
    try:
        return str(json.loads(error.body).get("message", error.reason))
    except (TypeError, ValueError, AttributeError):
        return str(error.reason)
