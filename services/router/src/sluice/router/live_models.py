"""The registry the router serves from now, and how a request gets its version.

    request ──resolve──▶ (registry snapshot, LoadedVersion) ──kept to the end of its stream
    catalog_watch ──swap──▶ `current` (one attribute: the next request reads the new one)

A request reads `current` once and keeps that snapshot (its version, the
alias's routes, the fallback's tokenizer) to the end, so a reload never
changes a stream under way, even one of a version the new catalog drops.
No lock: the swap and every read run on the one event loop, and an
attribute assignment replaces the whole registry at once.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from sluice.router.catalog import pick_version
from sluice.router.models import LoadedVersion, ModelRegistry
from sluice.router.recent_assignments import RecentAssignments


@dataclass(frozen=True, slots=True)
class Resolved:
    registry: ModelRegistry  # the snapshot the request reads for the rest of its life
    version: LoadedVersion


class LiveModels:
    # Written only by swap() (catalog_watch); read by the relay and the servicer.
    current: ModelRegistry

    def __init__(self, registry: ModelRegistry, assignments: RecentAssignments | None = None,
                 clock_s: Callable[[], float] = time.monotonic) -> None:
        self.current = registry
        self.generation = 1  # catalogs applied since start, this one included
        # Not `or`: an empty memory is falsy (it has a length), and the one
        # given carries the configured TTL and bound.
        self._assignments = assignments if assignments is not None else RecentAssignments()
        self._clock_s = clock_s

    def swap(self, registry: ModelRegistry) -> None:
        self.current = registry
        self.generation += 1

    def resolve(self, alias_name: str, request_id: str, *, remember: bool = True) -> Resolved:
        """The alias's version for this id: the one it was given recently if
        the alias still sends traffic there, else the hashed weighted choice.
        `remember=False` for an id no retry will bring back (an attempt id,
        unique per attempt): it would only crowd the memory."""
        registry = self.current
        alias = registry.alias(alias_name)  # MODEL_NOT_FOUND for an unknown alias
        if len(alias.versions) == 1:  # nothing to choose or remember
            return Resolved(registry, registry.version(alias.versions[0].version))
        if not remember:
            return Resolved(registry, registry.version(pick_version(alias, request_id).version))
        now_s = self._clock_s()
        remembered = self._assignments.recall(alias_name, request_id, now_s)
        version = remembered if remembered is not None and alias.serves(remembered) else \
            pick_version(alias, request_id).version
        self._assignments.remember(alias_name, request_id, version, now_s)
        return Resolved(registry, registry.version(version))
