"""The rollout store for a local catalog file (`make run`, a single host).

Every write is a whole-file atomic replace (a temporary file in the same
folder, then rename), so the router's reload never reads half a catalog.
Status and command sit beside the catalog:

    models.json                     the router's catalog (only weights change)
    models.json.rollout-status.json the controller's status
    models.json.rollout-command.json the operator's latest command
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from sluice.rollout.machine import Command
from sluice.rollout.records import CommandRecord, RecordError, StatusRecord
from sluice.rollout.store import StoreError
from sluice.rollout.weights import parse_catalog, render_catalog, with_weights


class LocalCatalogStore:
    def __init__(self, catalog_path: Path) -> None:
        self.catalog_path = Path(catalog_path)
        self.status_path = self.catalog_path.with_name(self.catalog_path.name + ".rollout-status.json")
        self.command_path = self.catalog_path.with_name(self.catalog_path.name + ".rollout-command.json")

    @property
    def where(self) -> str:
        return str(self.catalog_path)

    def read_catalog(self) -> dict[str, Any]:
        return parse_catalog(self._read(self.catalog_path, "catalog"), str(self.catalog_path))

    def write_weights(self, alias: str, serving: str, candidate: str, candidate_pct: int) -> None:
        document = with_weights(self.read_catalog(), alias, serving, candidate, candidate_pct)
        _replace(self.catalog_path, render_catalog(document))

    def read_command(self) -> CommandRecord | None:
        return self._record(self.command_path, CommandRecord.from_json)

    def send_command(self, command: Command, at: str) -> CommandRecord:
        previous = self.read_command()
        record = CommandRecord(command, (previous.seq if previous else 0) + 1, at)
        _replace(self.command_path, record.to_json() + "\n")
        return record

    def read_status(self) -> StatusRecord | None:
        return self._record(self.status_path, StatusRecord.from_json)

    def write_status(self, status: StatusRecord) -> None:
        _replace(self.status_path, status.to_json() + "\n")

    def _record(self, path: Path, parse):  # type: ignore[no-untyped-def]
        if not path.exists():
            return None
        try:
            return parse(self._read(path, "rollout record"))
        except RecordError as error:
            raise StoreError(f"{path}: {error}") from None

    @staticmethod
    def _read(path: Path, what: str) -> str:
        try:
            return path.read_text()
        except OSError as error:
            raise StoreError(f"cannot read the {what} {path}: {error.strerror or error}") from None


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` atomically, keeping the file's mode."""
    try:
        mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as out:
                out.write(text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(temporary, mode)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as error:
        raise StoreError(f"cannot write {path}: {error.strerror or error}") from None

