"""Fit the cost model to this machine: time real engine steps, fit its terms.

    measure  the replica's own model path (load_llama with the device's
             attention backend and KV layout, ModelRunner, StepExecutor),
             driven by a real IterationScheduler + BlockManager. A timed
             step is what the replica's engine loop times: schedule(now),
             execute(plan), update(plan, sampled), plus the cache-event
             drain it does after every step. Sequences are brought to the
             state a grid point needs by untimed "dry" steps that run the
             scheduler with a made-up sampled token instead of the model
             (the KV they leave is stale, which no kernel's speed depends on).
    fit      Efficiency(compute, bandwidth, step_overhead_s, attention_compute,
             lm_head_compute, kv_bandwidth, sequence_overhead_s,
             prefill_chunk_overhead_s, prefill_context_passes, and whether
             the linears hide their weight reads and attention its KV
             reads) of the cost model by least squares on log(step time):
             steps run from ~2 ms
             to ~150 ms here, and an absolute loss would fit only the long
             ones. `link` is unused at tp = 1 and kept at its default.
    write    a JSON file (`write_calibration`); `load_calibration(path)`
             gives back (Hardware, Efficiency) for a CostModel.

The grid, per point, timed `repetitions` times (median kept) after a
discarded warm-up step, in `passes` sweeps over the grid so a burst of
other work on a shared machine lands on a few samples of many points
rather than on every sample of a few:

    decode   1..64 sequences x contexts 16..2,048 tokens
    prefill  one chunk of 16..512 tokens at depths 0..3,072 (the depth is
             a prefix-cache hit on an earlier, dry-run prompt)
    mixed    4, 16 or 48 decodes beside one prefill chunk of 16..128
             tokens at depths 0..2,048

Peaks. What is fitted is an achievable rate (FLOP/s, bytes/s). Efficiency
must lie in (0, 1] of the hardware's peak, and the `cpu` preset's peaks are
a guess at a modest desktop, not this machine: where the fitted rate is at
or under the preset's peak, the peak is kept and the efficiency is the
ratio; where it is over (the tiny model's 45 MB of weights partly live in
the CPU's caches, so its "bandwidth" beats DRAM), the peak is raised to the
fitted rate with efficiency 1.0. Either way the calibrated pair gives the
same step times; the hardware is named "<preset>-calibrated" so it is never
mistaken for the datasheet preset.
"""

from __future__ import annotations

import json
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from sluice.engine.block_manager import BlockManager
from sluice.engine.plan import StepPlan
from sluice.engine.request import EngineRequest, StopPolicy
from sluice.engine.scheduler import IterationScheduler
from sluice.engine.scheduler_config import SchedulerConfig

from sluice.sim.cost_model import CostModel, Efficiency, StepShape
from sluice.sim.hardware import Hardware, hardware_by_name
from sluice.sim.model_spec import ModelSpec

FORMAT = "sluice-sim-calibration/1"
DEFAULT_OUT = Path(".sluice") / "sim-calibration.json"
# Token ids of made-up prompts start past the tiny vocabulary's special ids.
_FIRST_TOKEN_ID = 4
DRY_TOKEN_ID = 7  # what a dry step "samples"


