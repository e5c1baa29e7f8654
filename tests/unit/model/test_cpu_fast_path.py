"""The CPU fast path's choice is measured on this machine, per shape, and
cached per machine: a second load reads the cache instead of measuring, a
cache for other facts (another CPU, thread count, shapes) is not used, and
an unwritable cache directory only costs a new probe."""

from __future__ import annotations

import json

import pytest
import torch

from sluice.model import LlamaModel
from sluice.model import cpu_fast_path
from sluice.model.cpu_fast_path import LinearShape, choose_linears, machine_key, model_linears, probe_linears
from sluice.model.cpu_linear import onednn_linear_available

pytestmark = pytest.mark.skipif(not onednn_linear_available(torch.float32), reason="this torch has no oneDNN")


def test_the_probe_times_each_distinct_shape_every_way():
    shapes = [LinearShape(32, 64, False), LinearShape(32, 64, False), LinearShape(64, 16, True)]
    timings = probe_linears(shapes, rows=4, trials=1, min_time_s=0.001)
    assert set(timings) == {"32x64", "64x16+bias"}
    assert all(set(t) == {"torch", "onednn", "transposed"} and min(t.values()) > 0 for t in timings.values())


def test_auto_takes_the_fastest_of_all_three_per_shape(make_config, tmp_path, monkeypatch):
    model = LlamaModel(make_config()).eval()

    def fake_probe(shapes, **_):
        # transposed fastest for square shapes, oneDNN for wide ones, F.linear for narrow ones
        def timing(s):
            if s.out_features == s.in_features:
                return {"torch": 1.0, "onednn": 0.9, "transposed": 0.8}
            if s.out_features > s.in_features:
                return {"torch": 1.0, "onednn": 0.5, "transposed": 0.7}
            return {"torch": 0.5, "onednn": 0.9, "transposed": 0.6}
        return {s.key: timing(s) for s in shapes}

    monkeypatch.setattr(cpu_fast_path, "probe_linears", fake_probe)
    choice = choose_linears(model, "auto", cache_dir=tmp_path)
    for name, linear in model_linears(model).items():
        square, wide = linear.out_features == linear.in_features, linear.out_features > linear.in_features
        assert choice[name] == ("transposed" if square else "onednn" if wide else "torch"), name


def test_forced_modes_choose_one_implementation_everywhere(make_config):
    model = LlamaModel(make_config()).eval()
    for mode in ("torch", "onednn", "transposed"):
        assert set(choose_linears(model, mode).values()) == {mode}


def test_auto_takes_the_faster_per_shape_and_caches_the_probe(make_config, tmp_path, monkeypatch):
    model = LlamaModel(make_config()).eval()
    calls = []

    def fake_probe(shapes, **_):
        calls.append(shapes)
        # onednn faster for wide outputs only: the choice must follow the timings per shape
        return {s.key: {"torch": 1.0, "onednn": 0.5 if s.out_features > s.in_features else 2.0} for s in shapes}

    monkeypatch.setattr(cpu_fast_path, "probe_linears", fake_probe)
    choice = choose_linears(model, "auto", cache_dir=tmp_path)
    linears = model_linears(model)
    for name, linear in linears.items():
        assert choice[name] == ("onednn" if linear.out_features > linear.in_features else "torch"), name
    (cached,) = tmp_path.glob("cpu-linear-probe-*.json")
    assert set(json.loads(cached.read_text())["timings_s"]) == {f"{l.in_features}x{l.out_features}"
                                                               for l in linears.values()}
    assert choose_linears(model, "auto", cache_dir=tmp_path) == choice
    assert len(calls) == 1  # the second answer came from the cache

    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)  # another machine's facts: measured again
    choose_linears(model, "auto", cache_dir=tmp_path)
    assert len(calls) == 2


def test_the_machine_key_follows_shapes_threads_and_the_kernels_build(monkeypatch):
    shapes = [LinearShape(32, 64, False)]
    key = machine_key(shapes)
    assert machine_key(list(reversed(shapes * 2))) == key
    assert machine_key([LinearShape(32, 65, False)]) != key
    monkeypatch.setattr(cpu_fast_path, "native_build_digest", lambda: "another build")
    assert machine_key(shapes) != key
    monkeypatch.undo()
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    assert machine_key(shapes) != key


def test_an_unwritable_or_corrupt_cache_only_costs_a_probe(make_config, tmp_path, monkeypatch):
    model = LlamaModel(make_config()).eval()
    probes = []
    monkeypatch.setattr(cpu_fast_path, "probe_linears",
                        lambda shapes, **_: probes.append(1) or {s.key: {"torch": 1.0, "onednn": 2.0} for s in shapes})
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert set(choose_linears(model, "auto", cache_dir=blocked / "cache").values()) == {"torch"}
    key = machine_key([cpu_fast_path._shape(l) for l in model_linears(model).values()])
    (tmp_path / f"cpu-linear-probe-{key}.json").write_text("{not json")
    assert set(choose_linears(model, "auto", cache_dir=tmp_path).values()) == {"torch"}
    assert len(probes) == 2
