from sluice.placement.replica_choice import (
    Candidate, fits, headroom_score, pick, prefix_score, within_load_margin,
)

from placement_factories import make_view


def candidate(replica_id: str, *, kv: int = 100, seats: int = 10, load: float = 0.0, matched: int = 0,
              prompt_blocks: int = 0) -> Candidate:
    return Candidate(make_view(replica_id), kv, seats, load, matched, prompt_blocks)


def test_scorers_are_within_zero_and_one():
    assert prefix_score(candidate("a", matched=3, prompt_blocks=4)) == 0.75
    assert prefix_score(candidate("a")) == 0.0
    assert headroom_score(candidate("a", load=0.3)) == 0.7
    assert headroom_score(candidate("a", load=1.7)) == 0.0
    assert headroom_score(candidate("a", load=-1.0)) == 1.0


def test_fits_needs_kv_and_a_seat():
    cs = [candidate("a", kv=9), candidate("b", kv=10, seats=0), candidate("c", kv=10, seats=1)]
    assert [c.view.replica_id for c in fits(cs, 10)] == ["c"]


def test_within_load_margin_of_the_least_loaded():
    cs = [candidate("a", load=0.1), candidate("b", load=0.35), candidate("c", load=0.36)]
    assert [c.view.replica_id for c in within_load_margin(cs, 0.25)] == ["a", "b"]
    assert within_load_margin([], 0.25) == []


def test_pick_prefers_the_prefix_then_the_less_loaded_then_the_id():
    cached = candidate("a", load=0.2, matched=4, prompt_blocks=4)
    idle = candidate("b", load=0.0, prompt_blocks=4)
    assert pick([idle, cached], 10, 0.25).view.replica_id == "a"
    assert pick([idle, candidate("a", load=0.3, matched=4, prompt_blocks=4)], 10, 0.25).view.replica_id == "b"
    assert pick([candidate("a", load=0.5), candidate("b", load=0.1)], 10, 1.0).view.replica_id == "b"
    assert pick([candidate("a"), candidate("b")], 10, 0.25).view.replica_id == "b"  # deterministic tie-break
    assert pick([candidate("a", kv=5)], 10, 0.25) is None