# --- the grid ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One step to time: `decodes` sequences decoding at `decode_context_tokens`,
    beside (or instead of) one prefill chunk of `prefill_tokens` starting at
    `prefill_depth_tokens` (a multiple of the block size: it is a prefix hit)."""

    decodes: int = 0
    decode_context_tokens: int = 0
    prefill_tokens: int = 0
    prefill_depth_tokens: int = 0

    def __post_init__(self) -> None:
        if self.decodes < 0 or self.prefill_tokens < 0 or not (self.decodes or self.prefill_tokens):
            raise ValueError(f"a grid point needs decodes or a prefill chunk: {self}")
        if self.decodes and self.decode_context_tokens < 1:
            raise ValueError(f"decodes need a context of >= 1 token: {self}")

    @property
    def kind(self) -> str:
        if self.decodes and self.prefill_tokens:
            return "mixed"
        return "decode" if self.decodes else "prefill"

    @property
    def shape(self) -> StepShape:
        """The step as planned when the decodes are at their first token
        (a measured step's contexts are a few tokens further on)."""
        prefill = ((self.prefill_tokens, self.prefill_depth_tokens),) if self.prefill_tokens else ()
        return StepShape(((1, self.decode_context_tokens),) * self.decodes + prefill)


def default_grid(quick: bool = False) -> tuple[GridPoint, ...]:
    """The calibration grid; `quick` is a coarser one (~1/3 of the points)."""
    batches = (1, 4, 16, 64) if quick else (1, 2, 4, 8, 16, 32, 64)
    contexts = (16, 512, 2048) if quick else (16, 256, 1024, 2048)
    chunks = (16, 64, 256, 512) if quick else (16, 32, 64, 128, 256, 512)
    depths = (0, 1024, 3072) if quick else (0, 512, 1024, 2048, 3072)
    # A serving replica's steps are mostly these: decodes beside a chunk or
    # two, small ones from short prompts included.
    mixed = ((4, 256, 16, 0), (8, 256, 64, 0), (32, 1024, 128, 1024), (16, 512, 32, 512)) if quick else tuple(
        (b, c, n, d) for b in (4, 16, 48) for c in (256, 1024)
        for n, d in ((16, 0), (48, 512), (128, 0), (128, 1024), (64, 2048)))
    return (
        tuple(GridPoint(decodes=b, decode_context_tokens=c) for b in batches for c in contexts)
        + tuple(GridPoint(prefill_tokens=n, prefill_depth_tokens=d) for n in chunks for d in depths)
        + tuple(GridPoint(b, c, n, d) for b, c, n, d in mixed)
    )


def gpu_grid(quick: bool = False) -> tuple[GridPoint, ...]:
    """A grid for a GPU-sized model on one GPU (Llama-3-8B in bf16 on an
    H200): serving batches and contexts, chunks up to 8K tokens at depths up
    to 16K. Its largest point, 128 decodes at 4K, holds 64 GiB of 8B KV."""
    batches = (1, 16, 64) if quick else (1, 8, 32, 64, 128)
    contexts = (256, 4096) if quick else (256, 1024, 4096)
    chunks = (256, 2048, 8192) if quick else (128, 512, 2048, 8192)
    depths = (0, 16384) if quick else (0, 4096, 16384)
    mixed = ((32, 1024, 512, 0),) if quick else ((32, 1024, 512, 0), (64, 1024, 2048, 4096))
    return (
        tuple(GridPoint(decodes=b, decode_context_tokens=c) for b in batches for c in contexts)
        + tuple(GridPoint(prefill_tokens=n, prefill_depth_tokens=d) for n in chunks for d in depths)
        + tuple(GridPoint(b, c, n, d) for b, c, n, d in mixed)
    )


@dataclass(frozen=True, slots=True)
class StepTiming:
    """One grid point measured: the exact shape the scheduler planned (of
    the median sample) and every sample's seconds."""

    kind: str
    shape: StepShape
    samples_s: tuple[float, ...]  # wall clock, as the engine loop times a step
    # The process's CPU time over the same steps: with one torch thread, below
    # the wall time only by the time other work on the machine took the core.
    cpu_samples_s: tuple[float, ...] = ()

    @property
    def seconds(self) -> float:
        return statistics.median(self.samples_s)

    @property
    def cpu_share(self) -> float | None:
        """Median CPU / wall time of the samples (None if not recorded)."""
        if not self.cpu_samples_s:
            return None
        return statistics.median(c / w for c, w in zip(self.cpu_samples_s, self.samples_s))

    def on_clock(self, clock: str) -> "StepTiming":
        """This timing with the `clock` ("wall" or "cpu") samples as its seconds."""
        if clock == "wall":
            return self
        if clock != "cpu" or not self.cpu_samples_s:
            raise ValueError(f"clock is wall or cpu (with CPU samples), got {clock!r}")
        return replace(self, samples_s=self.cpu_samples_s)


# --- measuring --------------------------------------------------------------


class TimingEngine(NamedTuple):
    """The replica's model path, built once and shared by every grid point."""

    executor: Any  # sluice.replica.executor.StepExecutor
    sampling: Any  # sluice.model.sampler.SamplingParams, greedy as the benches send
    num_blocks: int
    block_size_tokens: int
    max_model_len_tokens: int
    vocab_size: int
    # Where set, each point's blocks are handed out in a random order (seeded
    # by this) over the whole pool, as a replica that has served a while
    # hands them out; else 0, 1, 2, ... as a fresh one does.
    scatter_seed: str | None = None


def _import_engine():
    try:
        import torch
        from sluice.model.attention import default_backend, preferred_kv_layout
        from sluice.model.kv_cache import allocate_kv_caches
        from sluice.model.loader import load_llama
        from sluice.model.runner import ModelRunner
        from sluice.model.sampler import SamplingParams
        from sluice.replica.executor import StepExecutor
    except ModuleNotFoundError as error:
        raise RuntimeError(
            f"calibration times the real model and needs torch, sluice-model and sluice-replica ({error}); "
            "run it from the dev venv (make dev), where they are installed"
        ) from None
    return torch, default_backend, preferred_kv_layout, allocate_kv_caches, load_llama, ModelRunner, \
        SamplingParams, StepExecutor


def tune_process(torch_threads: int | None = None) -> None:
    """The replica's start-up tuning, for a program about to measure:
    `torch_threads` intra-op threads (None: torch's default, as the replica's
    SLUICE_TORCH_THREADS=0) and the CPU allocator kept in the heap
    (sluice.model.cpu_tuning). Process-wide: call it from a program's main."""
    torch = _import_engine()[0]
    from sluice.model.cpu_tuning import tune_cpu_allocator

    if torch_threads:
        torch.set_num_threads(torch_threads)
    tune_cpu_allocator()


def build_timing_engine(source: Path | ModelSpec, num_blocks: int, block_size_tokens: int, dtype: str,
                        device: str = "cpu") -> TimingEngine:
    """The replica's engine path on `device`, over the checkpoint in a
    directory or, for a ModelSpec, random weights of that shape."""
    (torch, default_backend, preferred_kv_layout, allocate_kv_caches, load_llama, ModelRunner, SamplingParams,
     StepExecutor) = _import_engine()
    torch_dtype = getattr(torch, dtype)
    target = torch.device(device)
    if target.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} asked for, but torch sees no CUDA device here")
    # As services/replica __main__.build_engine builds it.
    if isinstance(source, ModelSpec):
        model = random_llama(source, torch_dtype, target, default_backend(target))
    else:
        model = load_llama(source, dtype=torch_dtype, device=target, attention_backend=default_backend(target))
    caches = allocate_kv_caches(model.config, num_blocks, block_size_tokens, torch_dtype, target,
                                layout=preferred_kv_layout(target, torch_dtype))
    # The caches start as zeros (allocate_kv_caches), so the stale K/V dry
    # steps leave is never uninitialised memory (NaN, denormals).
    executor = StepExecutor(ModelRunner(model, caches))
    return TimingEngine(executor, SamplingParams(temperature=0.0, ignore_eos=True), num_blocks, block_size_tokens,
                        model.config.max_position_embeddings, model.config.vocab_size)


