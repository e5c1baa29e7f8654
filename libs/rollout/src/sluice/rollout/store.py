"""Where a rollout's weights, status and commands live: a local catalog
file (local_store) or the catalog ConfigMap (kube_store). The controller
and the CLI see only this interface."""

from __future__ import annotations

from typing import Any, Protocol

from sluice.rollout.machine import Command
from sluice.rollout.records import CommandRecord, StatusRecord


class StoreError(RuntimeError):
    """The catalog, status or command could not be read or written (says where and why)."""


class RolloutStore(Protocol):
    @property
    def where(self) -> str:
        """The catalog's location, for messages."""

    def read_catalog(self) -> dict[str, Any]:
        """The catalog document as the router reads it."""

    def write_weights(self, alias: str, serving: str, candidate: str, candidate_pct: int) -> None:
        """Serving at 100 - candidate_pct and candidate at candidate_pct, the
        rest of the catalog as it is now (read, modify, write)."""

    def read_command(self) -> CommandRecord | None:
        ...

    def send_command(self, command: Command, at: str) -> CommandRecord:
        """Write `command` with the next sequence number."""

    def read_status(self) -> StatusRecord | None:
        ...

    def write_status(self, status: StatusRecord) -> None:
        ...
