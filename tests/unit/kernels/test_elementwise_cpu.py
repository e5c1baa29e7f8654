"""The native elementwise kernels compute what their torch formulas compute,
on the shapes and strides the model hands them, and leave everything else
(other dtypes, tensors that need a gradient) to the formulas."""

import shutil

import pytest
import torch
import torch.nn.functional as F

from sluice.kernels import elementwise_cpu
from sluice.kernels.elementwise_cpu import rms_norm, rotate, rotate_half, silu_mul

pytestmark = pytest.mark.skipif(
    not elementwise_cpu.available() and shutil.which("cc") is None,
    reason="no C compiler: the native kernels were not built, the torch formulas serve",
)

# float32; the kernels fuse multiply-adds and sum in another order.
ATOL = 1e-5


def reference_rms_norm(x, weight, eps):
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@pytest.fixture(params=[1, 2])
def threads(request):
    """One thread, and two (rows split across OpenMP threads on large inputs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def test_kernels_are_built_where_a_compiler_is():
    # CI installs with a C compiler: a silent fallback would pass every test below.
    assert elementwise_cpu.available()


@pytest.mark.parametrize("rows", [1, 3, 64, 700])  # 700 x 256: past the threshold where rows go parallel
def test_rms_norm_matches_the_formula(rows, threads):
    torch.manual_seed(rows)
    x = torch.randn(rows, 256) * 3
    weight = torch.randn(256)
    with torch.inference_mode():
        got = rms_norm(x, weight, 1e-5)
    torch.testing.assert_close(got, reference_rms_norm(x, weight, 1e-5), atol=ATOL, rtol=1e-6)


def test_rms_norm_reads_strided_rows_and_keeps_the_formula_for_bf16_and_gradients():
    torch.manual_seed(0)
    wide = torch.randn(5, 300)
    x = wide[:, 10:266]  # rows 300 apart
    weight = torch.randn(256)
    with torch.inference_mode():
        torch.testing.assert_close(rms_norm(x, weight, 1e-6), reference_rms_norm(x, weight, 1e-6), atol=ATOL,
                                   rtol=1e-6)
        bf16 = x.to(torch.bfloat16)
        assert torch.equal(rms_norm(bf16, weight, 1e-6), reference_rms_norm(bf16, weight, 1e-6))
    trained = weight.clone().requires_grad_()
    rms_norm(x, trained, 1e-6).sum().backward()  # the formula, so the gradient flows
    assert trained.grad is not None and trained.grad.shape == (256,)


@pytest.mark.parametrize("rows", [1, 64, 200])
def test_silu_mul_matches_the_formula_over_the_whole_range(rows, threads):
    torch.manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 688) * 8
    gate_up[0, :6] = torch.tensor([0.0, -0.0, 90.0, -90.0, -1e-30, 1e-30])  # saturation, zero, tiny
    with torch.inference_mode():
        got = silu_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    assert got.shape == (rows, 688)
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=1e-5)


@pytest.mark.parametrize("tokens", [1, 64, 2048])
def test_rotate_matches_the_formula_on_the_fused_projections_layout(tokens, threads):
    torch.manual_seed(tokens)
    heads, kv_heads, head_dim = 8, 4, 32
    # q and k rotate together as a view into the fused q/k/v projection's rows.
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim)
    qk = qkv[:, :(heads + kv_heads) * head_dim].view(tokens, heads + kv_heads, head_dim)
    angles = torch.rand(tokens, head_dim // 2) * 100
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    with torch.inference_mode():
        got = rotate(qk, cos, sin)
    expected = qk * cos[:, None, :] + rotate_half(qk) * sin[:, None, :]
    assert got.is_contiguous() and got.shape == qk.shape
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=0)


def test_without_the_native_build_the_formulas_serve(monkeypatch):
    monkeypatch.setattr(elementwise_cpu, "_native", None)
    torch.manual_seed(0)
    x, weight, gate_up = torch.randn(4, 256), torch.randn(256), torch.randn(4, 64)
    qk, cos, sin = torch.randn(4, 3, 32), torch.randn(4, 32), torch.randn(4, 32)
    with torch.inference_mode():
        assert torch.equal(rms_norm(x, weight, 1e-5), reference_rms_norm(x, weight, 1e-5))
        assert torch.equal(silu_mul(gate_up), F.silu(gate_up[:, :32]) * gate_up[:, 32:])
        assert torch.equal(rotate(qk, cos, sin), qk * cos[:, None] + rotate_half(qk) * sin[:, None])
