"""Stop strings over streamed text (OpenAI `stop`).

Text arrives in arbitrary chunks, so a stop string may straddle chunks.
The matcher emits text as soon as it provably cannot be part of a stop
string and holds back the longest tail that is still a prefix of one:

    stops = ["###"]     feed("abc#")  -> emit "abc",   hold "#"
                        feed("#x")    -> emit "##x",  hold ""
                        feed("a##")   -> emit "a",    hold "##"
                        feed("#tail") -> emit "",     stopped (stop excluded)

The emitted text across all calls (plus flush()) equals the full text cut
at the first occurrence of any stop string.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(slots=True, frozen=True)
class StopMatch:
    """What feed() decided: emit is safe to send now; stopped means a stop
    string matched (emit then ends just before it) and generation should end."""

    emit: str
    stopped: bool
    matched_stop: str | None = None


class StopStringMatcher:
    """Per-request matcher. Not thread-safe; one stream feeds it in order."""

    __slots__ = ("_stops", "_max_hold_chars", "_held", "_stopped")

    def __init__(self, stops: Sequence[str]) -> None:
        if isinstance(stops, str):
            raise TypeError("stops must be a sequence of strings, not a single string")
        for stop in stops:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        # Deduplicated, in a fixed order so the reported match is stable.
        self._stops = tuple(dict.fromkeys(stops))
        # A held tail is a proper prefix of some stop, so never longer than this.
        self._max_hold_chars = max((len(stop) for stop in self._stops), default=1) - 1
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def feed(self, text: str) -> StopMatch:
        """Consume the next chunk of generated text."""
        if self._stopped:
            # Tokens already in flight when the stop was found (the replica is
            # cancelled asynchronously) are dropped, not an error.
            return StopMatch(emit="", stopped=True)
        buffer = self._held + text
        match_index, matched_stop = self._first_match(buffer)
        if matched_stop is not None:
            self._stopped = True
            self._held = ""
            return StopMatch(emit=buffer[:match_index], stopped=True, matched_stop=matched_stop)
        hold_chars = self._partial_match_length(buffer)
        split = len(buffer) - hold_chars
        self._held = buffer[split:]
        return StopMatch(emit=buffer[:split], stopped=False)

    def flush(self) -> str:
        """End of stream without a stop: release the held-back tail."""
        held, self._held = self._held, ""
        return held

    def _first_match(self, buffer: str) -> tuple[int, str | None]:
        """The match that COMPLETES first (then the earliest start).

        Generation stops the moment any stop string has fully appeared, so
        the answer must not depend on how the text was chunked: with stops
        ["b", "aba"] and text "aba", "b" completes first and "a" is emitted,
        whether "aba" arrived whole or a character at a time.
        """
        best: tuple[int, int] | None = None  # (end, start)
        best_stop = None
        for stop in self._stops:
            index = buffer.find(stop)
            if index != -1 and (best is None or (index + len(stop), index) < best):
                best, best_stop = (index + len(stop), index), stop
        return (best[1], best_stop) if best is not None else (len(buffer), None)

    def _partial_match_length(self, buffer: str) -> int:
        """Length of the longest suffix of buffer that is a proper prefix of a stop."""
        for length in range(min(self._max_hold_chars, len(buffer)), 0, -1):
            tail = buffer[-length:]
            if any(stop.startswith(tail) for stop in self._stops):
                return length
        return 0