def hf_config(spec: ModelSpec) -> dict[str, Any]:
    """A Hugging Face Llama `config.json` of `spec`'s shape (the inverse of
    ModelSpec.from_hf_config, Llama 3's RoPE base)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": spec.hidden_size, "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim, "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_context_tokens, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "tie_word_embeddings": spec.tie_word_embeddings,
    }


def random_llama(spec: ModelSpec, torch_dtype, device, attention_backend):
    """A model of `spec`'s shape with random weights, built on `device`
    directly: a step's time does not depend on the weights' values, and a
    GPU-sized model (Llama-3-8B's 16 GB) needs no checkpoint on disk. Small
    normal weights keep activations finite through every layer."""
    import torch
    from sluice.model.config import LlamaConfig
    from sluice.model.loader import empty_llama, finish_for_device

    device = torch.device(device)
    model = empty_llama(LlamaConfig.from_hf_config(hf_config(spec)), dtype=torch_dtype, device=device,
                        attention_backend=attention_backend)
    generator = torch.Generator(device=device).manual_seed(0)
    for name, parameter in model.named_parameters():
        if name.endswith("norm.weight"):
            parameter.fill_(1.0)
        else:
            parameter.normal_(0.0, 0.02, generator=generator)
    return finish_for_device(model, dtype=torch_dtype, device=device)  # as load_llama finishes one


def blocks_needed(grid: Sequence[GridPoint], steps_per_point: int, block_size_tokens: int = 16) -> int:
    """KV blocks the biggest grid point holds at once, with a little slack."""
    def blocks(tokens: int) -> int:
        return -(-tokens // block_size_tokens)

    return 8 + max(
        p.decodes * blocks(p.decode_context_tokens + steps_per_point + 2)
        + blocks(p.prefill_depth_tokens) + 2 * blocks(p.prefill_tokens + block_size_tokens)
        for p in grid
    )


class PointRun:
    """One grid point on a fresh scheduler over the shared KV tensors."""

    def __init__(self, engine: TimingEngine, point: GridPoint, steps: int, rng: random.Random) -> None:
        self.engine, self.point, self.rng = engine, point, rng
        # A budget that takes every prompt of the point in one dry step, so
        # no decode runs ahead of the others; a timed step plans only what
        # the point asks for whatever the budget (no chunk caps).
        prompt_tokens = point.decodes * point.decode_context_tokens + point.prefill_depth_tokens
        config = SchedulerConfig(
            max_num_batched_tokens=max(2048, prompt_tokens + point.decodes + point.prefill_tokens),
            max_num_seqs=point.decodes + 2, max_model_len_tokens=engine.max_model_len_tokens,
            interactive_preempt_after_s=None, long_prefill_chunk_tokens=0, prefill_depth_scale_tokens=0,
            batch_prefill_tokens_beside_interactive=0, interactive_recent_s=0.0,
        )
        free_order = None
        if engine.scatter_seed is not None:
            free_order = list(range(engine.num_blocks))
            random.Random(f"{engine.scatter_seed}:{point}").shuffle(free_order)
        self.core = IterationScheduler(config, BlockManager(engine.num_blocks, engine.block_size_tokens, free_order))
        self._serial = 0
        self.prefix = self._tokens(point.prefill_depth_tokens)
        if point.prefill_depth_tokens:  # its blocks stay cached: each timed chunk hits them
            self._dry_run_until_done({self._add(self.prefix, 1)})
        decode_ids = {self._add(self._tokens(point.decode_context_tokens), steps + 4) for _ in range(point.decodes)}
        self._dry_run_until_done(decode_ids, first_token_only=True)

    def _tokens(self, count: int) -> tuple[int, ...]:
        return tuple(self.rng.randrange(_FIRST_TOKEN_ID, self.engine.vocab_size) for _ in range(count))

    def _add(self, prompt: tuple[int, ...], max_output_tokens: int) -> str:
        self._serial += 1
        request_id = f"calibrate-{self._serial}"
        self.core.add(EngineRequest(
            request_id=request_id, prompt_token_ids=prompt, sampling=self.engine.sampling,
            stop=StopPolicy(max_output_tokens=max_output_tokens, ignore_eos=True)))
        return request_id

    def _dry_run_until_done(self, request_ids: set[str], first_token_only: bool = False) -> None:
        """Dry steps until each of `request_ids` has finished (or, with
        `first_token_only`, produced its first token: its prompt is in)."""
        pending = set(request_ids)
        while pending:
            plan = self.core.schedule(time.monotonic())
            if plan.is_empty:
                raise RuntimeError(f"calibration point {self.point} does not fit {self.engine.num_blocks} KV blocks")
            sampled = {chunk.request_id: DRY_TOKEN_ID for chunk in plan.chunks if chunk.samples}
            for output in self.core.update(plan, sampled):
                if output.finished or first_token_only:
                    pending.discard(output.request_id)
            self.core.blocks.drain_cache_events()

    def timed_step(self) -> tuple[StepShape, float, float]:
        """One step as the replica's engine loop runs and times it: its
        shape, wall seconds and process CPU seconds."""
        if self.point.prefill_tokens:
            self._add(self.prefix + self._tokens(self.point.prefill_tokens), 1)
        executor = self.engine.executor
        cpu_started_s = time.process_time()
        started_s = time.perf_counter()
        plan = self.core.schedule(time.monotonic())
        outputs = self.core.update(plan, executor.execute(plan))
        for output in outputs:
            if output.finished:
                executor.forget(output.request_id)
        self.core.blocks.drain_cache_events()
        elapsed_s = time.perf_counter() - started_s
        cpu_s = time.process_time() - cpu_started_s
        shape = _shape(plan)
        self._check(shape)
        return shape, elapsed_s, cpu_s

    def _check(self, shape: StepShape) -> None:
        point = self.point
        decodes = sum(1 for n, _ in shape.chunks if n == 1)
        prefills = [(n, c) for n, c in shape.chunks if n > 1]
        expected = [(point.prefill_tokens, point.prefill_depth_tokens)] if point.prefill_tokens else []
        if decodes != point.decodes or prefills != expected:
            raise RuntimeError(f"calibration point {point} planned {decodes} decodes and chunks {prefills}")


def _shape(plan: StepPlan) -> StepShape:
    return StepShape(tuple((len(chunk.token_ids), chunk.start_position) for chunk in plan.chunks))


def measure_step_times(
    model: str | os.PathLike[str] | ModelSpec, grid: Sequence[GridPoint] | None = None, *, repetitions: int = 6,
    passes: int = 2, warmup_steps: int = 1, dtype: str = "float32", block_size_tokens: int = 16, seed: int = 0,
    device: str = "cpu", progress: Callable[[int, int], None] | None = None, scatter_over_blocks: int = 0,
) -> list[StepTiming]:
    """Time every grid point on `model` (a checkpoint directory, or a
    ModelSpec for random weights of its shape) on `device`, `repetitions`
    samples each split over `passes` sweeps. Call `tune_process` first, as
    the replica tunes itself at start-up, so the timings are its.

    `scatter_over_blocks` > 0: a pool of that many blocks (or what the grid
    needs, if more), each point's blocks scattered over it at random, the
    state of a replica whose prefix cache has cycled through its pool (its
    LRU evictions hand out blocks from anywhere). On the dev box a decode
    step over scattered blocks took 1.3-1.4x one over consecutive blocks
    (tiny model, 8,192 blocks, 16-64 decodes at 256-1,024 tokens; Intel
    Xeon, 2026-12-05), so a calibration of a fresh pool undercounts what a
    serving replica pays after its first ~100k tokens."""
    grid = tuple(default_grid() if grid is None else grid)
    if repetitions < 1 or passes < 1 or warmup_steps < 0:
        raise ValueError("repetitions and passes must be >= 1, warmup_steps >= 0")
    passes = min(passes, repetitions)
    per_pass = [repetitions // passes + (i < repetitions % passes) for i in range(passes)]
    steps = max(per_pass) + warmup_steps
    source = model if isinstance(model, ModelSpec) else Path(model)
    num_blocks = max(blocks_needed(grid, steps, block_size_tokens), scatter_over_blocks)
    engine = build_timing_engine(source, num_blocks, block_size_tokens, dtype, device)
    if scatter_over_blocks > 0:
        engine = engine._replace(scatter_seed=f"{seed}:scatter")
    rng = random.Random(f"{seed}:calibrate")
    samples: list[list[tuple[StepShape, float, float]]] = [[] for _ in grid]
    done = 0
    for count in per_pass:
        for index, point in enumerate(grid):
            run = PointRun(engine, point, steps, rng)
            for _ in range(warmup_steps):
                run.timed_step()  # first calls of a shape (oneDNN primitives, buffer growth) are not its cost
            samples[index].extend(run.timed_step() for _ in range(count))
            done += 1
            if progress is not None:
                progress(done, len(grid) * passes)
    timings = []
    for point, point_samples in zip(grid, samples):
        ordered = sorted(point_samples, key=lambda sample: sample[1])
        timings.append(StepTiming(point.kind, ordered[(len(ordered) - 1) // 2][0],
                                  tuple(wall_s for _, wall_s, _ in point_samples),
                                  tuple(cpu_s for _, _, cpu_s in point_samples)))
    return timings


# --- fitting ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fit:
    """What the fit found: the achievable rates, and the Hardware +
    Efficiency that express them (see the module docstring on peaks)."""

    hardware: Hardware
    efficiency: Efficiency
    flops_per_s: float
    bytes_per_s: float
    fitted_s: tuple[float, ...]  # per timing, in order
    relative_errors: tuple[float, ...]  # (fitted - measured) / measured
    attention_flops_per_s: float
    lm_head_flops_per_s: float | None = None  # None: flops_per_s
    kv_bytes_per_s: float | None = None  # None: bytes_per_s

    @property
    def median_relative_error(self) -> float:
        return statistics.median(abs(e) for e in self.relative_errors)

    @property
    def max_relative_error(self) -> float:
        return max(abs(e) for e in self.relative_errors)


class Rates(NamedTuple):
    """What the fit finds: achievable rates and fixed costs."""

    flops_per_s: float  # the linears and the lm head
    bytes_per_s: float
    overhead_s: float  # per step
    attention_flops_per_s: float
    sequence_overhead_s: float  # per sequence in a step
    prefill_chunk_overhead_s: float = 0.0  # per prefill chunk in a step
    prefill_context_passes: float = 1.0  # times a prefill chunk's cached context is moved
    lm_head_flops_per_s: float | None = None  # None: flops_per_s
    kv_bytes_per_s: float | None = None  # None: bytes_per_s


class Form(NamedTuple):
    """Which of the cost model's two shapes each kernel group takes: its
    arithmetic hiding its memory traffic (max) or waiting for it (sum)."""

    linear_overlaps_weights: bool
    attention_overlaps_kv: bool


FORMS = tuple(Form(linear, attention) for linear in (True, False) for attention in (True, False))


def _rate_model(base: Hardware, model: ModelSpec, dtype: str, rates: Rates, form: Form) -> CostModel:
    hardware, efficiency = express(base, rates, form)
    return CostModel(hardware, model, tp=1, dtype=dtype, efficiency=efficiency)


# The LM head's rate may run up to this many times the linears'. The CPU
# replica's greedy head screens in bfloat16 and recomputes a few candidates
# exactly: 64 rows took ~1.5 ms against ~6.7 ms for the float32 head (Intel
# Xeon with AMX, 2026-12-05), 4.5x. A bound, because the head's cost and
# sequence_overhead_s both grow with the sequences in a step: on its own the
# fit trades one for the other along a ridge, and the peak that expresses
# the rates would follow an absurd head rate up.
MAX_HEAD_SPEEDUP = 5.0


def _rates_of(x: Sequence[float]) -> Rates:
    """The fit's free variables: the logs of five rates and costs, the log of
    the per-chunk cost, the log of the passes past the first, the LM head's
    rate as a logistic share of MAX_HEAD_SPEEDUP x the linears', and the KV
    reads' bandwidth as a logistic share of the weights' (scattered blocks
    never stream faster than the weights do; where attention hides its reads
    the data cannot tell, and a free rate would wander off to anything)."""
    *logs, log_chunk_s, log_passes_again, head_logit, kv_logit = x
    rates = Rates(*(math.exp(v) for v in logs), math.exp(log_chunk_s), 1.0 + math.exp(log_passes_again))
    return rates._replace(lm_head_flops_per_s=rates.flops_per_s * MAX_HEAD_SPEEDUP / (1.0 + math.exp(-head_logit)),
                          kv_bytes_per_s=rates.bytes_per_s / (1.0 + math.exp(-kv_logit)))


def _head_logit(speedup: float) -> float:
    share = speedup / MAX_HEAD_SPEEDUP
    return math.log(share / (1.0 - share))


def fit_efficiency(timings: Sequence[StepTiming], model: ModelSpec, base: Hardware | str = "cpu",
                   dtype: str = "fp32") -> Fit:
    """Least squares on log step time over the nine `Rates` (see `_rates_of`
    for how each is a free variable): Nelder-Mead from the best few
    of a coarse grid of starts (the roofline's max() makes the loss kinked,
    so no gradients), for each of the four `FORMS`, the closest kept.
    Attention gets a compute rate of its own, each sequence and each prefill
    chunk a fixed cost, and a prefill chunk's context its own number of
    passes. Each earned its place on a CPU's timings:
      - one rate for attention and the linears and no per-sequence term: a
        median error of 14% (max 32%), short of long prefills' linears and
        of deep or many decodes' cost;
      - attention's reads added to its arithmetic (the CPU kernel waits for
        them): median 10.2% -> 8.9%;
      - the linears' weight pass added to their arithmetic, the per-chunk
        cost and the context passes: median 7.8% -> 2.7%, max 35% -> 15%,
        and on the mixed steps a serving replica runs (4-48 decodes beside a
        16-128-token chunk) the model had come out 10-30% fast (tiny model,
        Intel Xeon, one thread, 2026-12-05);
      - the KV reads' own bandwidth, for timings over a scattered pool
        (`measure_step_times(scatter_over_blocks=)`), where deep decodes
        cost up to 1.76x a fresh pool's and the weights still stream as
        before: median 6.0% -> 2.6%, max 40% -> 12% (the same day)."""
    if len(timings) < 9:
        raise ValueError(f"a fit of 9 terms needs at least 9 timings, got {len(timings)}")
    base = hardware_by_name(base) if isinstance(base, str) else base
    shapes = [t.shape for t in timings]
    log_measured = [math.log(t.seconds) for t in timings]
    fastest_s = min(t.seconds for t in timings)
    starts = [(math.log(f), math.log(b), math.log(fastest_s * o), math.log(f * a), math.log(fastest_s * q),
               math.log(fastest_s * c), math.log(p), _head_logit(h), k)
              for f in (1e9, 1e10, 1e11, 1e12, 1e13) for b in (1e9, 1e10, 1e11, 1e12) for o in (0.1, 0.5)
              for a in (0.1, 1.0) for q in (0.001, 0.03) for c in (0.001, 0.2) for p in (0.01, 2.0)
              for h in (1.0, 4.0) for k in (0.0, 3.0)]  # KV reads at 1/2 or ~95% of the weights' rate

    def fit_form(form: Form) -> tuple[list[float], float]:
        def loss(x: Sequence[float]) -> float:
            if not all(-40.0 < v < 40.0 for v in x):
                return math.inf
            cost = _rate_model(base, model, dtype, _rates_of(x), form)
            return sum((math.log(cost.step_time_s(s)) - m) ** 2 for s, m in zip(shapes, log_measured))

        best = min((_nelder_mead(loss, start) for start in sorted(starts, key=loss)[:4]), key=lambda r: r[1])
        for _ in range(6):  # restarts: Nelder-Mead stalls on the kinks and along the ridges of 9 terms
            again = _nelder_mead(loss, best[0], step=0.1)
            if again[1] > best[1] - 1e-4 * (1.0 + best[1]):
                return min(best, again, key=lambda r: r[1])
            best = again
        return best

    fits = {form: fit_form(form) for form in FORMS}
    form = min(fits, key=lambda f: fits[f][1])
    rates = _rates_of(fits[form][0])
    fitted = _rate_model(base, model, dtype, rates, form)
    fitted_s = tuple(fitted.step_time_s(s) for s in shapes)
    errors = tuple((f - t.seconds) / t.seconds for f, t in zip(fitted_s, timings))
    return Fit(fitted.hardware, fitted.efficiency, rates.flops_per_s, rates.bytes_per_s, fitted_s, errors,
               rates.attention_flops_per_s, rates.lm_head_flops_per_s, rates.kv_bytes_per_s)


def express(base: Hardware, rates: Rates, form: Form = Form(True, True)) -> tuple[Hardware, Efficiency]:
    """Achievable rates as peaks and efficiencies in (0, 1]: the preset's
    peak where the rates are within it, else the fastest rate at 1.0."""
    head_flops_per_s = rates.flops_per_s if rates.lm_head_flops_per_s is None else rates.lm_head_flops_per_s
    peak_flops_per_s = max(base.peak_flops_per_s, rates.flops_per_s, rates.attention_flops_per_s, head_flops_per_s)
    kv_bytes_per_s = rates.bytes_per_s if rates.kv_bytes_per_s is None else rates.kv_bytes_per_s
    peak_bytes_per_s = max(base.hbm_bandwidth_bytes_per_s, rates.bytes_per_s, kv_bytes_per_s)
    hardware = replace(base, name=f"{base.name}-calibrated", peak_flops_per_s=peak_flops_per_s,
                       hbm_bandwidth_bytes_per_s=peak_bytes_per_s)
    return hardware, Efficiency(
        compute=rates.flops_per_s / peak_flops_per_s, bandwidth=rates.bytes_per_s / peak_bytes_per_s,
        step_overhead_s=rates.overhead_s, attention_compute=rates.attention_flops_per_s / peak_flops_per_s,
        sequence_overhead_s=rates.sequence_overhead_s, attention_overlaps_kv=form.attention_overlaps_kv,
        linear_overlaps_weights=form.linear_overlaps_weights,
        prefill_chunk_overhead_s=rates.prefill_chunk_overhead_s, prefill_context_passes=rates.prefill_context_passes,
        lm_head_compute=head_flops_per_s / peak_flops_per_s, kv_bandwidth=kv_bytes_per_s / peak_bytes_per_s,
    )


def _nelder_mead(f: Callable[[Sequence[float]], float], start: Sequence[float], step: float = 1.0,
                 iterations: int = 400, tolerance: float = 1e-10) -> tuple[list[float], float]:
    """Minimise `f` from `start` (standard coefficients); (x, f(x))."""
    n = len(start)
    simplex = [list(start)] + [[v + (step if i == j else 0.0) for j, v in enumerate(start)] for i in range(n)]
    values = [f(x) for x in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tolerance * (1.0 + abs(values[0])):
            break
        centroid = [sum(x[j] for x in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]

        def toward(coefficient: float) -> list[float]:
            return [c + coefficient * (w - c) for c, w in zip(centroid, worst)]

        reflected = toward(-1.0)
        reflected_value = f(reflected)
        if reflected_value < values[0]:
            expanded = toward(-2.0)
            expanded_value = f(expanded)
            simplex[-1], values[-1] = (expanded, expanded_value) if expanded_value < reflected_value \
                else (reflected, reflected_value)
        elif reflected_value < values[-2]:
            simplex[-1], values[-1] = reflected, reflected_value
        else:
            contracted = toward(0.5 if reflected_value < values[-1] else -0.5)
            contracted_value = f(contracted)
            if contracted_value < min(values[-1], reflected_value):
                simplex[-1], values[-1] = contracted, contracted_value
            else:  # shrink toward the best
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (v - b) for b, v in zip(best, x)] for x in simplex[1:]]
                values = [values[0]] + [f(x) for x in simplex[1:]]
    index = min(range(n + 1), key=values.__getitem__)
    return simplex[index], values[index]


# --- the whole calibration -------------------------------------------------


def host_facts(device: str = "cpu") -> dict:
    """What the timings depend on besides the code: printed beside them and
    kept in the file, so a stale or foreign calibration can be told apart.
    On a CUDA `device`, its GPU's name too."""
    torch = _import_engine()[0]
    cpu_model = "unknown"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            cpu_model = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                             cpu_model)
    except OSError:
        pass
    facts = {"cpu_model": cpu_model, "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
             "torch_version": torch.__version__, "load_average": list(os.getloadavg())}
    if torch.device(device).type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return facts


