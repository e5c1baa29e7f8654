import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.admission.reservation import KVReservation, ReservationPolicy, bounded_output_tokens, reserve_for

POLICY = ReservationPolicy()  # 512 interactive, 1024 batch, no buffer


def test_max_tokens_when_given():
    assert reserve_for(POLICY, 100, 60, 4000, 16, is_batch=False) == KVReservation(60, 160, 10)


@pytest.mark.parametrize(("is_batch", "default"), [(False, 512), (True, 1024)])
def test_class_default_when_max_tokens_is_not_given(is_batch, default):
    reservation = reserve_for(POLICY, 100, 0, 100_000, 16, is_batch=is_batch)
    assert reservation.output_tokens == default
    assert reservation.tokens == 100 + default
    assert reservation.blocks == -(-(100 + default) // 16)


def test_never_past_the_room_the_context_leaves():
    assert bounded_output_tokens(POLICY, 5000, 300, is_batch=False) == 300
    assert bounded_output_tokens(POLICY, 0, 300, is_batch=True) == 300
    assert reserve_for(POLICY, 100, 0, 0, 16, is_batch=False) == KVReservation(0, 100, 7)


def test_buffer_fraction_adds_to_the_output_but_not_past_the_room():
    policy = ReservationPolicy(buffer_fraction=0.1)
    assert reserve_for(policy, 100, 100, 4000, 16, is_batch=False).tokens == 100 + 110
    assert reserve_for(policy, 100, 100, 105, 16, is_batch=False).tokens == 100 + 105
    assert reserve_for(ReservationPolicy(buffer_fraction=1.0), 10, 0, 4000, 16, is_batch=False).tokens == 10 + 1024


@pytest.mark.parametrize("kwargs", [
    {"default_output_tokens_interactive": 0}, {"default_output_tokens_batch": 0},
    {"buffer_fraction": -0.1}, {"buffer_fraction": 4.5},
])
def test_policy_is_validated(kwargs):
    with pytest.raises(ValueError):
        ReservationPolicy(**kwargs)


@settings(max_examples=200, deadline=None)
@given(
    prompt=st.integers(0, 10_000), requested=st.integers(0, 10_000), room=st.integers(0, 10_000),
    buffer=st.sampled_from([0.0, 0.1, 0.5, 2.0]), is_batch=st.booleans(), block=st.sampled_from([1, 16, 32]),
)
def test_reservation_bounds(prompt, requested, room, buffer, is_batch, block):
    policy = ReservationPolicy(buffer_fraction=buffer)
    reservation = reserve_for(policy, prompt, requested, room, block, is_batch)
    assert reservation.output_tokens <= room
    if requested:
        assert reservation.output_tokens == min(requested, room)
    assert prompt + reservation.output_tokens <= reservation.tokens <= prompt + room
    assert reservation.blocks == -(-reservation.tokens // block)
