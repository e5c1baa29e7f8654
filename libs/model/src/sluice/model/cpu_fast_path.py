"""The model's CPU fast path, chosen on the machine and applied from outside.

Which implementation of a linear layer is fastest depends on the CPU (MKL's
generic path on AMD, oneDNN's kernels chosen by instruction set, MKL's
transposed operand slower than a plain one on Intel), on the layer's shape
and on the thread count, so a choice tuned on one machine is wrong on the
next. `choose_linears` times each distinct layer shape every way on this
machine (`probe_linears`: ``F.linear``, and PackedLinear with each weight
layout; a decode-sized batch, a few repetitions, best of three) and
`apply_cpu_fast_path` swaps the fastest in, module by module, the way
gpt-fast applies quantization: llama.py keeps one forward path and never
knows.

    load_llama ──▶ LlamaModel (nn.Linear everywhere)
                    │ choose_linears(model, "auto", cache)   # {module name: "torch" | "onednn" | "transposed"
                    │                                        #   | "screened_*"}
                    ▼ apply_cpu_fast_path(model, choice)    # nn.Linear -> PackedLinear where faster,
                   the same model, same state_dict          #   the LM head -> ScreenedHead where faster

The LM head has more choices: `ScreenedHead` (sluice.model.greedy_head)
answers greedy steps from a bfloat16 or an int8 screen plus the exact
logits of a few candidates. "auto" times a greedy step's head each way
(full float32 head and argmax, against each screen this CPU runs: bf16
needs AMX or AVX512-BF16, int8 only the native kernels) and takes the
fastest; the forced modes never screen.

A probe costs well under a second for a small model; its answer is cached
in a JSON file per machine (CPU model and flags, torch version, threads,
the native kernels' build), so a restart on the same machine does not
measure again, and a new build of the kernels does.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from sluice.kernels import cpu_isa
from sluice.kernels.argmax import argmax_rows, native_build_digest
from sluice.model.cpu_linear import WEIGHT_LAYOUTS, PackedLinear, onednn_linear_available
from sluice.model.greedy_head import SCREEN_KINDS, ScreenedHead, ScreenKind, available_screens

log = logging.getLogger(__name__)

LinearImpl = Literal["torch", "onednn", "transposed", "screened_bf16", "screened_int8"]
# The module that computes the logits, the one a screen may replace.
LM_HEAD = "lm_head"
# "auto": measure (or read this machine's cached measurement); the others force one.
CPU_LINEAR_MODES = ("auto", "onednn", "transposed", "torch")

# Rows per probe call: a decode batch of the CPU default's order (64 of
# max_num_seqs 128), which is what most steps run; prefill chunks are
# larger and rarer. Each measurement runs calls for at least this long.
PROBE_ROWS = 64
PROBE_MIN_TIME_S = 0.01
PROBE_TRIALS = 3


@dataclass(frozen=True, slots=True)
class LinearShape:
    in_features: int
    out_features: int
    bias: bool

    @property
    def key(self) -> str:
        return f"{self.in_features}x{self.out_features}{'+bias' if self.bias else ''}"


def _shape(linear: nn.Linear) -> LinearShape:
    return LinearShape(linear.in_features, linear.out_features, linear.bias is not None)


def model_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """The model's nn.Linear modules by qualified name."""
    return {name: module for name, module in model.named_modules() if type(module) is nn.Linear}


def _seconds_per_call(call, min_time_s: float) -> float:
    call()  # warm: first-call allocation, oneDNN primitive creation
    calls, started = 0, time.perf_counter()
    while True:
        call()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= min_time_s:
            return elapsed / calls