def calibrate(model_dir: str | os.PathLike[str] | None, model: ModelSpec, *, base: Hardware | str = "cpu",
              grid: Sequence[GridPoint] | None = None, repetitions: int = 6, passes: int = 2,
              dtype: str = "float32", seed: int = 0, clock: str = "wall", device: str = "cpu",
              progress: Callable[[int, int], None] | None = None,
              scatter_over_blocks: int = 0) -> tuple[list[StepTiming], Fit, dict]:
    """Measure, fit, and the calibration document (timings, fit, document).
    `model` is the spec of the checkpoint in `model_dir` (the cost model's
    view of it), or with no `model_dir` the shape timed with random weights;
    call `tune_process` first. `clock` "cpu" fits the process CPU time
    instead of the wall time: steady on a machine other work shares, and the
    same thing when torch runs one thread on an idle core."""
    before = host_facts(device)
    timings = measure_step_times(model if model_dir is None else model_dir, grid, repetitions=repetitions,
                                 passes=passes, dtype=dtype, seed=seed, device=device, progress=progress,
                                 scatter_over_blocks=scatter_over_blocks)
    shares = [t.cpu_share for t in timings if t.cpu_share is not None]
    timings = [timing.on_clock(clock) for timing in timings]
    fit = fit_efficiency(timings, model, base, dtype)
    load_before = before.pop("load_average")
    host = {**before, "load_average_before": load_before, "load_average_after": list(os.getloadavg()),
            "repetitions": repetitions, "passes": passes, "clock": clock, "device": device,
            "weights": "random" if model_dir is None else "checkpoint",
            "blocks_scattered_over": scatter_over_blocks,
            "median_cpu_share": statistics.median(shares) if shares else None}
    return timings, fit, calibration_document(timings, fit, model=model.name, dtype=dtype, host=host)


