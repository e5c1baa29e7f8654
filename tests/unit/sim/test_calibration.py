"""Calibration: the fit recovers the terms that made synthetic timings, the
file round-trips, and a real (tiny) measurement yields a finite fit. No
timing is asserted: only that the numbers exist and hang together."""

import math
import subprocess
import sys
from dataclasses import replace

import pytest

from sluice.sim.calibrate import (
    FORMAT, GridPoint, StepTiming, calibration_document, default_grid, fit_efficiency, load_calibration,
    measure_step_times, read_calibration, write_calibration,
)
from sluice.sim.cost_model import CostModel, Efficiency, StepShape
from sluice.sim.hardware import HARDWARE
from sluice.sim.model_spec import MODELS

CPU = HARDWARE["cpu"]
TINY = MODELS["tiny-llama"]


def synthetic_timings(hardware=CPU, efficiency=Efficiency(compute=0.3, bandwidth=0.6, step_overhead_s=0.002),
                      grid=None):
    """What a machine that is exactly the cost model would measure."""
    cost = CostModel(hardware, TINY, dtype="float32", efficiency=efficiency)
    points = default_grid(quick=True) if grid is None else grid
    return [StepTiming(p.kind, p.shape, (cost.step_time_s(p.shape),)) for p in points]


def test_the_fit_recovers_known_efficiencies_from_synthetic_timings():
    """Attention at a third of the linears' rate and a cost per sequence,
    as a CPU measures them: all five terms come back."""
    known = Efficiency(compute=0.3, bandwidth=0.6, step_overhead_s=0.002, attention_compute=0.1,
                       sequence_overhead_s=0.0001)
    fit = fit_efficiency(synthetic_timings(efficiency=known), TINY, "cpu", "float32")
    assert fit.efficiency.compute == pytest.approx(known.compute, rel=0.01)
    assert fit.efficiency.bandwidth == pytest.approx(known.bandwidth, rel=0.01)
    assert fit.efficiency.step_overhead_s == pytest.approx(known.step_overhead_s, rel=0.01)
    assert fit.efficiency.attention_compute == pytest.approx(known.attention_compute, rel=0.01)
    assert fit.efficiency.sequence_overhead_s == pytest.approx(known.sequence_overhead_s, rel=0.02)
    assert fit.efficiency.attention_overlaps_kv


def test_the_fit_tells_a_kernel_that_adds_its_kv_reads_from_one_that_hides_them():
    known = Efficiency(compute=0.3, bandwidth=0.6, step_overhead_s=0.002, attention_compute=0.1,
                       sequence_overhead_s=0.0001, attention_overlaps_kv=False)
    fit = fit_efficiency(synthetic_timings(efficiency=known), TINY, "cpu", "float32")
    assert not fit.efficiency.attention_overlaps_kv
    assert fit.efficiency.attention_compute == pytest.approx(known.attention_compute, rel=0.01)
    assert fit.max_relative_error < 0.01
    # Within the preset's peaks, so they are kept.
    assert (fit.hardware.peak_flops_per_s, fit.hardware.hbm_bandwidth_bytes_per_s) == (
        CPU.peak_flops_per_s, CPU.hbm_bandwidth_bytes_per_s)
    assert fit.hardware.name == "cpu-calibrated"
    assert fit.max_relative_error < 0.01


def test_the_fit_recovers_a_cpus_prefill_and_linear_terms():
    """What the CPU replica measured: the linears' weight pass added to
    their arithmetic, a cost per prefill chunk, its context read ~3 times,
    and a head faster than the layers. Each comes back, on the full grid
    (the quick grid has too few mixed steps to tell the chunk's cost from
    the sequences')."""
    known = Efficiency(compute=0.3, bandwidth=0.6, step_overhead_s=0.0005, attention_compute=0.15,
                       sequence_overhead_s=0.00003, attention_overlaps_kv=False, linear_overlaps_weights=False,
                       prefill_chunk_overhead_s=0.0012, prefill_context_passes=2.5, lm_head_compute=0.9)
    fit = fit_efficiency(synthetic_timings(efficiency=known, grid=default_grid()), TINY, "cpu", "float32")
    assert not fit.efficiency.linear_overlaps_weights and not fit.efficiency.attention_overlaps_kv
    assert fit.max_relative_error < 0.01
    assert fit.efficiency.prefill_chunk_overhead_s == pytest.approx(0.0012, rel=0.05)
    assert fit.efficiency.prefill_context_passes == pytest.approx(2.5, rel=0.05)
    # Rates, not efficiencies: a head fitted over the preset's peak raises the peak that expresses them.
    assert fit.flops_per_s == pytest.approx(0.3 * CPU.peak_flops_per_s, rel=0.02)
    assert fit.attention_flops_per_s == pytest.approx(0.15 * CPU.peak_flops_per_s, rel=0.02)
    # The head and the per-sequence cost both grow with the sequences: their sum is what is measured.
    cost = CostModel(fit.hardware, TINY, dtype="float32", efficiency=fit.efficiency)
    truth = CostModel(CPU, TINY, dtype="float32", efficiency=known)
    per_sequence = [model.step_breakdown(StepShape.of([(1, 0)] * 64)) for model in (cost, truth)]
    assert per_sequence[0].lm_head_s + per_sequence[0].overhead_s == pytest.approx(
        per_sequence[1].lm_head_s + per_sequence[1].overhead_s, rel=0.02)


