"""Disaggregated prefill/decode pools: every request accounted for, the
first token from the prefill replica, the second after the KV transfer,
transfers queued FIFO on a busy link, deterministic for a seed."""

import pytest

from sluice.placement.config import PlacementConfig
from sluice.sim.cost_model import CostModel, StepShape
from sluice.sim.disaggregated import DisaggregatedSimulation, DisaggregatedSpec, KvLink
from sluice.sim.hardware import HARDWARE
from sluice.sim.model_spec import MODELS
from sluice.sim.policies import build_policy, gpu_engine_config
from sluice.sim.results import Slo, summarize
from sluice.sim.simulator import FleetSpec
from sluice.sim.workload import SimRequest, seed_mix

MODEL = MODELS["llama-3-8b"]
COST = CostModel(HARDWARE["h100"], MODEL, tp=1)
SLOS = {"interactive": Slo(2.0, 0.1), "batch": Slo(600.0, 1e9)}
KV_BYTES = MODEL.kv_bytes_per_token("bf16")


def simulate(requests, prefill=1, decode=1, bandwidth_bytes_per_s=450e9, efficiency=0.7):
    policy = build_policy("sluice", gpu_engine_config(MODEL), PlacementConfig())

    def fleet(n):
        return FleetSpec(n, COST.kv_capacity_blocks(16), policy, max_context_tokens=MODEL.max_context_tokens)

    spec = DisaggregatedSpec(fleet(prefill), fleet(decode), KvLink(KV_BYTES, bandwidth_bytes_per_s, efficiency))
    simulation = DisaggregatedSimulation(spec, COST.step_time_s, requests)
    return simulation.run(), simulation.transfers


def chat(request_id, arrival_s, prompt=200, output=5):
    return SimRequest(request_id, arrival_s, "t", "interactive", prompt, output)


def test_every_request_is_finished_with_its_full_output_or_refused_with_a_reason():
    requests = seed_mix(6.0).generate(60, seed=1)
    results, _ = simulate(requests, prefill=1, decode=1)
    by_id = {r.request_id: r for r in results.records}
    assert set(by_id) == {r.request_id for r in requests}
    finished = 0
    for request in requests:
        record = by_id[request.request_id]
        assert record.outcome in ("finished", "refused")
        if record.outcome == "finished":
            finished += 1
            assert record.tokens == request.output_tokens
            assert record.arrival_s <= record.dispatched_s <= record.first_token_s <= record.finished_s
        else:
            assert record.reason
    assert finished > len(requests) // 2
    assert results.num_replicas == 2


def test_a_lone_requests_first_token_is_one_prefill_step_and_its_second_follows_the_transfer():
    prompt = 200
    results, transfers = simulate([chat("a", 1.0, prompt=prompt, output=3)], bandwidth_bytes_per_s=1e9)
    (record,) = results.records
    prefill_s = COST.step_time_s(StepShape(((prompt, 0),)))
    assert record.ttft_s == pytest.approx(prefill_s)
    transfer_s = prompt * KV_BYTES / (1e9 * 0.7)
    transfer = transfers["a"]
    assert transfer.transfer_s == pytest.approx(transfer_s)
    assert transfer.queue_s == 0.0
    # The decode replica computes the last prompt token only: one position-199 token.
    decode_step_s = COST.step_time_s(StepShape(((1, prompt - 1),)))
    gaps = list(results.gaps_by_class["interactive"])
    assert gaps[0] == pytest.approx(transfer_s + decode_step_s)
    assert gaps[0] > transfer_s
    assert record.tokens == 3 and record.outcome == "finished"
    assert record.replica == "prefill-0>decode-0"


def test_transfers_from_one_replica_queue_fifo_on_its_link():
    # Three prompts prefilled within milliseconds; a slow link (0.37 s a
    # transfer) carries one at a time, in the order they became ready.
    results, transfers = simulate([chat("a", 1.0), chat("b", 1.0), chat("c", 1.0)], bandwidth_bytes_per_s=1e8)
    a, b, c = transfers["a"], transfers["b"], transfers["c"]
    assert a.ready_s <= b.ready_s <= c.ready_s < a.done_s
    assert a.queue_s == 0.0
    assert b.started_s == pytest.approx(a.done_s)
    assert c.started_s == pytest.approx(b.done_s)
    assert b.queue_s > 0 and c.queue_s > b.queue_s
    assert all(r.outcome == "finished" for r in results.records)


def test_a_one_token_request_never_leaves_the_prefill_pool():
    results, transfers = simulate([chat("a", 1.0, output=1)])
    assert not transfers
    assert results.records[0].outcome == "finished" and results.records[0].tokens == 1


def test_the_same_seed_gives_the_same_results():
    workload = seed_mix(4.0)

    def document(seed):
        return {k: v for k, v in summarize(simulate(workload.generate(40, seed=seed))[0], SLOS).items()
                if k != "wall_s"}

    assert document(3) == document(3)
    assert document(3) != document(4)


def test_the_cli_runs_both_deployments_on_the_same_requests(tmp_path, capsys):
    import json

    from sluice.sim.disagg_cli import main

    out = tmp_path / "d.json"
    assert main(["--model", "llama-3-8b", "--gpu", "h100", "--tp", "1", "--prefill-replicas", "1",
                 "--decode-replicas", "1", "--rate", "2", "--duration-s", "20", "--json", str(out)]) == 0
    document = json.loads(out.read_text())
    assert document["colocated"]["overall"]["requests"] == document["disaggregated"]["overall"]["requests"]
    assert document["colocated"]["cost"]["fleet_per_hour"] == document["disaggregated"]["cost"]["fleet_per_hour"]
    assert document["verdict"]["winner"] in ("colocated", "disaggregated", "tie")
    assert "wins on interactive goodput" in capsys.readouterr().out or document["verdict"]["winner"] == "tie"
