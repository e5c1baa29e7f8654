"""What the running controller and a separate `sluice rollout pause|resume|
abort|status` invocation tell each other, as small JSON documents kept
beside the catalog (a file each, or an annotation each on the ConfigMap).

Two documents, one writer each, so neither overwrites the other's news:

    status   written by the controller: where the rollout stands
    command  written by the operator's CLI: the latest command, with a
             sequence number so the controller acts on each one once
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from sluice.rollout.machine import Command, Phase


class RecordError(ValueError):
    """A status or command document that does not parse."""


@dataclass(frozen=True, slots=True)
class CommandRecord:
    command: Command
    seq: int  # increases with every command written; the controller remembers the last it acted on
    at: str  # ISO 8601, when the operator sent it

    def to_json(self) -> str:
        return json.dumps({"command": str(self.command), "seq": self.seq, "at": self.at})

    @classmethod
    def from_json(cls, text: str) -> CommandRecord:
        document = _object(text, "command")
        try:
            return cls(Command(document["command"]), int(document["seq"]), str(document.get("at", "")))
        except (KeyError, ValueError, TypeError) as error:
            raise RecordError(f"invalid rollout command {text!r}: {error}") from None


@dataclass(frozen=True, slots=True)
class StatusRecord:
    alias: str
    serving: str
    candidate: str
    phase: Phase
    candidate_pct: int
    steps_pct: tuple[int, ...]
    step_index: int
    reason: str  # why it rolled back, or how it completed
    note: str  # the controller's latest log line
    updated_at: str  # ISO 8601

    @property
    def finished(self) -> bool:
        return self.phase in (Phase.COMPLETED, Phase.ROLLED_BACK)

    def to_json(self) -> str:
        document = asdict(self)
        document["phase"] = str(self.phase)
        document["steps_pct"] = list(self.steps_pct)
        return json.dumps(document)

    @classmethod
    def from_json(cls, text: str) -> StatusRecord:
        document = _object(text, "status")
        try:
            return cls(
                alias=str(document["alias"]), serving=str(document["serving"]),
                candidate=str(document["candidate"]), phase=Phase(document["phase"]),
                candidate_pct=int(document["candidate_pct"]),
                steps_pct=tuple(int(s) for s in document["steps_pct"]),
                step_index=int(document["step_index"]), reason=str(document.get("reason", "")),
                note=str(document.get("note", "")), updated_at=str(document.get("updated_at", "")),
            )
        except (KeyError, ValueError, TypeError) as error:
            raise RecordError(f"invalid rollout status: {error}") from None

    def describe(self) -> str:
        """A few lines for `sluice rollout status`."""
        steps = " -> ".join(f"[{s}]" if i == self.step_index and self.phase in (Phase.STEPPING, Phase.PAUSED)
                            else str(s) for i, s in enumerate(self.steps_pct))
        lines = [f"{self.alias}: {self.serving} -> {self.candidate}  {self.phase}  "
                 f"candidate at {self.candidate_pct}%", f"steps: {steps}"]
        if self.reason:
            lines.append(f"reason: {self.reason}")
        if self.note:
            lines.append(f"last: {self.note}")
        lines.append(f"updated: {self.updated_at}")
        return "\n".join(lines)


def _object(text: str, what: str) -> dict[str, Any]:
    try:
        document = json.loads(text)
    except ValueError as error:
        raise RecordError(f"the rollout {what} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise RecordError(f"the rollout {what} is not a JSON object")
    return document
