import random
import statistics
from collections import Counter

import pytest

from sluice.sim.workload import (
    Empirical,
    Fixed,
    GammaBursty,
    LogNormal,
    Poisson,
    RequestClass,
    SimRequest,
    Workload,
    seed_mix,
    tenant_names,
)


def make_request(**overrides) -> SimRequest:
    fields = dict(request_id="r0000000", arrival_s=0.0, tenant="tenant-0", service_class="interactive",
                  prompt_tokens=100, output_tokens=10)
    return SimRequest(**(fields | overrides))


def make_class(name="chat", share=1.0, **overrides) -> RequestClass:
    fields = dict(name=name, share=share, service_class="interactive", prompt=Fixed(100), output=Fixed(10))
    return RequestClass(**(fields | overrides))


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip([0.0, *times], times)]


def cv2(values: list[float]) -> float:
    return statistics.pvariance(values) / statistics.fmean(values) ** 2


# --- SimRequest ---------------------------------------------------------------------------


def test_a_client_bounds_its_output_exactly_unless_it_says_otherwise():
    assert make_request(output_tokens=37).requested_max_tokens == 37
    assert make_request(output_tokens=37, requested_max_tokens=512).requested_max_tokens == 512


@pytest.mark.parametrize("overrides", [
    {"prompt_tokens": 0}, {"output_tokens": 0}, {"arrival_s": -0.001}, {"arrival_s": float("nan")},
    {"service_class": "flex"}, {"output_tokens": 10, "requested_max_tokens": 9},
    {"prompt_tokens": 10, "shared_prefix_tokens": 11}, {"shared_prefix_tokens": -1},
])
def test_rejects_impossible_requests(overrides):
    with pytest.raises(ValueError):
        make_request(**overrides)


# --- arrival processes --------------------------------------------------------------------


@pytest.mark.parametrize("process", [Poisson(50.0), GammaBursty(50.0, 4.0), GammaBursty(50.0, 0.25)])
def test_arrivals_are_sorted_inside_the_window_at_the_mean_rate(process):
    duration_s = 2_000.0
    times = process.arrivals(duration_s, random.Random(1))
    assert times == sorted(times)
    assert 0.0 <= times[0] and times[-1] < duration_s
    # 100,000 expected; a Poisson count's sd is ~0.3% of that, a bursty one's about 2x wider.
    assert len(times) / duration_s == pytest.approx(50.0, rel=0.03)


def test_poisson_gaps_have_cv2_one():
    times = Poisson(20.0).arrivals(5_000.0, random.Random(2))
    assert cv2(gaps(times)) == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burst_factor", [0.25, 1.0, 4.0, 9.0])
def test_gamma_gaps_have_cv2_equal_to_the_burst_factor(burst_factor):
    process = GammaBursty(rate_per_s=10.0, burst_factor=burst_factor)
    times = process.arrivals(20_000.0, random.Random(3))  # ~200,000 gaps
    sample = gaps(times)
    assert statistics.fmean(sample) == pytest.approx(0.1, rel=0.03)
    assert cv2(sample) == pytest.approx(burst_factor, rel=0.08)


def test_gamma_shape_and_scale_follow_from_rate_and_burst_factor():
    process = GammaBursty(rate_per_s=8.0, burst_factor=4.0)
    assert (process.shape, process.scale_s) == (0.25, 0.5)
    assert process.shape * process.scale_s == 1 / 8.0  # the mean gap


def test_no_arrivals_in_an_empty_window_and_bad_parameters_are_refused():
    assert Poisson(5.0).arrivals(0.0, random.Random(0)) == []
    for make in (lambda: Poisson(0.0), lambda: GammaBursty(1.0, 0.0), lambda: GammaBursty(-1.0, 1.0)):
        with pytest.raises(ValueError):
            make()
    with pytest.raises(ValueError):
        Poisson(1.0).arrivals(-1.0, random.Random(0))


# --- length distributions -----------------------------------------------------------------


def test_lognormal_has_its_median_and_stays_inside_its_clamp():
    rng = random.Random(4)
    wide = [LogNormal(200, 0.8, 1, 1_000_000).sample(rng) for _ in range(50_000)]
    assert statistics.median(wide) == pytest.approx(200, rel=0.03)
    clamped = [LogNormal(200, 0.8, 150, 260).sample(rng) for _ in range(10_000)]
    assert min(clamped) == 150 and max(clamped) == 260
    # ~36% of the mass lies below 150 and ~37% above 260; all of it lands on the bounds.
    counts = Counter(clamped)
    assert 0.30 < counts[150] / len(clamped) < 0.42 and 0.30 < counts[260] / len(clamped) < 0.42


def test_fixed_and_empirical_draw_only_their_values():
    rng = random.Random(5)
    assert {Fixed(7).sample(rng) for _ in range(10)} == {7}
    drawn = Counter(Empirical([3, 3, 9]).sample(rng) for _ in range(30_000))
    assert set(drawn) == {3, 9}
    assert drawn[3] / 30_000 == pytest.approx(2 / 3, abs=0.02)  # a repeated value is twice as likely


@pytest.mark.parametrize("make", [
    lambda: Fixed(0), lambda: LogNormal(0, 1.0, 1, 10), lambda: LogNormal(10, -1.0, 1, 10),
    lambda: LogNormal(10, 1.0, 0, 10), lambda: LogNormal(10, 1.0, 11, 10), lambda: Empirical([]),
    lambda: Empirical([5, 0]),
])
def test_length_distributions_refuse_bad_parameters(make):
    with pytest.raises(ValueError):
        make()


