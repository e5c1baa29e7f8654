from sluice.placement.prefix_index import PrefixIndex

from placement_factories import hashes


def test_a_hit_is_a_run_of_leading_blocks():
    index = PrefixIndex()
    index.apply("r0", hashes("h0", "h1", "h3"), ())
    assert index.matched_blocks("r0", hashes("h0", "h1", "h2", "h3")) == 2
    assert index.matched_blocks("r0", hashes("h1")) == 1
    assert index.matched_blocks("r0", hashes("x", "h0")) == 0
    assert index.matched_blocks("unknown", hashes("h0")) == 0
    assert index.num_blocks("r0") == 3


def test_deltas_evict_and_snapshots_replace():
    index = PrefixIndex()
    index.apply("r0", hashes("a", "b"), ())
    index.apply("r0", hashes("c"), hashes("a"))
    assert index.matched_blocks("r0", hashes("a")) == 0 and index.num_blocks("r0") == 2
    index.apply("r0", hashes("z"), (), snapshot=True)
    assert index.num_blocks("r0") == 1 and index.matched_blocks("r0", hashes("z")) == 1


def test_forget_drops_a_replica():
    index = PrefixIndex()
    index.apply("r0", hashes("a"), ())
    index.apply("r1", hashes("a"), ())
    index.forget("r0")
    index.forget("never-seen")
    assert index.matched_blocks("r0", hashes("a")) == 0 and index.matched_blocks("r1", hashes("a")) == 1