# --- the file ---------------------------------------------------------------


class CalibratedCost(NamedTuple):
    """What a CostModel needs from a calibration."""

    hardware: Hardware
    efficiency: Efficiency


@dataclass(frozen=True, slots=True)
class Calibration:
    """A calibration file, read back."""

    hardware: Hardware
    efficiency: Efficiency
    model: str
    dtype: str
    created_at_s: float  # epoch seconds
    host: dict = field(default_factory=dict)  # cpu_model, cpu_count, torch_threads, load averages
    fit: dict = field(default_factory=dict)   # median/max relative error, fitted rates
    shapes: tuple[dict, ...] = ()

    @property
    def age_s(self) -> float:
        return time.time() - self.created_at_s


def calibration_document(timings: Sequence[StepTiming], fit: Fit, *, model: str, dtype: str,
                         host: dict | None = None) -> dict:
    errors = sorted(abs(e) for e in fit.relative_errors)
    return {
        "format": FORMAT,
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "created_at_s": time.time(),
        "model": model,
        "dtype": dtype,
        "host": host or {},
        "hardware": asdict(fit.hardware),
        "efficiency": asdict(fit.efficiency),
        "fit": {
            "flops_per_s": fit.flops_per_s,
            "bytes_per_s": fit.bytes_per_s,
            "step_overhead_s": fit.efficiency.step_overhead_s,
            "attention_flops_per_s": fit.attention_flops_per_s,
            "sequence_overhead_s": fit.efficiency.sequence_overhead_s,
            "lm_head_flops_per_s": fit.lm_head_flops_per_s or fit.flops_per_s,
            "kv_bytes_per_s": fit.kv_bytes_per_s or fit.bytes_per_s,
            "prefill_chunk_overhead_s": fit.efficiency.prefill_chunk_overhead_s,
            "prefill_context_passes": fit.efficiency.prefill_context_passes,
            "linear_overlaps_weights": fit.efficiency.linear_overlaps_weights,
            "attention_overlaps_kv": fit.efficiency.attention_overlaps_kv,
            "median_relative_error": fit.median_relative_error,
            "p90_relative_error": errors[min(len(errors) - 1, math.ceil(0.9 * len(errors)) - 1)],
            "max_relative_error": fit.max_relative_error,
            "loss": "sum of squared log(fitted / measured) over the shapes",
        },
        "shapes": [
            {"kind": t.kind, "chunks": [list(chunk) for chunk in t.shape.chunks], "measured_s": t.seconds,
             "fitted_s": fitted_s, "relative_error": error, "samples_s": list(t.samples_s),
             "cpu_samples_s": list(t.cpu_samples_s)}
            for t, fitted_s, error in zip(timings, fit.fitted_s, fit.relative_errors)
        ],
    }


