"""The capacity planner: the replica search against a fake simulation (the
smallest count that meets, shapes that do not fit skipped, the cheapest
across GPUs, nothing feasible, saturation), what "meeting the SLOs" means
on real records, and a real small plan end to end."""

import json

import pytest

from sluice.sim import plan_cli
from sluice.sim.model_spec import MODELS
from sluice.sim.planner import (
    DOES_NOT_FIT, MET, NOT_MET, SATURATED, Fleet, FleetCost, Probe, Scenario, SearchSpace, SloTargets, measure,
    parse_prices, plan, search_shape,
)
from sluice.sim.results import RequestRecord, SimResults
from sluice.sim.trace import workload_requests

TARGETS = SloTargets(ttft_s=2.0, tpot_s=0.1, attainment=0.99, batch_attainment=0.95)
PRICES = {"h100": 2.5, "h200": 3.5}


def make_probe(interactive=1.0, batch=1.0, delayed=0.0, output_tokens_per_s=1000.0):
    return Probe(interactive_attainment=interactive, batch_attainment=batch, interactive_goodput_rps=1.0,
                 output_tokens_per_s=output_tokens_per_s, total_tokens_per_s=10 * output_tokens_per_s,
                 delayed_share=delayed)


class FakeFleets:
    """A monotone fake: a shape meets the SLOs from `needed[(gpu, tp)]`
    replicas up, its attainment climbing toward that point; records every
    fleet it was asked to simulate."""

    def __init__(self, needed):
        self.needed = needed
        self.calls = []

    def __call__(self, fleet: Fleet) -> Probe:
        self.calls.append(fleet)
        needed = self.needed[(fleet.gpu, fleet.tp)]
        if fleet.replicas >= needed:
            return make_probe()
        return make_probe(interactive=0.5 + 0.4 * fleet.replicas / needed, delayed=0.2)


def fits_all(gpu, tp):
    return None


def test_the_smallest_replica_count_that_meets_is_found_in_logarithmic_probes():
    fake = FakeFleets({("h100", 8): 5})
    outcome = search_shape("h100", 8, SearchSpace(max_replicas=32), TARGETS, 2.5, fake)
    assert outcome.status == MET
    assert outcome.choice.fleet == Fleet("h100", 8, 5)
    # 1, 2, 4 miss, 8 meets; then bisect (4, 8): 6 meets, 5 meets.
    assert [f.replicas for f in fake.calls] == [1, 2, 4, 8, 6, 5]
    assert [a.fleet.replicas for a in outcome.attempts] == [1, 2, 4, 5, 6, 8]
    assert outcome.choice.cost_per_hour == pytest.approx(2.5 * 40)
    assert outcome.note == "6 probes; 4 missed on interactive"


@pytest.mark.parametrize("needed", [1, 2, 3, 7, 16, 17, 31, 32])
def test_every_boundary_up_to_max_replicas_is_found_exactly(needed):
    fake = FakeFleets({("h200", 4): needed})
    outcome = search_shape("h200", 4, SearchSpace(max_replicas=32), TARGETS, 3.5, fake)
    assert outcome.choice.fleet.replicas == needed
    assert len(fake.calls) == len(set(fake.calls))  # no fleet simulated twice


def test_shapes_the_model_does_not_fit_are_never_simulated():
    fake = FakeFleets({("h100", 4): 3, ("h100", 8): 2})

    def fits(gpu, tp):
        return None if tp >= 4 else f"does not fit on {tp} x {gpu}"

    result = plan(SearchSpace(gpus=("h100",), tps=(1, 2, 4, 8)), TARGETS, PRICES, fits, fake)
    statuses = {(s.gpu, s.tp): s.status for s in result.shapes}
    assert statuses == {("h100", 1): DOES_NOT_FIT, ("h100", 2): DOES_NOT_FIT, ("h100", 4): MET, ("h100", 8): MET}
    assert {f.tp for f in fake.calls} == {4, 8}
    assert result.shapes[0].note == "does not fit on 1 x h100"
    assert result.best.fleet == Fleet("h100", 4, 3)  # 12 GPUs beat 16


def test_the_cheapest_shape_wins_across_gpu_types():
    # h100: 6 x 4 = 24 GPUs at 2.5 = 60/h; h200: 2 x 8 = 16 GPUs at 3.5 = 56/h.
    fake = FakeFleets({("h100", 4): 6, ("h100", 8): 4, ("h200", 4): 5, ("h200", 8): 2})
    result = plan(SearchSpace(tps=(4, 8)), TARGETS, PRICES, fits_all, fake)
    assert result.best.fleet == Fleet("h200", 8, 2)
    assert result.best.cost_per_hour == pytest.approx(56.0)
    # A lower h100 price flips it: 24 x 2.0 = 48/h.
    cheaper = plan(SearchSpace(tps=(4, 8)), TARGETS, {"h100": 2.0, "h200": 3.5}, fits_all, FakeFleets(fake.needed))
    assert cheaper.best.fleet == Fleet("h100", 4, 6)