def probe_linears(shapes: Iterable[LinearShape], *, rows: int = PROBE_ROWS, trials: int = PROBE_TRIALS,
                  min_time_s: float = PROBE_MIN_TIME_S, head: LinearShape | None = None) -> dict[str, dict[str, float]]:
    """Seconds per call of each shape, {shape key: {"torch": s, "transposed": s,
    "onednn": s}} (each implementation this torch has, `linear_impls`),
    float32 on this machine's CPU with torch's current thread count. With
    `head` (the LM head's shape, no bias) and a screen available, its entry
    also has "greedy_full" (the faster full head, then argmax) and
    "greedy_<kind>" for each screen this CPU runs (ScreenedHead's
    greedy_token_ids), on rows normalised as a final RMSNorm leaves them."""
    generator = torch.Generator().manual_seed(0)
    timings: dict[str, dict[str, float]] = {}
    for shape in shapes:
        if shape.key in timings:
            continue
        linear = nn.Linear(shape.in_features, shape.out_features, bias=shape.bias).requires_grad_(False)
        modules = {impl: linear if impl == "torch" else PackedLinear(linear, layout=impl) for impl in linear_impls()}
        x = torch.randn(rows, shape.in_features, generator=generator)  # [rows, in]
        timings[shape.key] = best_times({impl: partial(module, x) for impl, module in modules.items()},
                                         trials, min_time_s)
        screens = available_screens() if shape == head else ()
        if screens:
            full = modules[_faster(timings[shape.key])]
            normed = x * torch.rsqrt(x.pow(2).mean(dim=1, keepdim=True))  # [rows, in], RMS 1
            greedy = {"greedy_full": lambda: argmax_rows(full(normed)),
                      **{f"greedy_{kind}": partial(ScreenedHead(linear, screen=kind).greedy_token_ids, normed)
                         for kind in screens}}
            timings[shape.key].update(best_times(greedy, trials, min_time_s))
    return timings


def linear_impls() -> tuple[LinearImpl, ...]:
    """The implementations of a float32 CPU linear this torch has: ``F.linear``
    and PackedLinear's layouts (oneDNN's only where torch has it)."""
    layouts = tuple(layout for layout in WEIGHT_LAYOUTS
                    if layout != "onednn" or onednn_linear_available(torch.float32))
    return ("torch", *layouts)


def best_times(impls: Mapping[str, Callable[[], object]], trials: int, min_time_s: float) -> dict[str, float]:
    """Each call's best of `trials` averages over at least `min_time_s`, in seconds."""
    with torch.inference_mode():
        return {name: min(_seconds_per_call(call, min_time_s) for _ in range(trials)) for name, call in impls.items()}


def machine_key(shapes: Iterable[LinearShape], extra: Iterable[str] = ()) -> str:
    """What a probe's answer depends on: the CPU, torch and its threads, the shapes (and `extra`, what
    else the probe measured on), the native kernels' build, and the instruction sets torch, oneDNN and
    the native kernels may use."""
    flags = model_name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model_name:
                model_name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = line.split(":", 1)[1].strip()
    except OSError:
        model_name = platform.processor() or platform.machine()
    facts = [model_name, flags, torch.__version__, str(torch.get_num_threads()),
             *sorted({s.key for s in shapes}), *extra, f"rows={PROBE_ROWS}", f"impls={','.join(linear_impls())}",
             f"screens={','.join(available_screens())}",
             f"kernels={native_build_digest()}",  # a rebuilt kernel may time differently
             f"isa-cap={cpu_isa.isa_cap()} aten={torch.backends.cpu.get_cpu_capability()} "
             f"onednn={os.environ.get('ONEDNN_MAX_CPU_ISA', '')} mkl={os.environ.get('MKL_ENABLE_INSTRUCTIONS', '')}"]
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:16]


def choose_linears(model: nn.Module, mode: str = "auto", *, cache_dir: Path | None = None) -> dict[str, LinearImpl]:
    """{linear module name: implementation} for a float32 model on CPU.

    mode "torch", "onednn" or "transposed" forces one (onednn only where
    torch has it, else torch); "auto" takes, per distinct shape, whichever
    this machine's probe found fastest, and for the LM head the fastest
    screen where it beat the full head, reading and writing the probe in
    `cache_dir` when given."""
    if mode not in CPU_LINEAR_MODES:
        raise ValueError(f"cpu linear mode {mode!r}: expected one of {', '.join(CPU_LINEAR_MODES)}")
    linears = model_linears(model)
    if mode != "auto":
        forced: LinearImpl = mode if mode in linear_impls() else "torch"  # type: ignore[assignment]
        return {name: forced for name in linears}
    shapes = [_shape(linear) for linear in linears.values()]
    head = linears.get(LM_HEAD)
    head_shape = _shape(head) if head is not None and head.bias is None else None
    timings = _cached_probe(shapes, cache_dir, head_shape)
    choice: dict[str, LinearImpl] = {name: _faster(timings[_shape(linear).key]) for name, linear in linears.items()}
    screen = _fastest_screen(timings[head_shape.key]) if head_shape is not None else None
    if screen is not None:
        choice[LM_HEAD] = f"screened_{screen}"
    return choice