def describe_fit(fit: dict) -> str:
    """The fitted terms of a calibration document's "fit", in one line (older
    files lack the later terms and print their defaults)."""
    def form(overlaps: bool) -> str:
        return "hidden" if overlaps else "added"

    return (f"linears {fit['flops_per_s'] / 1e9:.1f} GFLOP/s, memory {fit['bytes_per_s'] / 1e9:.1f} GB/s "
            f"(weights' pass {form(fit.get('linear_overlaps_weights', True))}), step "
            f"{fit['step_overhead_s'] * 1e3:.2f} ms; attention "
            f"{fit.get('attention_flops_per_s', fit['flops_per_s']) / 1e9:.1f} GFLOP/s (KV reads at "
            f"{fit.get('kv_bytes_per_s', fit['bytes_per_s']) / 1e9:.1f} GB/s, "
            f"{form(fit.get('attention_overlaps_kv', True))}); LM head "
            f"{fit.get('lm_head_flops_per_s', fit['flops_per_s']) / 1e9:.1f} GFLOP/s; "
            f"{fit.get('sequence_overhead_s', 0.0) * 1e3:.3f} ms per sequence; "
            f"{fit.get('prefill_chunk_overhead_s', 0.0) * 1e3:.2f} ms per prefill chunk, its context moved "
            f"{fit.get('prefill_context_passes', 1.0):.2f} times")


def write_calibration(path: str | os.PathLike[str], document: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return path


def read_calibration(path: str | os.PathLike[str]) -> Calibration:
    """A calibration file; ValueError naming the file if it is not one."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        if document.get("format") != FORMAT:
            raise ValueError(f"format {document.get('format')!r}, expected {FORMAT!r}")
        return Calibration(
            hardware=Hardware(**document["hardware"]), efficiency=Efficiency(**document["efficiency"]),
            model=document["model"], dtype=document["dtype"], created_at_s=float(document["created_at_s"]),
            host=dict(document.get("host", {})), fit=dict(document.get("fit", {})),
            shapes=tuple(document.get("shapes", ())),
        )
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{path}: not a usable calibration file: {error}") from None


def load_calibration(path: str | os.PathLike[str]) -> CalibratedCost:
    """(Hardware, Efficiency) from a calibration file, for a CostModel:
    `CostModel(hardware, model, dtype=calibration's dtype, efficiency=efficiency)`."""
    calibration = read_calibration(path)
    return CalibratedCost(calibration.hardware, calibration.efficiency)
