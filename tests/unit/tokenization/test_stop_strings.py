"""StopStringMatcher: stop strings found across arbitrary chunk boundaries."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.tokenization import StopMatch, StopStringMatcher


def _run(stops: Sequence[str], chunks: Sequence[str]) -> tuple[str, bool]:
    matcher = StopStringMatcher(stops)
    emitted = []
    for chunk in chunks:
        match = matcher.feed(chunk)
        emitted.append(match.emit)
        if match.stopped:
            return "".join(emitted), True
    emitted.append(matcher.flush())
    return "".join(emitted), False


def _cut_at_first_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """Cut at the stop that completes first (ties: the earliest start)."""
    hits = [(i + len(s), i) for s in stops if (i := text.find(s)) != -1]
    return (text[: min(hits)[1]], True) if hits else (text, False)


def test_docstring_walkthrough() -> None:
    matcher = StopStringMatcher(["###"])
    assert matcher.feed("abc#") == StopMatch(emit="abc", stopped=False)
    assert matcher.feed("#x") == StopMatch(emit="##x", stopped=False)
    assert matcher.feed("a##") == StopMatch(emit="a", stopped=False)
    assert matcher.feed("#tail") == StopMatch(emit="", stopped=True, matched_stop="###")
    assert matcher.stopped


def test_held_tail_is_released_by_flush() -> None:
    matcher = StopStringMatcher(["</answer>"])
    assert matcher.feed("result </ans").emit == "result "
    assert matcher.flush() == "</ans"
    assert matcher.flush() == ""


def test_earliest_stop_wins_and_is_reported() -> None:
    matcher = StopStringMatcher(["world", "lo w"])
    assert matcher.feed("hello world") == StopMatch(emit="hel", stopped=True, matched_stop="lo w")


def test_feeding_after_a_stop_drops_text() -> None:
    matcher = StopStringMatcher(["x"])
    assert matcher.feed("axb").stopped
    assert matcher.feed("more") == StopMatch(emit="", stopped=True)
    assert matcher.flush() == ""


def test_no_stops_passes_text_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.feed("anything") == StopMatch(emit="anything", stopped=False)


def test_invalid_stops_are_rejected() -> None:
    with pytest.raises(ValueError, match="non-empty"):
        StopStringMatcher(["ok", ""])
    with pytest.raises(TypeError, match="not a single string"):
        StopStringMatcher("stop")  # type: ignore[arg-type]


# A small alphabet makes stops occur, overlap and straddle chunks often.
_ALPHABET = "ab\n😀"


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet=_ALPHABET, max_size=40),
    stops=st.lists(st.text(alphabet=_ALPHABET, min_size=1, max_size=4), max_size=4),
    data=st.data(),
)
def test_emitted_text_is_the_text_cut_at_the_first_stop(text: str, stops: list[str], data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=10)))
    bounds = [0, *cuts, len(text)]
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:])]
    assert _run(stops, chunks) == _cut_at_first_stop(text, stops)
