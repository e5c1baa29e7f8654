from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.placement.headroom import UNBOUNDED_SEATS, headroom, seats_of
from sluice.placement.reservations import ReplicaHolding

from placement_factories import BATCH, INTERACTIVE, make_view


def holding(interactive_kv=0, batch_kv=0, interactive_seats=0, batch_seats=0) -> ReplicaHolding:
    return ReplicaHolding(kv_blocks=[interactive_kv, batch_kv], seats=[interactive_seats, batch_seats])


def test_interactive_counts_only_interactive_reservations():
    room = headroom(make_view(total=100, max_num_seqs=8), holding(30, 60, 2, 5), 0, INTERACTIVE, True, 0.5)
    assert (room.kv_blocks, room.seats) == (70, 6)
    assert room.load == 0.9


def test_batch_takes_only_unreserved_and_unreported_kv():
    view = make_view(total=100, free=50, max_num_seqs=8)
    room = headroom(view, holding(10, 20, 1, 1), 5, BATCH, False, 0.5)
    assert (room.kv_blocks, room.seats) == (45, 6)  # min(100 - 30, 50 - 5)
    room = headroom(make_view(total=100), holding(10, 20, 1, 1), 0, BATCH, False, 0.5)
    assert room.kv_blocks == 70


def test_batch_share_cap_while_interactive_is_present():
    view = make_view(total=100, max_num_seqs=8)
    room = headroom(view, holding(10, 30, 1, 3), 0, BATCH, True, 0.5)
    assert (room.kv_blocks, room.seats) == (20, 1)  # 50 - 30 blocks, 4 - 3 seats
    room = headroom(view, holding(10, 30, 1, 3), 0, BATCH, False, 0.5)
    assert (room.kv_blocks, room.seats) == (60, 4)


def test_a_replica_without_max_num_seqs_has_no_seat_limit():
    view = make_view(total=100)
    assert seats_of(view) == UNBOUNDED_SEATS
    room = headroom(view, holding(0, 100, 0, 500), 0, INTERACTIVE, False, 0.5)
    assert room.load == 1.0 and room.seats == UNBOUNDED_SEATS


@settings(max_examples=200, deadline=None)
@given(
    total=st.integers(1, 200), free=st.integers(0, 200), seqs=st.integers(0, 16),
    held=st.tuples(st.integers(0, 250), st.integers(0, 250), st.integers(0, 16), st.integers(0, 16)),
    unseen=st.integers(0, 50), present=st.booleans(), share=st.sampled_from([0.1, 0.5, 1.0]),
)
def test_batch_never_gets_more_than_interactive_nor_past_capacity(total, free, seqs, held, unseen, present, share):
    view = make_view(total=total, free=min(free, total), max_num_seqs=seqs)
    h = holding(*held)
    interactive = headroom(view, h, unseen, INTERACTIVE, present, share)
    batch = headroom(view, h, unseen, BATCH, present, share)
    assert batch.kv_blocks <= interactive.kv_blocks and batch.seats <= interactive.seats
    assert h.total_kv_blocks + batch.kv_blocks <= total
    assert h.kv_blocks[INTERACTIVE] + interactive.kv_blocks == total
    if present:
        assert h.kv_blocks[BATCH] + batch.kv_blocks <= int(share * total)
