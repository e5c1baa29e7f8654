"""The simulator's plots write PNG files, from made-up results and from a
real run, and say what to install when matplotlib is missing."""

import json
import sys
from array import array

import pytest

from sluice.sim import plan_cli, plots
from sluice.sim.model_spec import MODELS
from sluice.sim.planner import Fleet, Scenario
from sluice.sim.trace import workload_requests
from sluice.sim.results import ReplicaSample, RequestRecord, SimResults

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_results(scale=1.0, replicas=2, count=50):
    records = []
    for i in range(count):
        service_class = "batch" if i % 5 == 0 else "interactive"
        record = RequestRecord(f"r{i}", "t", service_class, float(i), 100 + i, 20, outcome="finished")
        record.dispatched_s = record.arrival_s
        record.first_token_s = record.arrival_s + scale * (0.05 + 0.01 * i)
        record.last_token_s = record.finished_s = record.first_token_s + 19 * 0.02
        record.tokens = 20
        records.append(record)
    records.append(RequestRecord("refused", "t", "interactive", 3.0, 10, 5, outcome="refused", reason="queue_full"))
    gaps = {"interactive": array("d", (scale * (0.01 + 0.0001 * i) for i in range(5000))),
            "batch": array("d", (0.02,) * 100)}
    samples = [ReplicaSample(t * 0.25, f"replica-{r}", (t % 40) / 40 * (r + 1) / replicas, 1, 0)
               for t in range(200) for r in range(replicas)]
    return SimResults(records=records, duration_s=60.0, gaps_by_class=gaps, samples=samples, num_replicas=replicas)


def assert_png(path):
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 1000


@pytest.fixture
def matplotlib():
    return pytest.importorskip("matplotlib")  # third-party: the plots extra


def test_latency_cdfs_draw_one_line_per_policy(tmp_path, matplotlib):
    path = plots.latency_cdfs({"sluice": make_results(), "fcfs-no-chunk": make_results(scale=3.0)},
                              tmp_path / "cdf.png")
    assert path == tmp_path / "cdf.png"
    assert_png(path)


def test_a_class_with_no_requests_leaves_its_panel_empty(tmp_path, matplotlib):
    results = make_results()
    results.records = [r for r in results.records if r.service_class == "interactive"]
    results.gaps_by_class["batch"] = array("d")
    assert_png(plots.latency_cdfs({"sluice": results}, tmp_path / "cdf.png"))


def test_kv_occupancy_and_goodput_plots(tmp_path, matplotlib):
    assert_png(plots.kv_occupancy(make_results(replicas=3), tmp_path / "sub" / "kv.png"))
    points = {"sluice": [(2.0, 1.9), (1.0, 1.0), (4.0, 3.0)], "fcfs-no-chunk": [(1.0, 0.9), (2.0, 1.2)]}
    assert_png(plots.goodput_vs_rate(points, tmp_path / "goodput.png", title="t"))


def test_cdfs_of_large_samples_are_thinned_without_moving_the_ends():
    xs, ys = plots._cdf(range(100_000, 0, -1))
    assert len(xs) <= plots.MAX_CDF_POINTS
    assert xs[0] == 1 and xs[-1] == 100_000 and ys[-1] == 1.0
    assert xs == sorted(xs) and ys == sorted(ys)


def test_plots_of_a_real_run(tmp_path, matplotlib):
    requests, window_s = workload_requests("seed-mix", 4.0, 15.0, seed=2)
    scenario = Scenario(MODELS["llama-3-8b"], tuple(requests), window_s)
    fleet = Fleet("h100", 1, 2)
    by_policy = {name: scenario.simulate(fleet, name) for name in ("sluice", "fcfs-no-chunk")}
    assert_png(plots.latency_cdfs(by_policy, tmp_path / "cdf.png"))
    assert_png(plots.kv_occupancy(by_policy["sluice"], tmp_path / "kv.png"))


def test_a_missing_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import of a None entry raises ImportError
    with pytest.raises(ImportError, match=r"sluice-sim\[plots\]"):
        plots.kv_occupancy(make_results(), tmp_path / "kv.png")
    with pytest.raises(ImportError, match="matplotlib"):
        plots.require_matplotlib()
    assert not (tmp_path / "kv.png").exists()


def test_the_plan_command_writes_its_plots_and_sweep(tmp_path, matplotlib):
    directory, document_path = tmp_path / "plots", tmp_path / "plan.json"
    code = plan_cli.main(["--model", "llama-3-8b", "--gpus", "h100", "--tp", "2", "--rate", "3", "--duration-s", "15",
                          "--plots", str(directory), "--sweep-factors", "0.5,1", "--sweep-duration-s", "10",
                          "--json", str(document_path), "--quiet"])
    assert code == 0
    for name in ("latency_cdfs.png", "kv_occupancy.png", "goodput_vs_rate.png"):
        assert_png(directory / name)
    document = json.loads(document_path.read_text())
    assert set(document["policies"]) == {"sluice", "fcfs-no-chunk", "chunked-unfair", "no-kv-admission"}
    assert [rate for rate, _ in document["sweep"]["goodput_rps"]["sluice"]] == [1.5, 3.0]
    assert document["timings_s"]["sweep"] >= 0


def test_cdf_panels_draw_each_source_and_hide_the_spare_panel(tmp_path, matplotlib):
    """The fidelity bench's plot: a panel per slice and metric, a line per
    real replay and one for the simulator; an odd count leaves a blank cell
    hidden, and zero or negative samples (no gap) are left off the log axis."""
    panels = {
        "fit slice: TTFT": {"real, replay 1": [0.02, 0.03, 0.05], "simulated": [0.021, 0.029, 0.06]},
        "fit slice: inter-token time": {"real, replay 1": [0.005] * 50 + [0.0], "simulated": [0.006] * 40},
        "validation slice: TTFT": {"real, replay 1": [0.03, 0.04], "real, replay 2": [0.031], "simulated": []},
    }
    path = plots.cdf_panels(panels, tmp_path / "deep" / "fidelity.png", title="real vs sim", min_s=0.001)
    assert path == tmp_path / "deep" / "fidelity.png"
    assert_png(path)
    # The same panels drawn again give the same picture: nothing global carried over.
    assert plots.cdf_panels(panels, tmp_path / "again.png", title="real vs sim", min_s=0.001).read_bytes() == path.read_bytes()
