"""The router's catalog file, re-read while it runs.

In Kubernetes the catalog is a ConfigMap mounted as a directory: kubelet
swaps a `..data` symlink, so the file's content changes at once, some time
(up to about a minute) after the ConfigMap did; its mtime is the link's,
not reliable. So the watch polls the content every `interval_s` and
compares a SHA-256 of the bytes:

    same bytes as the live catalog            -> nothing
    bytes already rejected since the last apply -> nothing (logged once)
    new bytes -> parse and check all, load the new versions' tokenizers
                 (kept versions reuse theirs), in a thread
              -> ok: swap the registry in (LiveModels), log what changed
              -> any error: keep the live one, log why, count it rejected

A refusal is permanent or transient. Bad JSON, bad weights or two
versions that share traffic with different tokenizers stay wrong until
someone edits the catalog: those bytes are not tried again. A new
version's files missing or unreadable (an OSError) usually means they are
still arriving: in Kubernetes a sidecar copies a new version's tokenizer
files while the kubelet swaps in the catalog that names it. So those bytes
are tried again every `retry_every_polls` polls (not every poll: a load
that reads a large tokenizer.json before failing costs CPU), still logged
and counted once, and applied as soon as the files are there.

Streams under way keep the registry they started with (live_models).
"""

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sluice.router.catalog import ModelAliasSpec, parse_catalog
from sluice.router.live_models import LiveModels
from sluice.router.metrics import RouterMetrics
from sluice.router.models import ModelRegistry

log = logging.getLogger(__name__)

# Bad contents remembered (so each is logged once) until the next apply:
# an operator's few attempts, not an unbounded history.
MAX_REMEMBERED_REJECTIONS = 16

# A catalog waiting for its files is tried again every this many polls
# (10 s at the default 2 s interval).
DEFAULT_RETRY_EVERY_POLLS = 5


@dataclass(frozen=True, slots=True)
class CatalogFile:
    text: str
    digest: str  # SHA-256 hex of the bytes

    @classmethod
    def read(cls, path: Path) -> "CatalogFile":
        data = path.read_bytes()
        return cls(data.decode("utf-8"), hashlib.sha256(data).hexdigest())

    @property
    def hash_value(self) -> int:
        """48 bits of the digest: a gauge's float holds them exactly."""
        return int(self.digest[:12], 16)


def publish(metrics: RouterMetrics, registry: ModelRegistry, generation: int, content_hash: int,
            applied_unix_s: float, previous: ModelRegistry | None = None) -> None:
    """The live catalog's gauges; series of versions no longer listed go."""
    metrics.catalog_generation.set(generation)
    metrics.catalog_applied_unix_s.set(applied_unix_s)
    metrics.catalog_content_hash.set(content_hash)
    live = set()
    for alias in registry.aliases.values():
        total = sum(v.weight for v in alias.versions)
        for spec in alias.versions:
            live.add((alias.name, spec.version))
            metrics.catalog_weight_ratio.labels(alias.name, spec.version).set(spec.weight / total)
    if previous is not None:
        for alias in previous.aliases.values():
            for spec in alias.versions:
                if (alias.name, spec.version) not in live:
                    metrics.catalog_weight_ratio.remove(alias.name, spec.version)


def describe_change(old: dict[str, ModelAliasSpec], new: dict[str, ModelAliasSpec]) -> str:
    """One line for the log: aliases added or removed, each kept alias's
    versions and weights where they changed."""
    parts = []
    if added := sorted(set(new) - set(old)):
        parts.append(f"added {added}")
    if removed := sorted(set(old) - set(new)):
        parts.append(f"removed {removed}")
    for name in sorted(set(old) & set(new)):
        before = {v.version: v.weight for v in old[name].versions}
        after = {v.version: v.weight for v in new[name].versions}
        if before != after:
            shares = ", ".join(f"{v} {before.get(v, '-')}->{after.get(v, '-')}" for v in sorted(before | after))
            parts.append(f"{name}: {shares}")
        elif old[name] != new[name]:
            parts.append(f"{name}: fallbacks or routes")
    return "; ".join(parts) or "no change in aliases or weights"