def test_equal_cost_goes_to_fewer_gpus():
    fake = FakeFleets({("h100", 4): 4, ("h200", 8): 1})  # 16 GPUs at 1.0 vs 8 GPUs at 2.0
    result = plan(SearchSpace(gpus=("h100", "h200"), tps=(4, 8)), TARGETS, {"h100": 1.0, "h200": 2.0},
                  lambda gpu, tp: None if (gpu, tp) in fake.needed else "no", fake)
    assert result.best.fleet == Fleet("h200", 8, 1)


def test_equal_cost_and_gpus_go_to_the_fleet_that_served_more_tokens():
    def served(fleet):
        if fleet.replicas * fleet.tp < 16:
            return make_probe(interactive=0.5, delayed=0.5)
        return make_probe(output_tokens_per_s=900.0 if fleet.tp == 4 else 1000.0)

    result = plan(SearchSpace(gpus=("h100",), tps=(4, 8)), TARGETS, PRICES, fits_all, served)
    assert [s.choice.fleet.num_gpus for s in result.shapes] == [16, 16]
    assert result.best.fleet == Fleet("h100", 8, 2)


def test_nothing_feasible_up_to_max_replicas_is_reported_as_such():
    fake = FakeFleets({("h100", 8): 100})
    result = plan(SearchSpace(gpus=("h100",), tps=(8,), max_replicas=12), TARGETS, PRICES, fits_all, fake)
    (shape,) = result.shapes
    assert result.best is None
    assert shape.status == NOT_MET and shape.choice is None
    assert "12 replicas" in shape.note
    assert [f.replicas for f in fake.calls] == [1, 2, 4, 8, 12]  # max_replicas probed last


def test_a_shape_whose_misses_do_not_shrink_with_replicas_stops_early():
    """Requests that miss on an idle fleet (nothing delayed): doubling gains nothing."""
    calls = []

    def saturating(fleet):
        calls.append(fleet.replicas)
        if fleet.replicas == 1:
            return make_probe(interactive=0.70, delayed=0.3)
        return make_probe(interactive=0.88, delayed=0.0)

    outcome = search_shape("h200", 8, SearchSpace(max_replicas=32), TARGETS, 3.5, saturating)
    assert outcome.status == SATURATED
    assert calls == [1, 2, 4]
    assert "88.0%" in outcome.note


def test_no_gain_while_requests_are_still_delayed_is_not_saturation():
    """A fleet far past capacity at 1 and 2 replicas: both miss almost
    everything, but the queue says it is load, so the search goes on."""
    def overloaded(fleet):
        if fleet.replicas >= 8:
            return make_probe()
        return make_probe(interactive=0.01, delayed=0.95)

    outcome = search_shape("h100", 8, SearchSpace(max_replicas=32), TARGETS, 2.5, overloaded)
    assert outcome.status == MET and outcome.choice.fleet.replicas == 8


def test_batch_misses_alone_keep_the_search_going():
    def batch_short(fleet):
        if fleet.replicas >= 3:
            return make_probe()
        return make_probe(batch=0.5, delayed=0.08)  # batch refused: batch_paused

    outcome = search_shape("h100", 8, SearchSpace(), TARGETS, 2.5, batch_short)
    assert outcome.choice.fleet.replicas == 3
    assert outcome.note.endswith("2 missed on batch")


def test_cost_per_million_tokens_is_the_fleet_price_over_its_throughput():
    cost = FleetCost.of(Fleet("h200", 8, 2), make_probe(output_tokens_per_s=1000.0), 3.5)
    assert cost.cost_per_hour == pytest.approx(56.0)
    assert cost.cost_per_million_output_tokens == pytest.approx(56.0 / 3.6)  # 3.6M tokens an hour
    assert cost.cost_per_million_tokens == pytest.approx(56.0 / 36.0)
    assert FleetCost.of(Fleet("h200", 8, 2), make_probe(output_tokens_per_s=0.0), 3.5).cost_per_million_tokens is None


def record(service_class="interactive", prompt=200, ttft=0.5, tokens=10, tpot=0.02, outcome="finished",
           reason="", queue_s=0.0):
    r = RequestRecord("r", "t", service_class, 0.0, prompt, tokens, outcome=outcome, reason=reason)
    if outcome == "finished":
        r.dispatched_s, r.first_token_s = queue_s, ttft
        r.last_token_s = r.finished_s = ttft + tpot * (tokens - 1)
        r.tokens = tokens
    return r


