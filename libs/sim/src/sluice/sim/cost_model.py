"""How long one engine iteration takes, from first principles.

A step runs every layer once over all the tokens scheduled in it (decodes
and prefill chunks alike), then the lm head over one token per sequence.
Each group of kernels costs its roofline: the larger of its FLOPs over the
achievable compute rate and its bytes over the achievable bandwidth. All
layers are identical, so a layer is costed once and multiplied.

    per layer, per GPU of a tensor-parallel group of tp:
      linears    max(2 x linear params x tokens / tp          / (peak x compute eff),
                     layer weights / tp                       / (bandwidth x bw eff))
      attention  max(4 x heads x head_dim x attended pairs / tp / (peak x attention eff),
                     KV bytes read and written                  / (bandwidth x bw eff))
                 (or the sum of the two, where the kernel does not overlap them)
      all-reduce 2 x ring(tokens x hidden x activation bytes)           (tp > 1 only)
    once:
      lm head    max(2 x hidden x vocab x sequences / tp / (...), head weights / tp / (...))
      overhead   step_overhead_s (launches, sampling, the scheduler's own turn)
                 + sequence_overhead_s x sequences (0 unless calibrated)

The attention efficiency is the compute efficiency unless set apart (a CPU
calibration fits it apart: there attention runs at a fraction of the
GEMMs' FLOP/s).

Linears and attention are separate kernels, so each is bound by its own
resource: a mixed step's linears are compute-bound by the prefill chunk while
its decodes' attention is bandwidth-bound on their KV, and the two add
rather than hide each other. Activation traffic (a layer's inputs and
outputs) is left out: it is small beside the weights at decode and the step
is compute-bound when it is not.

A chunk of n new tokens after c cached ones (a decode is n = 1):

    attended pairs  n x c + n x (n + 1) / 2    (causal: new token i sees c + i + 1 keys)
    attention FLOPs 4 x pairs x heads x head_dim per layer (2 for Q.K^T, 2 for P.V)
    KV moved        (c + n) tokens read + n written, x 2 x kv_heads x head_dim x kv bytes

A ring all-reduce of B bytes over tp GPUs sends 2 x (tp - 1) / tp x B per GPU
in 2 x (tp - 1) hops, each paying the link latency.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

from sluice.sim.hardware import GIB_BYTES, Hardware
from sluice.sim.model_spec import ModelSpec, dtype_bytes

# The replica's KV budget on CUDA (ReplicaSettings.gpu_memory_fraction): 90%
# of the memory still free once the weights are loaded; the other 10% is the
# headroom for activations, the sampler's logits and the allocator's slack.
KV_MEMORY_FRACTION = 0.9
# The CUDA context, cuBLAS workspaces and NCCL buffers, already gone from
# "free" by the time the replica measures it.
RUNTIME_RESERVE_BYTES = 1 * GIB_BYTES


@dataclass(frozen=True, slots=True)
class StepShape:
    """What one engine step computes: a `(num_tokens, context_before_tokens)`
    chunk per scheduled sequence. A decode is `(1, position)`; a prefill
    chunk is `(n, start_position)`, where start_position counts prompt tokens
    already in the KV cache (earlier chunks, prefix-cache hits)."""

    chunks: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        for num_tokens, context_before_tokens in self.chunks:
            if num_tokens < 1 or context_before_tokens < 0:
                chunk = (num_tokens, context_before_tokens)
                raise ValueError(f"a chunk needs >= 1 token and >= 0 context, got {chunk}")

    @classmethod
    def of(cls, chunks: Iterable[tuple[int, int]]) -> "StepShape":
        # map(tuple, ...) returns tuples as they are, so building a step's shape stays cheap.
        return cls(tuple(map(tuple, chunks)))

    @property
    def num_tokens(self) -> int:
        return sum(num_tokens for num_tokens, _ in self.chunks)

    @property
    def num_sequences(self) -> int:
        return len(self.chunks)


@dataclass(frozen=True, slots=True)
class Efficiency:
    """Achievable / peak for each resource, and the fixed cost of a step.
    Defaults are typical of a tuned Hopper serving stack; `sluice sim
    calibrate` fits them to measured step timings."""

    # Large bf16 GEMMs reach 60-75% of peak; attention and small-batch GEMMs less.
    compute: float = 0.5
    # Weight streaming at decode reaches ~80-90% of HBM peak.
    bandwidth: float = 0.8
    # NCCL bus bandwidth on NVLink 4 peaks near 75% of the link rate.
    link: float = 0.7
    # Kernel launches, sampling, input preparation and scheduling per step.
    step_overhead_s: float = 0.0015
    # Attention's own compute efficiency (its Q.K^T and P.V); None = `compute`.
    # A CPU's attention kernel runs at a fraction of its GEMMs' FLOP/s (short
    # dot products over scattered KV blocks); a calibration fits it apart.
    attention_compute: float | None = None
    # The LM head's own compute efficiency; None = `compute`. The CPU
    # replica's greedy steps screen the head in bfloat16 (AMX or AVX512-BF16
    # where the CPU has them) and recompute only a few candidates exactly,
    # so per row it runs several times the float32 layers' FLOP/s.
    lm_head_compute: float | None = None
    # The KV cache reads' own bandwidth efficiency; None = `bandwidth`. A
    # paged cache is read a block at a time from wherever each block lies:
    # on a CPU, once a replica's prefix cache has cycled through its pool
    # and hands out blocks from anywhere, those reads run at a fraction of
    # the rate at which the weights stream.
    kv_bandwidth: float | None = None
    # Per sequence in a step: its share of input preparation, the attention
    # call over its blocks, sampling and the output it hands back. 0 in the
    # GPU presets (batched there); a CPU calibration measures ~0.1 ms.
    sequence_overhead_s: float = 0.0
    # Whether attention's arithmetic hides its KV reads (a GPU kernel streams
    # the next tiles while it computes: the larger of the two) or waits for
    # them (the CPU kernel: the two add; its calibration fits better so).
    attention_overlaps_kv: bool = True
    # Whether a linear layer's arithmetic hides its weight reads (a GPU GEMM
    # at batch 1 is bandwidth-bound, at batch 512 compute-bound: the larger
    # of the two) or the two add (the CPU: its packed GEMMs stream the
    # weights through the core that multiplies them, and a step of 1 token
    # costs the weights' pass, 64 tokens that pass plus 64 tokens' work).
    # The same for the LM head.
    linear_overlaps_weights: bool = True
    # Per prefill chunk (a sequence with more than one token in the step):
    # the attention call it gets to itself, beside the decodes' one batched
    # call. 0 in the GPU presets (one varlen kernel serves the whole mixed
    # batch); the CPU's per-chunk gather and masked SDPA measure ~0.7 ms.
    prefill_chunk_overhead_s: float = 0.0
    # How many times a prefill chunk's cached context crosses memory: 1 for
    # a kernel that reads the pages in place (decode everywhere, the GPU's
    # prefill), ~3 for the CPU path that first gathers the pages into one
    # tensor (read, write, read again).
    prefill_context_passes: float = 1.0

    def __post_init__(self) -> None:
        if self.prefill_chunk_overhead_s < 0 or self.prefill_context_passes < 1:
            raise ValueError(f"prefill_chunk_overhead_s must be >= 0 and prefill_context_passes >= 1, got "
                             f"{self.prefill_chunk_overhead_s}, {self.prefill_context_passes}")
        for field_name in ("compute", "bandwidth", "link", "attention_compute", "lm_head_compute", "kv_bandwidth"):
            value = getattr(self, field_name)
            if value is not None and not 0 < value <= 1:  # only the last three may be None
                # Above 1 means the hardware's peak is understated: raise the peak instead,
                # or no step would respect the roofline.
                raise ValueError(f"efficiency {field_name} must be in (0, 1], got {value}")
        if self.step_overhead_s < 0 or self.sequence_overhead_s < 0:
            raise ValueError(f"step_overhead_s and sequence_overhead_s must be >= 0, got {self.step_overhead_s}, "
                             f"{self.sequence_overhead_s}")


PEAK = Efficiency(compute=1.0, bandwidth=1.0, link=1.0, step_overhead_s=0.0)


@dataclass(frozen=True, slots=True)
class StepTimeBreakdown:
    """Where a step's time goes, summed over all layers."""

    linear_s: float
    attention_s: float
    lm_head_s: float
    all_reduce_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.lm_head_s + self.all_reduce_s + self.overhead_s


