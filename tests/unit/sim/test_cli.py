"""`sluice sim`: the document it writes has the shape the issue names, and
its subcommands reach their own modules."""

import json

import pytest

from sluice.sim import cli


def test_sluice_sim_writes_the_results_document(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert cli.main(["--model", "llama-3-8b", "--gpu", "h100", "--tp", "1", "--workload", "seed-mix", "--rate", "1",
                     "--duration-s", "20", "--seed", "1", "--json", str(out), "--quiet"]) == 0
    document = json.loads(out.read_text())
    for block in (document["overall"], document["by_class"]["interactive"]):
        for key in ("ttft_s", "itl_s", "e2e_s"):
            assert set(block[key]) == {"p50", "p90", "p99"}
        assert block["goodput_rps"] >= 0 and block["output_tokens_per_s"] > 0
        assert isinstance(block["rejections"], dict)
    assert document["config"]["model"] == "llama-3-8b" and document["policies"]["sluice"]["overall"]
    assert "sluice" in capsys.readouterr().out


def test_a_trace_path_that_does_not_exist_is_a_clear_error(capsys):
    assert cli.main(["--workload", "/nonexistent/trace.csv", "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("subcommand", ["plan", "calibrate", "disagg"])
def test_subcommands_have_their_own_flags(subcommand, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([subcommand, "--help"])
    assert exit_.value.code == 0
    assert "sluice" in capsys.readouterr().out


def test_a_calibration_file_replaces_the_preset_and_a_cpu_fleet_gets_the_cpu_engine(tmp_path):
    from test_calibration import TINY, synthetic_timings

    from sluice.sim.calibrate import calibration_document, fit_efficiency, write_calibration

    timings = synthetic_timings()
    fit = fit_efficiency(timings, TINY, "cpu", "float32")
    path = write_calibration(tmp_path / "calibration.json",
                             calibration_document(timings, fit, model=TINY.name, dtype="float32", host={}))
    out = tmp_path / "sim.json"
    assert cli.main(["--model", "tiny-llama", "--calibration", str(path), "--tp", "1", "--dtype", "fp32",
                     "--kv-blocks", "8192", "--rate", "2", "--duration-s", "10", "--json", str(out), "--quiet"]) == 0
    config = json.loads(out.read_text())["config"]
    assert config["gpu"] == fit.hardware.name and config["kv_blocks_per_replica"] == 8192


def test_the_goodput_targets_take_the_planners_allowance_and_stall_bound(tmp_path):
    """A 70B replica on H200 at the seed mix: documents cannot start within a
    flat 2 s, so the per-1K allowance can only raise goodput, and a stall
    bound can only lower it; both are stated in the document's config."""
    base = ["--model", "llama-3-70b", "--gpu", "h200", "--tp", "8", "--rate", "2", "--duration-s", "60",
            "--seed", "3", "--quiet"]

    def goodput(*extra):
        out = tmp_path / f"sim-{len(extra)}-{'-'.join(extra)}.json"
        assert cli.main([*base, *extra, "--json", str(out)]) == 0
        document = json.loads(out.read_text())
        return document["by_class"]["interactive"]["goodput_rps"], document["config"]

    flat, _ = goodput()
    allowed, config = goodput("--ttft-slo-per-1k-tokens-s", "0.1")
    stalled, stall_config = goodput("--ttft-slo-per-1k-tokens-s", "0.1", "--max-itl-slo-s", "0.005")
    assert allowed > flat  # the documents' TTFT now counts against 2 s + 3.2 s
    assert stalled < allowed  # no request streams with every gap under 5 ms
    assert config["ttft_slo_per_1k_tokens_s"] == 0.1 and stall_config["max_itl_slo_s"] == 0.005


def test_a_negative_goodput_target_is_a_clear_error(capsys):
    assert cli.main(["--max-itl-slo-s", "-1", "--duration-s", "5", "--quiet"]) == 2
    assert "--max-itl-slo-s" in capsys.readouterr().err
