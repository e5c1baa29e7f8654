"""The simulation loop around the production policies: deterministic for a
seed, every request accounted for, the baselines derived as documented,
and the policy modules unaware of it."""

import subprocess
import sys
from dataclasses import replace

import pytest

from sluice.placement.config import PlacementConfig
from sluice.sim.cost_model import CostModel
from sluice.sim.hardware import HARDWARE
from sluice.sim.model_spec import MODELS
from sluice.sim.policies import POLICIES, build_policy, cpu_engine_config, gpu_engine_config, prefill_depth_scale_tokens
from sluice.sim.results import Slo, summarize
from sluice.sim.simulator import FleetSpec, Simulation
from sluice.sim.workload import SimRequest, seed_mix

MODEL = MODELS["llama-3-8b"]
COST = CostModel(HARDWARE["h100"], MODEL, tp=1)
SLOS = {"interactive": Slo(2.0, 0.1), "batch": Slo(600.0, 1e9)}


def simulate(requests, policy="sluice", replicas=2, kv_blocks=None):
    engine = gpu_engine_config(MODEL)
    fleet = FleetSpec(replicas, kv_blocks or COST.kv_capacity_blocks(16), build_policy(policy, engine, PlacementConfig()),
                      max_context_tokens=MODEL.max_context_tokens)
    return Simulation(fleet, COST.step_time_s, requests).run()


def strip_wall(document):
    return {k: v for k, v in document.items() if k != "wall_s"}


def test_the_same_seed_gives_the_same_results_and_another_seed_others():
    workload = seed_mix(4.0)
    first = summarize(simulate(workload.generate(60, seed=3)), SLOS)
    again = summarize(simulate(workload.generate(60, seed=3)), SLOS)
    other = summarize(simulate(workload.generate(60, seed=4)), SLOS)
    assert strip_wall(first) == strip_wall(again)
    assert strip_wall(first) != strip_wall(other)


def test_every_request_is_finished_with_its_full_output_or_refused_with_a_reason():
    requests = seed_mix(6.0).generate(60, seed=1)
    results = simulate(requests, replicas=1)
    by_id = {r.request_id: r for r in results.records}
    assert set(by_id) == {r.request_id for r in requests}
    for request in requests:
        record = by_id[request.request_id]
        assert record.outcome in ("finished", "refused")
        if record.outcome == "finished":
            assert record.tokens == request.output_tokens
            assert record.arrival_s <= record.dispatched_s <= record.first_token_s <= record.finished_s
        else:
            assert record.reason  # from the outcome vocabulary
    assert results.decode_tokens + results.prefill_tokens >= sum(
        r.prompt_tokens for r in by_id.values() if r.outcome == "finished")


def test_every_sampled_token_is_reported_in_order():
    requests = seed_mix(6.0).generate(20, seed=2)
    engine = gpu_engine_config(MODEL)
    fleet = FleetSpec(1, COST.kv_capacity_blocks(16), build_policy("sluice", engine, PlacementConfig()),
                      max_context_tokens=MODEL.max_context_tokens)
    tokens: dict[str, list[float]] = {}
    results = Simulation(fleet, COST.step_time_s, requests,
                         on_token=lambda request_id, now_s: tokens.setdefault(request_id, []).append(now_s)).run()
    finished = [r for r in results.records if r.outcome == "finished"]
    assert finished
    for record in finished:
        times = tokens[record.request_id]
        assert len(times) == record.tokens
        assert (times[0], times[-1]) == (record.first_token_s, record.finished_s)
        assert times == sorted(times)
    assert set(tokens) == {r.request_id for r in finished}


def test_a_lone_request_takes_what_the_cost_model_says():
    """One 1,000-token prompt alone: prefill in 512-token depth-scaled chunks,
    then one decode step per output token, each timed by the cost model."""
    request = SimRequest("r0000000", 0.0, "t", "interactive", 1000, 10)
    (record,) = simulate([request], replicas=1).records
    decode_s = COST.step_time_s(COST_SHAPE_ONE_DECODE)
    assert record.tpot_s == pytest.approx(decode_s, rel=0.02)
    assert record.ttft_s >= COST.ideal_prefill_s(1000)  # never faster than physics


COST_SHAPE_ONE_DECODE = __import__("sluice.sim.cost_model", fromlist=["StepShape"]).StepShape(((1, 1005),))