class _StepRates(NamedTuple):
    """Per-GPU seconds per unit of work at one efficiency, so a step's cost
    is a few multiplies. A NamedTuple because the hot path unpacks it."""

    linear_s_per_token: float
    layer_weights_s: float
    attention_s_per_pair: float
    kv_s_per_token_moved: float
    lm_head_s_per_sequence: float
    lm_head_weights_s: float
    all_reduce_s_per_token: float  # all layers
    all_reduce_fixed_s: float  # all layers: the hops' latency
    overhead_s: float
    overhead_s_per_sequence: float
    attention_overlaps_kv: bool
    linear_overlaps_weights: bool
    overhead_s_per_prefill_chunk: float
    kv_s_per_prefill_context_token_again: float  # each pass past the first


@dataclass(frozen=True, slots=True)
class CostModel:
    """One replica: `tp` GPUs of `hardware` serving `model`, weights in
    `dtype`, KV cache in `kv_dtype` (default: the weights' dtype).
    `activation_reserve_bytes` is per GPU; see `reserve_bytes_per_gpu`."""

    hardware: Hardware
    model: ModelSpec
    tp: int = 1
    dtype: str = "bf16"
    kv_dtype: str | None = None
    efficiency: Efficiency = Efficiency()
    activation_reserve_bytes: int | None = None
    # Derived in __post_init__ and never written again.
    _rates: _StepRates = field(init=False, repr=False, compare=False)
    _peak_rates: _StepRates = field(init=False, repr=False, compare=False)
    _kv_heads_per_gpu: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        model, tp = self.model, self.tp
        if tp < 1 or model.num_attention_heads % tp:
            raise ValueError(f"tp={tp} must be >= 1 and divide {model.name}'s {model.num_attention_heads} heads")
        # Past kv_heads GPUs, each KV head is replicated rather than split.
        if tp <= model.num_kv_heads:
            if model.num_kv_heads % tp:
                raise ValueError(f"tp={tp} does not divide {model.name}'s {model.num_kv_heads} KV heads")
            kv_heads_per_gpu = model.num_kv_heads // tp
        elif tp % model.num_kv_heads:
            raise ValueError(f"tp={tp} is not a multiple of {model.name}'s {model.num_kv_heads} KV heads")
        else:
            kv_heads_per_gpu = 1
        dtype_bytes(self.dtype)  # unknown names fail here, at construction
        dtype_bytes(self.kv_cache_dtype)
        if self.activation_reserve_bytes is not None and self.activation_reserve_bytes < 0:
            raise ValueError(f"activation_reserve_bytes must be >= 0, got {self.activation_reserve_bytes}")
        object.__setattr__(self, "_kv_heads_per_gpu", kv_heads_per_gpu)
        object.__setattr__(self, "_rates", self._step_rates(self.efficiency))
        object.__setattr__(self, "_peak_rates", self._step_rates(PEAK))

    @property
    def kv_cache_dtype(self) -> str:
        return self.kv_dtype or self.dtype

    @property
    def activation_dtype_bytes(self) -> int:
        # fp8 checkpoints still compute and all-reduce activations in bf16.
        return max(dtype_bytes(self.dtype), 2)

    def kv_bytes_per_token_per_gpu(self) -> int:
        model = self.model
        return 2 * model.num_layers * self._kv_heads_per_gpu * model.head_dim * dtype_bytes(self.kv_cache_dtype)

    def weight_bytes_per_gpu(self) -> int:
        # Every matrix, the embedding and lm head included, is split over tp
        # (vocab-parallel for those two); the replicated norms are too small to count.
        return -(-self.model.weight_bytes(self.dtype) // self.tp)

    def _step_rates(self, efficiency: Efficiency) -> _StepRates:
        model, tp = self.model, self.tp
        flops_per_s = self.hardware.peak_flops_per_s * efficiency.compute
        attention_compute = efficiency.compute if efficiency.attention_compute is None else efficiency.attention_compute
        attention_flops_per_s = self.hardware.peak_flops_per_s * attention_compute
        lm_head_compute = efficiency.compute if efficiency.lm_head_compute is None else efficiency.lm_head_compute
        lm_head_flops_per_s = self.hardware.peak_flops_per_s * lm_head_compute
        bytes_per_s = self.hardware.hbm_bandwidth_bytes_per_s * efficiency.bandwidth
        kv_bandwidth = efficiency.bandwidth if efficiency.kv_bandwidth is None else efficiency.kv_bandwidth
        kv_bytes_per_s = self.hardware.hbm_bandwidth_bytes_per_s * kv_bandwidth
        weight_bytes = dtype_bytes(self.dtype)
        norm_params = 2 * model.hidden_size
        linear_params = model.parameters_per_layer() - norm_params
        kv_bytes_per_token_per_layer = 2 * self._kv_heads_per_gpu * model.head_dim * dtype_bytes(self.kv_cache_dtype)
        head_params = model.lm_head_parameters() + model.hidden_size  # and the final norm

        all_reduce_s_per_token = all_reduce_fixed_s = 0.0
        if tp > 1:
            link_bytes_per_s = self.hardware.link_bandwidth_bytes_per_s * efficiency.link
            # After attention's o_proj and the MLP's down_proj. The vocab-parallel
            # embedding's all-reduce and the logits' gather, once a step, are left out.
            all_reduces = 2 * model.num_layers
            message_bytes_per_token = model.hidden_size * self.activation_dtype_bytes
            all_reduce_s_per_token = all_reduces * 2 * (tp - 1) / tp * message_bytes_per_token / link_bytes_per_s
            all_reduce_fixed_s = all_reduces * 2 * (tp - 1) * self.hardware.link_latency_s

        return _StepRates(
            linear_s_per_token=2 * linear_params / tp / flops_per_s,
            layer_weights_s=model.parameters_per_layer() * weight_bytes / tp / bytes_per_s,
            attention_s_per_pair=4 * model.q_dim / tp / attention_flops_per_s,
            kv_s_per_token_moved=kv_bytes_per_token_per_layer / kv_bytes_per_s,
            lm_head_s_per_sequence=2 * model.lm_head_parameters() / tp / lm_head_flops_per_s,
            lm_head_weights_s=head_params * weight_bytes / tp / bytes_per_s,
            all_reduce_s_per_token=all_reduce_s_per_token,
            all_reduce_fixed_s=all_reduce_fixed_s,
            overhead_s=efficiency.step_overhead_s,
            overhead_s_per_sequence=efficiency.sequence_overhead_s,
            attention_overlaps_kv=efficiency.attention_overlaps_kv,
            linear_overlaps_weights=efficiency.linear_overlaps_weights,
            overhead_s_per_prefill_chunk=efficiency.prefill_chunk_overhead_s,
            kv_s_per_prefill_context_token_again=(efficiency.prefill_context_passes - 1)
            * kv_bytes_per_token_per_layer / kv_bytes_per_s,
        )

    def step_time_s(self, shape: StepShape) -> float:
        """Seconds one engine step of `shape` takes; 0 for an empty step."""
        return _step_time_s(self._rates, self.model.num_layers, shape.chunks)

    def roofline_floor_s(self, shape: StepShape) -> float:
        """The same step at 100% of every peak with no overhead: no step is faster."""
        return _step_time_s(self._peak_rates, self.model.num_layers, shape.chunks)

    def step_breakdown(self, shape: StepShape) -> StepTimeBreakdown:
        """`step_time_s` split by kernel group (slower; for reports and tests)."""
        if not shape.chunks:
            return StepTimeBreakdown(0.0, 0.0, 0.0, 0.0, 0.0)
        rates, layers = self._rates, self.model.num_layers
        tokens = shape.num_tokens
        pairs = sum(attended_pairs(num_tokens, context) for num_tokens, context in shape.chunks)
        kv_moved = sum(context + 2 * num_tokens for num_tokens, context in shape.chunks)
        prefills = [context for num_tokens, context in shape.chunks if num_tokens > 1]
        compute_s = pairs * rates.attention_s_per_pair
        kv_s = kv_moved * rates.kv_s_per_token_moved + sum(prefills) * rates.kv_s_per_prefill_context_token_again
        combine = max if rates.linear_overlaps_weights else _add
        return StepTimeBreakdown(
            linear_s=layers * combine(tokens * rates.linear_s_per_token, rates.layer_weights_s),
            attention_s=layers * (max(compute_s, kv_s) if rates.attention_overlaps_kv else compute_s + kv_s),
            lm_head_s=combine(len(shape.chunks) * rates.lm_head_s_per_sequence, rates.lm_head_weights_s),
            all_reduce_s=tokens * rates.all_reduce_s_per_token + rates.all_reduce_fixed_s,
            overhead_s=rates.overhead_s + len(shape.chunks) * rates.overhead_s_per_sequence
            + len(prefills) * rates.overhead_s_per_prefill_chunk,
        )

    def linear_flops(self, num_tokens: int) -> float:
        """FLOPs of every layer's q/k/v/o and MLP matmuls over `num_tokens`, whole TP group."""
        linear_params = self.model.parameters_per_layer() - 2 * self.model.hidden_size
        return 2.0 * linear_params * num_tokens * self.model.num_layers

    def attention_flops(self, num_tokens: int, context_before_tokens: int = 0) -> float:
        """FLOPs of every layer's Q.K^T and P.V for one chunk, whole TP group."""
        pairs = attended_pairs(num_tokens, context_before_tokens)
        return 4.0 * self.model.q_dim * pairs * self.model.num_layers

    def lm_head_flops(self, num_sequences: int = 1) -> float:
        return 2.0 * self.model.lm_head_parameters() * num_sequences

    def prefill_flops(self, prompt_tokens: int) -> float:
        """FLOPs of a whole prompt prefilled in one chunk from position 0,
        sampling its first output token."""
        if prompt_tokens < 1:
            return 0.0
        return self.linear_flops(prompt_tokens) + self.attention_flops(prompt_tokens) + self.lm_head_flops()

    def ideal_prefill_s(self, prompt_tokens: int) -> float:
        """The compute bound on a prompt's prefill: its FLOPs at the TP group's peak."""
        return self.prefill_flops(prompt_tokens) / (self.hardware.peak_flops_per_s * self.tp)

    def decode_floor_s(self, batch_size: int = 1, context_tokens: int = 0) -> float:
        """The bandwidth bound on a decode step of `batch_size` sequences at
        `context_tokens` each: every weight but the embedding table (only
        looked up) and each sequence's KV, read once at the HBM peak."""
        if batch_size < 1:
            return 0.0
        rates = self._peak_rates
        weights_s = self.model.num_layers * rates.layer_weights_s + rates.lm_head_weights_s
        kv_moved = batch_size * (context_tokens + 2)
        return weights_s + self.model.num_layers * kv_moved * rates.kv_s_per_token_moved

    def reserve_bytes_per_gpu(self) -> int:
        """Memory per GPU that is neither weights nor KV. Given, or else what
        the replica leaves: the runtime's own gigabyte plus the 10% of the
        rest that `KV_MEMORY_FRACTION` keeps back for activations."""
        if self.activation_reserve_bytes is not None:
            return self.activation_reserve_bytes
        free_after_runtime = self.hardware.memory_bytes - self.weight_bytes_per_gpu() - RUNTIME_RESERVE_BYTES
        return RUNTIME_RESERVE_BYTES + int(max(free_after_runtime, 0) * (1 - KV_MEMORY_FRACTION))

    def kv_capacity_blocks(self, block_size_tokens: int = 16) -> int:
        """Whole KV blocks the replica holds; ValueError where the weights do not fit."""
        if block_size_tokens < 1:
            raise ValueError(f"block_size_tokens must be >= 1, got {block_size_tokens}")
        weights, reserve = self.weight_bytes_per_gpu(), self.reserve_bytes_per_gpu()
        kv_budget_bytes = self.hardware.memory_bytes - weights - reserve
        block_bytes = self.kv_bytes_per_token_per_gpu() * block_size_tokens
        if kv_budget_bytes < block_bytes:
            raise ValueError(
                f"{self.model.name} in {self.dtype} does not fit on {self.tp}×{self.hardware.name}: needs "
                f"{weights / GIB_BYTES:.1f} GiB of weights + {reserve / GIB_BYTES:.1f} GiB reserve per GPU "
                f"and room for a KV block, has {self.hardware.memory_bytes / GIB_BYTES:.1f} GiB"
            )
        return kv_budget_bytes // block_bytes

    def kv_capacity_tokens(self, block_size_tokens: int = 16) -> int:
        """Tokens of KV the replica holds, in whole blocks (a partial block is unusable)."""
        return self.kv_capacity_blocks(block_size_tokens) * block_size_tokens


def attended_pairs(num_tokens: int, context_before_tokens: int) -> int:
    """(query, key) pairs of a causal chunk: new token i sees c + i + 1 keys."""
    return num_tokens * context_before_tokens + num_tokens * (num_tokens + 1) // 2


def _add(a: float, b: float) -> float:
    return a + b


def _step_time_s(rates: _StepRates, num_layers: int, chunks: tuple[tuple[int, int], ...]) -> float:
    if not chunks:
        return 0.0
    (linear_s_per_token, layer_weights_s, attention_s_per_pair, kv_s_per_token_moved, lm_head_s_per_sequence,
     lm_head_weights_s, all_reduce_s_per_token, all_reduce_fixed_s, overhead_s, overhead_s_per_sequence,
     attention_overlaps_kv, linear_overlaps_weights, overhead_s_per_prefill_chunk,
     kv_s_per_prefill_context_token_again) = rates
    # One pass. Twice the pairs, so it stays an integer: sum of n x (2c + n + 1).
    tokens = context = double_pairs = prefill_chunks = prefill_context = 0
    for num_tokens, context_before_tokens in chunks:
        tokens += num_tokens
        context += context_before_tokens
        double_pairs += num_tokens * (2 * context_before_tokens + num_tokens + 1)
        if num_tokens > 1:  # a prefill chunk: the kernels tell them by their query length too
            prefill_chunks += 1
            prefill_context += context_before_tokens
    linear_s = tokens * linear_s_per_token
    lm_head_s = len(chunks) * lm_head_s_per_sequence
    if not linear_overlaps_weights:
        linear_s += layer_weights_s
        lm_head_s += lm_head_weights_s
    else:
        if linear_s < layer_weights_s:
            linear_s = layer_weights_s
        if lm_head_s < lm_head_weights_s:
            lm_head_s = lm_head_weights_s
    attention_s = double_pairs * 0.5 * attention_s_per_pair
    kv_s = (context + 2 * tokens) * kv_s_per_token_moved + prefill_context * kv_s_per_prefill_context_token_again
    if not attention_overlaps_kv:
        attention_s += kv_s
    elif attention_s < kv_s:
        attention_s = kv_s
    return (num_layers * (linear_s + attention_s) + lm_head_s
            + tokens * all_reduce_s_per_token + all_reduce_fixed_s + overhead_s
            + len(chunks) * overhead_s_per_sequence + prefill_chunks * overhead_s_per_prefill_chunk)