def test_a_rate_over_the_presets_peak_becomes_the_peak_at_full_efficiency():
    fast_memory = replace(CPU, hbm_bandwidth_bytes_per_s=5 * CPU.hbm_bandwidth_bytes_per_s)
    known = Efficiency(compute=0.2, bandwidth=1.0, step_overhead_s=0.001)
    timings = synthetic_timings(fast_memory, known)
    fit = fit_efficiency(timings, TINY, CPU, "float32")
    assert fit.efficiency.bandwidth == 1.0
    # Within 10%: on the quick grid the weights' pass at batch 1 trades a
    # little against the step and per-sequence costs (the times still agree
    # within 1%, below).
    assert fit.hardware.hbm_bandwidth_bytes_per_s == pytest.approx(fast_memory.hbm_bandwidth_bytes_per_s, rel=0.1)
    assert fit.efficiency.compute == pytest.approx(0.2, rel=0.01)
    # Expressed either way, the calibrated pair gives the measured step times back.
    calibrated = CostModel(fit.hardware, TINY, dtype="float32", efficiency=fit.efficiency)
    for timing in timings:
        assert calibrated.step_time_s(timing.shape) == pytest.approx(timing.seconds, rel=0.01)


def test_the_fit_needs_a_timing_per_term():
    with pytest.raises(ValueError, match="at least 9"):
        fit_efficiency(synthetic_timings()[:8], TINY)


def test_a_grid_point_needs_work_and_the_default_grid_spans_the_brief():
    with pytest.raises(ValueError):
        GridPoint()
    grid = default_grid()
    decodes = [p.decodes for p in grid if p.kind == "decode"]
    chunks = [p.prefill_tokens for p in grid if p.kind == "prefill"]
    assert (min(decodes), max(decodes), min(chunks), max(chunks)) == (1, 64, 16, 512)
    assert any(p.kind == "mixed" for p in grid)
    assert GridPoint(2, 100, 64, 32).shape.chunks == ((1, 100), (1, 100), (64, 32))


def test_the_calibration_file_round_trips(tmp_path):
    timings = synthetic_timings()
    fit = fit_efficiency(timings, TINY, "cpu", "float32")
    document = calibration_document(timings, fit, model=TINY.name, dtype="float32", host={"cpu_model": "test"})
    path = write_calibration(tmp_path / "nested" / "calibration.json", document)
    hardware, efficiency = load_calibration(path)
    assert (hardware, efficiency) == (fit.hardware, fit.efficiency)
    calibration = read_calibration(path)
    assert (calibration.model, calibration.dtype, calibration.host["cpu_model"]) == (TINY.name, "float32", "test")
    assert len(calibration.shapes) == len(timings)
    assert calibration.fit["median_relative_error"] == pytest.approx(fit.median_relative_error)
    assert 0 <= calibration.age_s < 60


def test_a_file_that_is_not_a_calibration_is_refused_with_its_name(tmp_path):
    path = tmp_path / "other.json"
    path.write_text('{"format": "something-else"}')
    with pytest.raises(ValueError, match="other.json"):
        load_calibration(path)
    with pytest.raises(ValueError, match="missing.json"):
        load_calibration(tmp_path / "missing.json")
    path.write_text('{"format": "%s", "hardware": {}}' % FORMAT)
    with pytest.raises(ValueError, match="other.json"):
        read_calibration(path)


def test_the_calibration_module_imports_without_torch():
    code = "import sys, sluice.sim.calibrate, sluice.sim.calibrate_cli; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_small_real_measurement_of_the_tiny_model_gives_a_finite_fit(tiny_model_dir):
    grid = (GridPoint(decodes=1, decode_context_tokens=16), GridPoint(decodes=8, decode_context_tokens=128),
            GridPoint(prefill_tokens=32, prefill_depth_tokens=0), GridPoint(prefill_tokens=64, prefill_depth_tokens=64),
            GridPoint(4, 64, 32, 32), GridPoint(decodes=2, decode_context_tokens=64),
            GridPoint(prefill_tokens=16, prefill_depth_tokens=128), GridPoint(2, 16, 16, 0),
            GridPoint(decodes=4, decode_context_tokens=256))
    timings = measure_step_times(tiny_model_dir, grid, repetitions=2, passes=1, scatter_over_blocks=512)
    assert [t.kind for t in timings] == [p.kind for p in grid] == ["decode", "decode", "prefill", "prefill", "mixed",
                                                                  "decode", "prefill", "mixed", "decode"]
    for point, timing in zip(grid, timings):
        # The planned step is the point's, the decodes a warm-up token or two further on.
        assert [n for n, _ in timing.shape.chunks] == [n for n, _ in point.shape.chunks]
        assert [c for n, c in timing.shape.chunks if n > 1] == [c for n, c in point.shape.chunks if n > 1]
        assert len(timing.samples_s) == len(timing.cpu_samples_s) == 2
        assert all(s > 0 and math.isfinite(s) for s in timing.samples_s)
    fit = fit_efficiency(timings, TINY, "cpu", "float32")
    assert all(math.isfinite(v) and v > 0 for v in (fit.flops_per_s, fit.bytes_per_s))
    assert 0 < fit.efficiency.compute <= 1 and 0 < fit.efficiency.bandwidth <= 1
    assert math.isfinite(fit.max_relative_error)


