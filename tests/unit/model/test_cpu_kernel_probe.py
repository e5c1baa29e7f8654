"""Each native kernel's build is chosen by measuring this machine: every
build the CPU runs (within the instruction-set cap) is timed on the
model's shapes, the widest is kept unless a narrower one beat it by more
than NARROWER_BY, the choice is what the kernels then run, and the
timings are cached per machine."""

from __future__ import annotations

import pytest

from sluice.kernels import cpu_isa, int8_head, paged_attention_native
from sluice.model import cpu_kernel_probe
from sluice.kernels.int8_head import isa_label
from sluice.model.cpu_kernel_probe import (ATTENTION, INT8_HEAD, NARROWER_BY, KernelChoice, apply_kernel_choice,
                                           choose_and_apply_kernels, choose_kernels, probe_kernels)

pytestmark = pytest.mark.skipif(not (paged_attention_native.available() and int8_head.int8_head_available()),
                                reason="the native CPU kernels were not built")


@pytest.fixture(autouse=True)
def widest_again():
    yield
    cpu_isa.cap_isa("auto")  # the widest variant, no preferred int8 path


def attention_variants() -> list[str]:
    variants = cpu_isa.attention_variants()
    if len(variants) < 2:
        pytest.skip("one attention build on this CPU: nothing to choose")
    return variants


def vector_pairs() -> list[tuple[int, int]]:
    return [pair for pair in int8_head.allowed_isas() if pair[0] != int8_head.ISA_SCALAR]


def test_the_probe_times_every_build_this_cpu_runs(make_config):
    timings = probe_kernels(make_config())
    assert set(timings[ATTENTION]) == set(attention_variants())
    if len(vector_pairs()) > 1:
        assert set(timings[INT8_HEAD]) == {isa_label(pair) for pair in vector_pairs()}
    assert all(seconds > 0 for kernel in timings.values() for seconds in kernel.values())
    assert paged_attention_native.variant() == cpu_isa.attention_variants()[0]  # probing changed nothing


def test_under_a_cap_only_the_builds_it_allows_are_timed(make_config):
    cpu_isa.cap_isa("avx2")
    timings = probe_kernels(make_config())
    assert set(timings.get(ATTENTION, {})) <= {"avx2", "baseline"}
    assert INT8_HEAD not in timings  # one vector path (AVX2) at most: nothing to choose


def test_the_widest_is_kept_unless_a_narrower_build_is_clearly_faster():
    variants = attention_variants()
    widest, narrower = variants[0], variants[1]
    barely = {ATTENTION: {widest: 1.0, narrower: 1.0 - NARROWER_BY / 2}}
    assert choose_kernels(barely).attention == widest
    clearly = {ATTENTION: {widest: 1.0, narrower: 1.0 - 2 * NARROWER_BY}}
    assert choose_kernels(clearly).attention == narrower
    assert choose_kernels({}).attention == widest  # nothing measured: the widest


def test_the_int8_head_takes_the_measured_path():
    pairs = vector_pairs()
    if len(pairs) < 2:
        pytest.skip("one vector path for the int8 head on this CPU")
    widest, narrower = max(pairs), min(pairs)
    timings = {INT8_HEAD: {isa_label(widest): 1.0, isa_label(narrower): 0.5}}
    choice = choose_kernels(timings)
    assert choice.int8_head == narrower
    apply_kernel_choice(choice)
    assert int8_head.best_isa() == narrower
    cpu_isa.cap_isa("auto")
    assert int8_head.best_isa() == max(int8_head.allowed_isas())


def test_the_choice_is_what_the_kernels_run():
    narrower = attention_variants()[1]
    apply_kernel_choice(KernelChoice(attention=narrower, int8_head=None))
    assert paged_attention_native.variant() == narrower


def test_the_timings_are_cached_per_machine(make_config, tmp_path, monkeypatch):
    config = make_config()
    variants = attention_variants()
    slow_widest = {ATTENTION: {variants[0]: 1.0, variants[1]: 0.5}}
    monkeypatch.setattr(cpu_kernel_probe, "probe_kernels", lambda _: slow_widest)
    assert choose_and_apply_kernels(config, tmp_path).attention == variants[1]
    assert len(list(tmp_path.glob("cpu-kernel-probe-*.json"))) == 1

    def must_not_measure(_):
        raise AssertionError("the cached timings should have been read")

    monkeypatch.setattr(cpu_kernel_probe, "probe_kernels", must_not_measure)
    assert choose_and_apply_kernels(config, tmp_path).attention == variants[1]
    cpu_isa.cap_isa("avx2")  # another cap is another machine key: measured again
    with pytest.raises(AssertionError, match="cached"):
        choose_and_apply_kernels(config, tmp_path)
