"""The widest instruction set Sluice's native CPU kernels may use.

Each native kernel picks the widest code path this CPU runs (the attention
kernel at import, the int8 LM head per call). `cap_isa` lowers that ceiling
for the whole process: "avx2" runs them as on a CPU without AVX-512 (and
without AVX-VNNI: AVX2 + FMA only, Haswell to Zen 3), "baseline" as on one
before AVX2. With ``ATEN_CPU_CAPABILITY=avx2``, ``MKL_ENABLE_INSTRUCTIONS=AVX2``
and ``ONEDNN_MAX_CPU_ISA=AVX2`` set for torch beside it, a replica on an AVX-512 machine serves with the
instruction sets an AVX2-only machine has: a way to measure that machine's
paths (or avoid a CPU's erratum) without one. The kernels GCC clones per
instruction set (`target_clones`: the elementwise ones, the argmax) keep
their own choice, so the hold does not show their AVX2 clones: a scalar
AVX2 clone of SwiGLU's loop (10x slower than its vector form, ~8% of the
replica's CPU) went unseen under the hold and showed only on an AVX2-only
CPU. The tests read those clones' built code instead
(tests/unit/kernels/test_cpu_clones_vectorised.py).

Process-wide, like torch's thread count: call it once at start-up, before
the model is loaded and probed.
"""

from __future__ import annotations

from typing import Literal

from sluice.kernels import int8_head, paged_attention_native

IsaCap = Literal["auto", "avx512", "avx2", "baseline"]
ISA_CAPS: tuple[IsaCap, ...] = ("auto", "avx512", "avx2", "baseline")

# The int8 head's instruction sets each cap admits (AVX-VNNI is a VEX
# extension AVX2-only CPUs lack).
_INT8_ISAS: dict[str, tuple[int, ...]] = {
    "avx512": (int8_head.ISA_SCALAR, int8_head.ISA_AVX2, int8_head.ISA_AVX_VNNI, int8_head.ISA_AVX512_VNNI),
    "avx2": (int8_head.ISA_SCALAR, int8_head.ISA_AVX2),
    "baseline": (int8_head.ISA_SCALAR,),
}
# The attention kernel's variants, widest first.
_ATTENTION_VARIANTS = ("avx512", "avx2", "baseline")

_cap: IsaCap = "auto"


def cap_isa(cap: IsaCap) -> None:
    """Run the native kernels at most at `cap` ("auto": the widest this CPU runs)."""
    global _cap
    if cap not in ISA_CAPS:
        raise ValueError(f"CPU instruction set cap {cap!r}: expected one of {', '.join(ISA_CAPS)}")
    _cap = cap
    if paged_attention_native.available():
        paged_attention_native.set_variant(attention_variants()[0])
    int8_head.limit_isas(None if cap == "auto" else _INT8_ISAS[cap])
    int8_head.prefer_isa(None)


def isa_cap() -> IsaCap:
    return _cap


def attention_variants() -> list[str]:
    """The attention kernel's variants this CPU runs within the cap, widest first."""
    if not paged_attention_native.available():
        return []
    allowed = _ATTENTION_VARIANTS if _cap == "auto" else _ATTENTION_VARIANTS[_ATTENTION_VARIANTS.index(_cap):]
    supported = paged_attention_native.supported_variants()
    return [variant for variant in allowed if variant in supported]


def describe() -> str:
    """The cap and what each kernel runs under it, for logs and probe keys."""
    attention = paged_attention_native.variant() if paged_attention_native.available() else "none"
    head = int8_head.isa_label(int8_head.best_isa()) if int8_head.int8_head_available() else "none"
    return f"cap={_cap} attention={attention} int8_head={head}"