@dataclass(slots=True)
class _Waiting:
    """The content refused only because files were missing: tried again."""
    digest: str
    polls: int = 0  # polls since it was last tried


class CatalogWatch:
    def __init__(self, path: Path, live: LiveModels, metrics: RouterMetrics, interval_s: float,
                 applied: CatalogFile, clock_unix_s: Callable[[], float] = time.time,
                 retry_every_polls: int = DEFAULT_RETRY_EVERY_POLLS) -> None:
        if retry_every_polls < 1:
            raise ValueError(f"retry_every_polls must be >= 1, got {retry_every_polls}")
        self._path = path
        self._live = live
        self._metrics = metrics
        self._interval_s = interval_s
        self._applied_digest = applied.digest
        self._rejected: set[str] = set()  # digests (or read errors) refused for good since the last apply
        self._waiting: _Waiting | None = None  # the content last refused for a transient cause
        self._retry_every_polls = retry_every_polls
        self._clock_unix_s = clock_unix_s

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.check()

    async def check(self) -> str:
        """One poll: "unchanged", "applied" or "rejected" (an already
        rejected content again reads as "unchanged": it was counted once,
        also while one waiting for its files is tried again and fails)."""
        try:
            found = await asyncio.to_thread(CatalogFile.read, self._path)
        except (OSError, UnicodeDecodeError) as error:
            return self._reject(f"unreadable: {error}", f"cannot read {self._path}: {error}")
        if found.digest == self._applied_digest or found.digest in self._rejected:
            return "unchanged"
        waiting = self._waiting if self._waiting is not None and self._waiting.digest == found.digest else None
        retrying = waiting is not None
        if waiting is not None:
            waiting.polls += 1
            if waiting.polls < self._retry_every_polls:
                return "unchanged"
            waiting.polls = 0
        previous = self._live.current
        try:
            catalog = parse_catalog(found.text, str(self._path))
            registry = await asyncio.to_thread(ModelRegistry, catalog, self._clock_unix_s(), previous)
        except OSError as error:  # a version's files missing or unreadable: maybe not there yet
            return self._wait_for_files(found.digest, f"{type(error).__name__}: {error}", retrying)
        # Any other failure to load the new catalog leaves the live one
        # serving and the watch running (the tokenizers library raises plain
        # Exception); it stays refused until the content changes.
        except Exception as error:  # noqa: BLE001
            reason = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"
            if retrying:  # counted when it first failed; now it fails for good
                self._waiting = None
                self._remember(found.digest)
                log.error("catalog change still rejected, no longer retried; still serving generation %d: %s",
                          self._live.generation, reason)
                return "unchanged"
            return self._reject(found.digest, reason)
        self._live.swap(registry)
        self._applied_digest = found.digest
        self._rejected.clear()
        self._waiting = None
        publish(self._metrics, registry, self._live.generation, found.hash_value, self._clock_unix_s(), previous)
        self._metrics.catalog_reloads_total.labels("applied").inc()
        log.info("catalog %s applied (generation %d, sha256 %s): %s", self._path, self._live.generation,
                 found.digest[:12], describe_change(previous.aliases, registry.aliases))
        return "applied"

    def _wait_for_files(self, digest: str, reason: str, retrying: bool) -> str:
        if retrying:
            return "unchanged"
        self._waiting = _Waiting(digest)
        self._metrics.catalog_reloads_total.labels("rejected").inc()
        log.error("catalog change rejected for now (retried every %d polls until its files are there); "
                  "still serving generation %d: %s", self._retry_every_polls, self._live.generation, reason)
        return "rejected"

    def _reject(self, key: str, reason: str) -> str:
        if key in self._rejected:
            return "unchanged"
        self._remember(key)
        self._metrics.catalog_reloads_total.labels("rejected").inc()
        log.error("catalog change rejected; still serving generation %d: %s", self._live.generation, reason)
        return "rejected"

    def _remember(self, key: str) -> None:
        if len(self._rejected) >= MAX_REMEMBERED_REJECTIONS:
            self._rejected.clear()
        self._rejected.add(key)