def _faster(timing: Mapping[str, float]) -> LinearImpl:
    """The fastest of the implementations timed (ties to the earlier in `linear_impls`' order)."""
    timed = [impl for impl in linear_impls() if impl in timing]
    return min(timed, key=lambda impl: timing[impl])


def _fastest_screen(timing: Mapping[str, float]) -> ScreenKind | None:
    """The screen that beat the full head by the most, if any did."""
    timed = [(timing[f"greedy_{kind}"], kind) for kind in SCREEN_KINDS if f"greedy_{kind}" in timing]
    if not timed or "greedy_full" not in timing:
        return None
    seconds, kind = min(timed)
    return kind if seconds < timing["greedy_full"] else None


def _cached_probe(shapes: list[LinearShape], cache_dir: Path | None,
                  head: LinearShape | None = None) -> dict[str, dict[str, float]]:
    def measure() -> dict[str, dict[str, float]]:
        started = time.perf_counter()
        timings = probe_linears(shapes, head=head)
        log.info("probed CPU linears in %.2f s: %s", time.perf_counter() - started,
                 ", ".join(f"{key} {_faster(t)} ({t['torch'] / t[_faster(t)]:.2f}x)" for key, t in timings.items()))
        if head is not None and "greedy_full" in timings[head.key]:
            log.info("greedy LM head %s: %s", head.key,
                     ", ".join(f"{name.removeprefix('greedy_')} {seconds * 1e3:.2f} ms"
                               for name, seconds in timings[head.key].items() if name.startswith("greedy_")))
        return timings

    # The LM head's screens are timed on the native builds chosen before (cpu_kernel_probe).
    key = machine_key(shapes, extra=[f"kernels-run: {cpu_isa.describe()}"])
    path = cache_dir / f"cpu-linear-probe-{key}.json" if cache_dir else None
    return cached_timings(path, measure, required=[s.key for s in shapes])


def cached_timings(path: Path | None, measure: Callable[[], dict[str, dict[str, float]]],
                   required: Iterable[str]) -> dict[str, dict[str, float]]:
    """The timings cached at `path` if they hold every `required` key, else
    `measure()`'s, cached there (a read-only file system: measured again at
    the next start)."""
    if path is not None and path.is_file():
        try:
            timings = json.loads(path.read_text())["timings_s"]
            if all(key in timings for key in required):
                return timings
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring an unreadable CPU probe at %s", path)
    timings = measure()
    if path is not None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            temporary = path.with_suffix(".tmp")
            temporary.write_text(json.dumps({"rows": PROBE_ROWS, "timings_s": timings}, indent=1))
            temporary.replace(path)
        except OSError as error:
            log.info("not caching the CPU probe (%s)", error)
    return timings


def apply_cpu_fast_path(model: nn.Module, choice: Mapping[str, LinearImpl]) -> nn.Module:
    """Swap each nn.Linear chosen "onednn" or "transposed" for a PackedLinear
    with that weight layout, and one chosen "screened_<kind>" for a
    ScreenedHead with that screen, over the same Parameters; the model's
    names, state_dict and forward are unchanged."""
    for name, impl in choice.items():
        if impl == "torch":
            continue
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        linear = getattr(parent, child)
        if type(linear) is nn.Linear:
            kind = impl.removeprefix("screened_")
            setattr(parent, child, ScreenedHead(linear, screen=kind) if kind in SCREEN_KINDS
                    else PackedLinear(linear, layout=impl))  # type: ignore[arg-type]
    return model
