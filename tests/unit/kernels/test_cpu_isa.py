"""cap_isa: the native kernels run no wider than the cap, and the probe's
cache key changes with it (a capped replica must not reuse an uncapped
machine's timings)."""

import pytest
import torch

from sluice.kernels import cpu_isa, int8_head, paged_attention_native
from sluice.model.cpu_fast_path import LinearShape, machine_key
from sluice.model.greedy_head import available_screens

pytestmark = pytest.mark.skipif(not (paged_attention_native.available() and int8_head.int8_head_available()),
                                reason="the native CPU kernels were not built")


@pytest.fixture(autouse=True)
def uncapped():
    yield
    cpu_isa.cap_isa("auto")


def widest_attention_variant() -> str:
    return paged_attention_native.supported_variants()[0]


def test_auto_runs_the_widest_this_cpu_has():
    cpu_isa.cap_isa("auto")
    assert paged_attention_native.variant() == widest_attention_variant()
    assert int8_head.best_isa() == max(int8_head.supported_isas())


def test_an_avx2_cap_runs_avx2_code_and_no_vnni_or_bf16():
    cpu_isa.cap_isa("avx2")
    supported = paged_attention_native.supported_variants()
    assert paged_attention_native.variant() == ("avx2" if "avx2" in supported else "baseline")
    assert int8_head.best_isa()[0] in (int8_head.ISA_AVX2, int8_head.ISA_SCALAR)
    assert "bf16" not in available_screens()
    assert cpu_isa.describe().startswith("cap=avx2 ")


def test_a_baseline_cap_runs_the_scalar_paths():
    cpu_isa.cap_isa("baseline")
    assert paged_attention_native.variant() == "baseline"
    assert int8_head.best_isa()[0] == int8_head.ISA_SCALAR


def test_capped_kernels_compute_what_uncapped_ones_do():
    hidden = torch.randn(8, 64)
    weight = torch.randn(1000, 64)
    head = int8_head.pack_int8_head(weight)
    expected = (hidden @ weight.T).argmax(dim=1)
    for cap in ("auto", "avx2", "baseline"):
        cpu_isa.cap_isa(cap)
        tokens = int8_head.int8_screened_argmax(hidden, head, weight, max_candidates=64)
        assert torch.equal(tokens, expected), cap


def test_lifting_the_cap_restores_the_widest():
    cpu_isa.cap_isa("baseline")
    cpu_isa.cap_isa("auto")
    assert paged_attention_native.variant() == widest_attention_variant()


def test_the_probe_key_names_the_cap():
    shapes = [LinearShape(in_features=64, out_features=128, bias=False)]
    uncapped_key = machine_key(shapes)
    cpu_isa.cap_isa("avx2")
    assert machine_key(shapes) != uncapped_key


def test_an_unknown_cap_is_refused():
    with pytest.raises(ValueError, match="avx1024"):
        cpu_isa.cap_isa("avx1024")  # type: ignore[arg-type]