# --- workloads ----------------------------------------------------------------------------


def test_generate_is_deterministic_for_a_seed():
    workload = seed_mix(rate_per_s=5.0, burst_factor=3.0)
    first = workload.generate(600.0, seed=11)
    assert first == workload.generate(600.0, seed=11)
    assert first != workload.generate(600.0, seed=12)
    assert [r.request_id for r in first[:3]] == ["r0000000", "r0000001", "r0000002"]
    assert [r.arrival_s for r in first] == sorted(r.arrival_s for r in first)


def test_a_different_arrival_process_with_the_same_seed_keeps_each_requests_contents():
    slow = Workload(Poisson(2.0), seed_mix(1.0).classes).generate(600.0, seed=3)
    fast = Workload(GammaBursty(8.0, 4.0), seed_mix(1.0).classes).generate(600.0, seed=3)

    def contents(r: SimRequest):
        return (r.tenant, r.service_class, r.prompt_tokens, r.output_tokens)

    assert len(fast) > len(slow) > 0
    assert [contents(r) for r in slow] == [contents(r) for r in fast[:len(slow)]]


def test_shares_are_normalised_weights_and_a_zero_share_never_appears():
    workload = Workload(Poisson(100.0), (
        make_class("a", share=3.0, prompt=Fixed(1)),
        make_class("b", share=1.0, prompt=Fixed(2)),
        make_class("never", share=0.0, prompt=Fixed(3)),
    ))
    requests = workload.generate(400.0, seed=6)  # ~40,000
    by_prompt = Counter(r.prompt_tokens for r in requests)
    assert by_prompt[1] / len(requests) == pytest.approx(0.75, abs=0.01)
    assert by_prompt[2] / len(requests) == pytest.approx(0.25, abs=0.01)
    assert by_prompt[3] == 0


def test_tenants_are_spread_uniformly_and_class_fields_reach_the_request():
    tenants = tenant_names(4)
    workload = Workload(Poisson(50.0), (make_class(
        tenants=tenants, service_class="batch", prompt=Fixed(40), output=LogNormal(300, 1.0, 1, 4_000),
        shared_prefix_tokens=64, requested_max_tokens=256),))
    requests = workload.generate(400.0, seed=7)
    shares = Counter(r.tenant for r in requests)
    assert set(shares) == set(tenants)
    assert all(n / len(requests) == pytest.approx(0.25, abs=0.02) for n in shares.values())
    assert {r.service_class for r in requests} == {"batch"}
    # The prefix is cut to the 40-token prompt; outputs are cut to the client's bound.
    assert {r.shared_prefix_tokens for r in requests} == {40}
    assert {r.requested_max_tokens for r in requests} == {256}
    assert max(r.output_tokens for r in requests) == 256


def test_workload_refuses_an_empty_or_ambiguous_mix():
    for classes in ((), (make_class("a"), make_class("a")), (make_class("a", share=0.0),)):
        with pytest.raises(ValueError):
            Workload(Poisson(1.0), classes)
    with pytest.raises(ValueError):
        make_class(service_class="flex")
    with pytest.raises(ValueError):
        make_class(tenants=())


# --- the seed mix ---------------------------------------------------------------------------


def test_seed_mix_has_200_token_chats_beside_32k_documents_and_a_batch_class():
    requests = seed_mix(rate_per_s=10.0).generate(3_600.0, seed=0)  # ~36,000
    documents = [r for r in requests if r.prompt_tokens >= 16_384]
    chats = [r for r in requests if r.service_class == "interactive" and r.prompt_tokens < 16_384]
    batch = [r for r in requests if r.service_class == "batch"]
    n = len(requests)
    assert len(requests) / 3_600.0 == pytest.approx(10.0, rel=0.03)
    assert (len(chats) / n, len(documents) / n, len(batch) / n) == pytest.approx((0.75, 0.10, 0.15), abs=0.01)

    assert statistics.median(r.prompt_tokens for r in chats) == pytest.approx(200, rel=0.05)
    assert statistics.median(r.output_tokens for r in chats) == pytest.approx(150, rel=0.05)
    assert max(r.prompt_tokens for r in chats) <= 4_096

    # Documents fill a 32K window and are interactive: the callers expect an answer now.
    assert {r.service_class for r in documents} == {"interactive"}
    assert max(r.prompt_tokens for r in documents) == 32_768
    assert statistics.median(r.prompt_tokens for r in documents) > 28_000
    assert 200 < statistics.median(r.output_tokens for r in documents) < 500

    assert 1_000 < statistics.median(r.prompt_tokens for r in batch) < 4_000
    assert {r.tenant for r in requests} == {"tenant-0", "tenant-1", "tenant-2", "tenant-3"}


def test_seed_mix_burst_factor_and_shares_are_parameters():
    assert isinstance(seed_mix(4.0).arrivals, Poisson)
    bursty = seed_mix(4.0, burst_factor=6.0).arrivals
    assert bursty == GammaBursty(4.0, 6.0)
    no_batch = seed_mix(20.0, batch_share=0.0).generate(300.0, seed=1)
    assert no_batch and {r.service_class for r in no_batch} == {"interactive"}