def test_attainment_counts_refusals_as_misses_and_allows_long_prompts_their_prefill():
    records = [
        record(),                                     # met
        record(ttft=2.5),                             # TTFT miss
        record(tpot=0.2),                             # TPOT miss
        record(outcome="refused", reason="over_capacity"),
        record(prompt=32_000, ttft=4.0),              # met only with the per-1K allowance
        record("batch", ttft=100.0),                  # batch met
        record("batch", outcome="refused", reason="batch_paused"),
    ]
    results = SimResults(records=records, duration_s=10.0)
    flat = measure(results, TARGETS, window_s=10.0)
    assert flat.interactive_attainment == pytest.approx(1 / 5)
    assert flat.batch_attainment == pytest.approx(1 / 2)
    assert flat.delayed_share == pytest.approx(2 / 7)  # the two refusals
    allowed = measure(results, SloTargets(ttft_per_1k_prompt_tokens_s=0.1), window_s=10.0)
    assert allowed.interactive_attainment == pytest.approx(2 / 5)
    assert allowed.interactive_goodput_rps == pytest.approx(0.2)
    finished = [r for r in records if r.outcome == "finished"]
    assert flat.output_tokens_per_s == pytest.approx(sum(r.tokens for r in finished) / 10.0)


def test_the_stall_bound_misses_a_stream_that_froze_once_though_its_mean_tpot_is_fine():
    smooth, frozen = record(tokens=200), record(tokens=200)
    smooth.max_gap_s, frozen.max_gap_s = 0.03, 2.0  # one 2 s gap among 199: TPOT still ~0.03 s
    frozen.last_token_s = frozen.finished_s = frozen.last_token_s + 2.0
    results = SimResults(records=[smooth, frozen], duration_s=10.0)
    assert measure(results, TARGETS, window_s=10.0).interactive_attainment == 1.0
    bounded = measure(results, SloTargets(max_itl_s=0.5), window_s=10.0)
    assert bounded.interactive_attainment == pytest.approx(0.5)
    with pytest.raises(ValueError):
        SloTargets(max_itl_s=-1.0)


def test_a_prompt_past_the_context_is_not_a_sign_of_load():
    results = SimResults(records=[record(outcome="refused", reason="context_length_exceeded"), record()],
                         duration_s=1.0)
    assert measure(results, TARGETS, 1.0).delayed_share == 0.0


def test_prices_default_to_the_presets_and_are_overridable():
    assert parse_prices([], ("h100", "h200")) == {"h100": 2.5, "h200": 3.5}
    assert parse_prices(["h100=2.1", "H200=3"], ("h100", "h200")) == {"h100": 2.1, "h200": 3.0}
    assert parse_prices(["h100=1,h200=2"], ("h100", "h200")) == {"h100": 1.0, "h200": 2.0}
    with pytest.raises(ValueError):
        parse_prices(["h100"], ("h100",))
    with pytest.raises(ValueError):
        parse_prices(["tpu=1"], ("h100",))


def test_the_real_scenario_knows_where_the_weights_do_not_fit():
    requests, window_s = workload_requests("seed-mix", 1.0, 10.0, seed=0)
    scenario = Scenario(MODELS["llama-3-70b"], tuple(requests), window_s)
    assert "does not fit" in scenario.fits("h100", 1)
    assert scenario.fits("h200", 8) is None
    assert scenario.fits("h100", 3) is not None  # 3 does not divide the heads


def test_a_real_small_plan_finds_a_sensible_fleet():
    requests, window_s = workload_requests("seed-mix", 4.0, 20.0, seed=1)
    scenario = Scenario(MODELS["llama-3-8b"], tuple(requests), window_s, TARGETS)
    result = plan(SearchSpace(gpus=("h100",), tps=(1, 2)), TARGETS, PRICES, scenario.fits,
                  lambda fleet: scenario.probe(fleet)[0])
    best = result.best
    assert best is not None and best.fleet.gpu == "h100"
    assert best.probe.interactive_attainment >= 0.99 and best.probe.batch_attainment >= 0.95
    # The load is 4 requests/s of chats and 32K documents: more than a lone
    # 8B replica serves within 2 s, far less than a rack.
    assert 2 <= best.fleet.num_gpus <= 8
    for shape in result.shapes:
        below = [a for a in shape.attempts if a.fleet.replicas == shape.choice.fleet.replicas - 1]
        assert all(not a.meets for a in below)  # the one below the choice was probed and missed
    assert best.cost_per_million_output_tokens > 0


def test_the_plan_command_prints_a_table_and_writes_the_plan(tmp_path, capsys):
    path = tmp_path / "plan.json"
    code = plan_cli.main(["--model", "llama-3-8b", "--gpus", "h100", "--tp", "1,2", "--rate", "4",
                          "--duration-s", "20", "--seed", "1", "--price", "h100=2", "--json", str(path), "--quiet"])
    assert code == 0
    out = capsys.readouterr().out
    assert "cheapest:" in out and "h100" in out
    document = json.loads(path.read_text())
    assert document["best"]["gpu"] == "h100"
    assert document["best"]["cost"]["price_per_gpu_hour"] == 2.0
    assert [(s["gpu"], s["tp"]) for s in document["shapes"]] == [("h100", 1), ("h100", 2)]
    assert all(s["attempts"] for s in document["shapes"])


def test_the_plan_command_says_when_nothing_meets(tmp_path, capsys):
    code = plan_cli.main(["--model", "llama-3-70b", "--gpus", "h100", "--tp", "1", "--rate", "1",
                          "--duration-s", "5", "--quiet"])
    assert code == 1
    assert "no fleet met the SLOs" in capsys.readouterr().out