def test_a_pool_too_small_for_the_load_refuses_early_with_reasons():
    requests = seed_mix(30.0).generate(30, seed=2)
    results = simulate(requests, replicas=1, kv_blocks=2000)
    reasons = {r.reason for r in results.records if r.outcome == "refused"}
    assert reasons & {"over_capacity", "batch_paused", "queue_full", "queue_timeout"}
    assert results.stage_changes  # the overload controller ran on the virtual clock


def test_the_baselines_are_the_documented_variants():
    engine = gpu_engine_config(MODEL)
    placement = PlacementConfig()
    fcfs = build_policy("fcfs-no-chunk", engine, placement)
    assert fcfs.engine.long_prefill_chunk_tokens == 0 and fcfs.engine.max_num_batched_tokens >= MODEL.max_context_tokens
    assert fcfs.single_tenant and fcfs.single_class and not fcfs.placement.overload.policy.enabled
    unfair = build_policy("chunked-unfair", engine, placement)
    assert unfair.engine == engine and unfair.single_tenant
    assert build_policy("no-kv-admission", engine, placement).reported_kv_factor > 1
    assert build_policy("sluice", engine, placement).engine == engine
    with pytest.raises(ValueError, match="unknown policy"):
        build_policy("magic", engine, placement)
    assert set(POLICIES) == {"sluice", "fcfs-no-chunk", "chunked-unfair", "no-kv-admission"}


def test_the_depth_scale_matches_the_engines_documented_figures():
    assert 1300 < prefill_depth_scale_tokens(MODELS["tiny-llama"]) < 1500  # "~1,400 tokens for the tiny model"
    assert 45_000 < prefill_depth_scale_tokens(MODELS["llama-3-70b"]) < 55_000  # "~50k for a 70B"


def test_chunked_prefill_protects_chats_from_documents():
    """The seed's point: chats beside 32K documents. Without chunking a chat
    waits out whole document prefills."""
    requests = seed_mix(1.5).generate(120, seed=5)
    chats = {r.request_id for r in requests if r.prompt_tokens < 2000 and r.service_class == "interactive"}

    def chat_ttft_p90(policy):
        records = [r for r in simulate(requests, policy, replicas=1).records
                   if r.request_id in chats and r.outcome == "finished"]
        ttfts = sorted(r.ttft_s for r in records)
        return ttfts[int(0.9 * (len(ttfts) - 1))]

    assert chat_ttft_p90("sluice") < chat_ttft_p90("fcfs-no-chunk")


def test_the_policy_modules_import_nothing_from_the_simulator():
    code = (
        "import sys\n"
        "import sluice.engine.scheduler, sluice.engine.block_manager, sluice.placement.cluster, "
        "sluice.admission.overload\n"
        "assert not [m for m in sys.modules if m.startswith('sluice.sim')], sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_cpu_engines_yield_to_chats_is_simulated():
    """The CPU engine config gives a batch step up for an arriving chat (at
    the next check between layers): chats start sooner beside a batch flood,
    every request still finishes in full, and the run is deterministic."""
    tiny = MODELS["tiny-llama"]
    cost = CostModel(HARDWARE["cpu"], tiny, tp=1, dtype="fp32")
    requests = [SimRequest(f"b{i:03d}", 0.01 * i, "bulk", "batch", 1500, 64) for i in range(16)]
    requests += [SimRequest(f"c{i:03d}", 0.5 + 0.25 * i + 0.003 * (i % 7), "chat", "interactive", 32, 8)
                 for i in range(24)]

    def run(yield_to_chats: bool):
        engine = replace(cpu_engine_config(tiny), yield_to_chats=yield_to_chats)
        fleet = FleetSpec(1, 4096, build_policy("sluice", engine, PlacementConfig()),
                          max_context_tokens=tiny.max_context_tokens, step_segments=tiny.num_layers + 1)
        simulation = Simulation(fleet, cost.step_time_s, sorted(requests, key=lambda r: r.arrival_s))
        return simulation.run(), simulation.replicas[0]

    (yielding, replica), (waiting, other) = run(True), run(False)
    assert replica.yielded_steps > 0 and other.yielded_steps == 0
    for results in (yielding, waiting):
        assert all(r.outcome == "finished" and r.tokens == r.output_tokens for r in results.records)
    chat_ttft = {name: sorted(r.ttft_s for r in results.records if r.service_class == "interactive")
                 for name, results in (("yielding", yielding), ("waiting", waiting))}
    assert chat_ttft["yielding"][12] < chat_ttft["waiting"][12]  # the median chat
    again, _ = run(True)
    assert [(r.request_id, r.first_token_s, r.finished_s) for r in again.records] == \
        [(r.request_id, r.first_token_s, r.finished_s) for r in yielding.records]