def test_a_model_shape_without_a_checkpoint_is_timed_with_random_weights():
    """What times an 8B model on a GPU with no checkpoint on disk, here on the
    tiny shape: the spec's config round-trips, the weights are finite, and the
    steps planned are the grid's."""
    from sluice.sim.calibrate import random_llama, hf_config
    from sluice.sim.model_spec import ModelSpec

    for spec in MODELS.values():
        assert ModelSpec.from_hf_config(hf_config(spec), spec.name) == spec
    import torch

    from sluice.model.attention import default_backend

    model = random_llama(TINY, torch.float32, torch.device("cpu"), default_backend(torch.device("cpu")))
    weights = [p for p in model.parameters()]
    assert sum(p.numel() for p in weights) == TINY.num_parameters()
    assert all(torch.isfinite(p).all() for p in weights)
    grid = (GridPoint(decodes=4, decode_context_tokens=32), GridPoint(prefill_tokens=32, prefill_depth_tokens=16))
    timings = measure_step_times(TINY, grid, repetitions=1, passes=1)
    assert [[n for n, _ in t.shape.chunks] for t in timings] == [[1, 1, 1, 1], [32]]
    assert all(s > 0 for t in timings for s in t.samples_s)


def test_a_gpu_grid_fits_an_8b_model_beside_its_kv_on_one_h200():
    from sluice.sim.calibrate import blocks_needed, gpu_grid

    eight_b, h200 = MODELS["llama-3-8b"], HARDWARE["h200"]
    kv_bytes = blocks_needed(gpu_grid(), steps_per_point=4) * 16 * eight_b.kv_bytes_per_token("bf16")
    assert kv_bytes + eight_b.weight_bytes("bf16") < 0.8 * h200.memory_bytes
    assert {p.kind for p in gpu_grid(quick=True)} == {"decode", "prefill", "mixed"}


def test_calibrating_random_weights_records_them_and_a_gpu_run_needs_its_preset(capsys):
    from sluice.sim.calibrate_cli import main

    grid = (GridPoint(decodes=2, decode_context_tokens=16), GridPoint(prefill_tokens=16, prefill_depth_tokens=0),
            GridPoint(decodes=4, decode_context_tokens=32), GridPoint(prefill_tokens=32, prefill_depth_tokens=16),
            GridPoint(decodes=1, decode_context_tokens=48), GridPoint(2, 16, 16, 0),
            GridPoint(decodes=3, decode_context_tokens=16), GridPoint(prefill_tokens=16, prefill_depth_tokens=32),
            GridPoint(decodes=2, decode_context_tokens=32))
    from sluice.sim.calibrate import calibrate

    _, _, document = calibrate(None, TINY, grid=grid, repetitions=1, passes=1)
    assert document["host"]["weights"] == "random" and document["host"]["device"] == "cpu"
    assert document["model"] == TINY.name and len(document["shapes"]) == len(grid)
    # On a GPU the CPU preset's peaks would make the fit meaningless (and the
    # file would be taken for this machine's CPU calibration): refused at once.
    assert main(["--device", "cuda", "--random-weights", "llama-3-8b"]) == 2
    assert "--preset h100 or h200" in capsys.readouterr().err


def test_scattered_calibration_points_take_blocks_from_all_over_the_pool():
    """With a pool to scatter over, a point's sequences hold blocks from
    anywhere in it (as a long-serving replica's do), each point its own
    seeded layout; without, consecutive blocks from 0, as a fresh replica's."""
    import random

    from sluice.model.sampler import SamplingParams
    from sluice.sim.calibrate import PointRun, TimingEngine

    def tables(scatter_seed):
        engine = TimingEngine(None, SamplingParams(temperature=0.0, ignore_eos=True), 4096, 16, 4096, 32000,
                              scatter_seed)
        run = PointRun(engine, GridPoint(decodes=4, decode_context_tokens=256), 3, random.Random(0))
        return sorted(b for table in run.core.blocks.owned_block_ids().values() for b in table)

    fresh, scattered = tables(None), tables("0:scatter")
    assert fresh == list(range(len(fresh)))
    assert len(scattered) == len(fresh) >= 4 * 16  # 256 tokens each, 16 a block
    assert max(scattered) > 2000 and scattered != list(range(len(scattered)))
    assert tables("0:scatter") == scattered and tables("1:scatter") != scattered
