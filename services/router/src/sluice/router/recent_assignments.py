"""The versions recent request ids were given, so a retry lands where the
first attempt did even after the weights changed under it.

The hashed choice (catalog.pick_version) already keeps most ids in place
across a weight change; this memory keeps the rest: an id in the slice
that moved to another version still gets the version it got before, for
`ttl_s` after it was last seen, while the alias still sends new traffic to
that version (weight > 0: a version rolled back to 0 takes no retries).

Bounded: at most `max_entries` ids, the least recently seen forgotten
first. Pure: the caller passes the clock (monotonic seconds).
"""

from collections import OrderedDict
from dataclasses import dataclass

DEFAULT_TTL_S = 600.0
# Tens of thousands of ids (each ~100 bytes with its key) is a few MB: a
# busy router's last minutes of requests, with room.
DEFAULT_MAX_ENTRIES = 50_000


@dataclass(frozen=True, slots=True)
class _Assignment:
    version: str
    seen_s: float


class RecentAssignments:
    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if ttl_s <= 0 or max_entries < 1:
            raise ValueError(f"ttl_s must be > 0 and max_entries >= 1, got {ttl_s}, {max_entries}")
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        # (alias, request id) -> assignment, least recently seen first.
        self._entries: OrderedDict[tuple[str, str], _Assignment] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def recall(self, alias: str, request_id: str, now_s: float) -> str | None:
        """The version this id was given within the TTL, if any."""
        self._expire(now_s)
        entry = self._entries.get((alias, request_id))
        return entry.version if entry is not None else None

    def remember(self, alias: str, request_id: str, version: str, now_s: float) -> None:
        key = (alias, request_id)
        self._entries.pop(key, None)
        self._entries[key] = _Assignment(version, now_s)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)

    def _expire(self, now_s: float) -> None:
        # Oldest first: stop at the first one still fresh.
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            if now_s - entry.seen_s < self._ttl_s:
                return
            del self._entries[key]
