from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from sluice.config import SluiceSettings
from sluice.engine.scheduler_config import SchedulerConfig


@dataclass(frozen=True, slots=True)
class DeviceDefault:
    cpu: int
    cuda: int


# Step-composition knobs whose default depends on the device (None in the
# settings means this). On CPU a step's length is what an arriving chat
# waits out before its own step, and steps have little fixed cost; a GPU
# step has more fixed cost per launch and wants bigger chunks.
DEVICE_DEFAULTS = {
    # 128 kept chats' p99/median inter-token latency at 2.3x beside
    # near-context prompts where 256 gave 3.5x.
    "long_prefill_chunk_tokens": DeviceDefault(cpu=128, cuda=512),
    # 48 kept another tenant's chats' p99 TTFT at 1.5x alone beside 8
    # resident 1,500-token requests, where 128 gave 2.3x (tiny model, 2
    # cores). On CUDA a chunk is a small part of the step's cost: the cap
    # above (0) until a GPU measurement says otherwise.
    "long_prefill_chunk_tokens_beside_chats": DeviceDefault(cpu=48, cuda=0),
    # 64 kept a flex flood's steps at ~15 ms instead of ~23 beside chats
    # (their p99 wait at the replica ~30 ms instead of ~40) for ~0.75x of
    # the batch output alone.
    "batch_prefill_tokens_beside_interactive": DeviceDefault(cpu=64, cuda=256),
    # On CUDA a 2,048-token prompt prefills within one default step, and
    # 2,048 is where the cluster scheduler's long-prompt lane starts
    # (SLUICE_LONG_PROMPT_TOKENS): at 512, chats of 0.5-2K tokens waited
    # in the one long slot behind a 32K document's chunks (Llama-3-70B on
    # 8 x H200, simulated: chats' p99 TTFT 1.9 s, 0.12 s at 2,048). On CPU
    # a 512-token prefill is already a long step.
    "long_prefill_threshold_tokens": DeviceDefault(cpu=512, cuda=2048),
    # 1 = on (see SchedulerConfig.yield_to_chats). On a GPU the host queues
    # a step's layers ahead of the device, so a check between them cuts
    # little and wastes what was queued; CPU steps run as they are issued.
    "yield_to_chats": DeviceDefault(cpu=1, cuda=0),
    # A CPU step of up to 256 tokens (decodes, small chunks) on one torch
    # thread or on all, whichever the runner measures faster per token
    # (sluice.model.small_step_threads); larger ones on all. Whole stack on 2
    # shared cores (tiny model, 64 streams, 128/128): one thread won on an
    # AVX-512 Xeon (3,023-3,548 output tok/s against 2,884-3,032), two on an
    # AVX2 EPYC (1,232-1,300 against 1,003-1,056); measured, 1,218-1,226 there.
    # A GPU step's host threads do little: off.
    "single_thread_step_tokens": DeviceDefault(cpu=256, cuda=0),
    # 1 = the model on a thread of its own, the next step planned while
    # one runs (EngineLoop's overlap). A GPU idles while the host plans,
    # prepares and applies steps one at a time: on.
    "async_scheduling": DeviceDefault(cpu=0, cuda=1),
}


class ReplicaSettings(SluiceSettings):
    # SLUICE_INTERACTIVE_PREEMPT_AFTER_S=none turns that knob off.
    model_config = SettingsConfigDict(env_parse_none_str="none")

    replica_address: str = Field("127.0.0.1:50061", description="host:port this replica's gRPC server binds")
    replica_id: str = Field("replica-0", description="stable name in metrics and placements")
    device: str = Field("cpu", description="torch device: cpu or cuda[:N]")
    dtype: str = Field("float32", pattern="^(float32|bfloat16|float16)$", description="weights and KV dtype")
    # KV capacity. Blocks win over bytes; with neither on CUDA, a fraction of
    # free device memory after the weights are loaded is used.
    kv_cache_blocks: int = Field(0, ge=0, description="KV blocks; 0 = derive from bytes")
    kv_cache_bytes: int = Field(512 * 1024 * 1024, ge=0, description="KV bytes (CPU default 512 MiB)")
    gpu_memory_fraction: float = Field(0.9, gt=0, le=1, description="share of free CUDA memory for KV")
    block_size_tokens: int = Field(16, ge=1, description="tokens per KV block")
    # 2048, as vLLM's CPU server: a burst of prompts prefills in a few large
    # steps (measured on the tiny model: p99 TTFT of a 64-prompt burst ~0.6 s
    # vs ~1.0 s at 512). A lower budget keeps inter-token latency steadier
    # while long prompts prefill, at that cost.
    max_num_batched_tokens: int = Field(2048, ge=1, description="token budget per engine step")
    max_num_seqs: int = Field(128, ge=1, description="sequences resident at once")
    # See SchedulerConfig: a recompute of batch work is cheaper than an
    # interactive TTFT that waits out a batch decode; 0.25 s lets running
    # work free room on its own first.
    interactive_preempt_after_s: float | None = Field(
        0.25, ge=0, description="an interactive request waiting this long for KV or a slot preempts batch; none = off"
    )
    # See SchedulerConfig and DEVICE_DEFAULTS. The cap applies also to a
    # prompt alone (whoever arrives waits one capped step).
    long_prefill_chunk_tokens: int | None = Field(
        None, ge=0, description="cap of one prompt's prefill chunk (ITL/TTFT bound); none = by device "
        "(DEVICE_DEFAULTS); 0 = no cap"
    )
    long_prefill_chunk_tokens_beside_chats: int | None = Field(
        None, ge=0, description="cap of a long prompt's chunk while another tenant's chats arrived within "
        "interactive_recent_s; none = by device (DEVICE_DEFAULTS); 0 = the chunk cap"
    )
    max_long_prefills_per_step: int = Field(1, ge=1, description="long prompts (see the threshold) with a chunk per step")
    long_prefill_threshold_tokens: int | None = Field(
        None, ge=0, description="a prompt with more than this to prefill is long: one of the per-step slots; "
        "none = by device (DEVICE_DEFAULTS)"
    )
    prefill_depth_scale_tokens: int | None = Field(
        None, ge=0, description="long-prompt chunks shrink with depth at this scale; none = from the model's "
        "shape, 0 = chunk size independent of depth"
    )
    batch_prefill_tokens_beside_interactive: int | None = Field(
        None, ge=0, description="batch prefill tokens per step while interactive work is live; none = by "
        "device (DEVICE_DEFAULTS); 0 = no cap"
    )
    interactive_recent_s: float = Field(
        1.0, ge=0, description="interactive work stays live this long after an arrival (batch steps kept short)"
    )
    yield_to_chats: bool | None = Field(
        None, description="a step that is mostly batch work (or another tenant's long prompt) is given "
        "up part-way for a chat arriving meanwhile; none = by device (DEVICE_DEFAULTS)"
    )
    state_interval_s: float = Field(0.25, gt=0, description="how often WatchState reports")
    canary_interval_s: float = Field(5.0, gt=0, description="how often the readiness canary runs")
    canary_timeout_s: float = Field(10.0, gt=0, description="a canary slower than this marks the replica wedged")
    torch_threads: int = Field(0, ge=0, description="torch intra-op threads; 0 = torch's default")
    single_thread_step_tokens: int | None = Field(
        None, ge=0, description="steps of at most this many tokens run on one torch thread or on torch_threads, "
        "whichever is measured faster; larger ones on torch_threads; none = by device (DEVICE_DEFAULTS); 0 = every "
        "step on torch_threads"
    )
    async_scheduling: bool | None = Field(
        None, description="plan and prepare the next engine step while one runs, the model on a thread of "
        "its own; none = by device (DEVICE_DEFAULTS)"
    )
    # Which linear implementation float32 on CPU runs, per layer shape:
    # "auto" times MKL (torch's F.linear), MKL on a weight stored transposed
    # and oneDNN packed weights on this machine at start-up (under a second
    # for a small model) and keeps the answer in cpu_probe_cache_dir for the
    # next start on the same machine; "onednn"/"transposed"/"torch" force
    # one (sluice.model.cpu_fast_path).
    cpu_linears: Literal["auto", "onednn", "transposed", "torch"] = "auto"
    cpu_probe_cache_dir: str = Field(default_factory=lambda: str(Path.home() / ".cache" / "sluice"),
                                     description="where the CPU linear probe is cached ('' = never)")
    # The widest instruction set the native CPU kernels may use
    # (sluice.kernels.cpu_isa): "auto" is this CPU's widest; "avx2" serves
    # as an AVX2-only CPU would (with ATEN_CPU_CAPABILITY=avx2,
    # MKL_ENABLE_INSTRUCTIONS=AVX2 and ONEDNN_MAX_CPU_ISA=AVX2 for torch).
    cpu_isa: Literal["auto", "avx512", "avx2", "baseline"] = "auto"
    # The model thread and the event loop (gRPC, each step's token batch)
    # share the GIL; a thread that wants it waits up to this long for the
    # holder to let go. CPython's 5 ms is most of a small model's step on a
    # CPU: at 0.5 ms the model thread stops waiting behind the loop's burst
    # of work after each step (whole stack on 2 cores: ~+4% output tok/s,
    # bench/profile_stack.py).
    gil_switch_interval_s: float = Field(0.0005, gt=0, le=0.1,
                                         description="sys.setswitchinterval for the replica process")

    def for_device(self, name: str) -> int:
        """A knob of DEVICE_DEFAULTS: its set value, else this device's default
        (a flag's as 0 or 1)."""
        value = getattr(self, name)
        if value is not None:
            return value
        default = DEVICE_DEFAULTS[name]
        return default.cpu if self.device == "cpu" else default.cuda

    def scheduler_config(self, *, max_model_len_tokens: int, model_depth_scale_tokens: int) -> SchedulerConfig:
        """The engine's SchedulerConfig from these settings, for a model of
        `max_model_len_tokens` whose attention-vs-linears depth is
        `model_depth_scale_tokens` (what an unset prefill_depth_scale_tokens
        means). The replica builds its engine with it; the simulator's
        fidelity bench builds the replica it simulates with it."""
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len_tokens=max_model_len_tokens,
            interactive_preempt_after_s=self.interactive_preempt_after_s,
            long_prefill_chunk_tokens=self.for_device("long_prefill_chunk_tokens"),
            long_prefill_chunk_tokens_beside_chats=self.for_device("long_prefill_chunk_tokens_beside_chats"),
            max_long_prefills_per_step=self.max_long_prefills_per_step,
            long_prefill_threshold_tokens=self.for_device("long_prefill_threshold_tokens"),
            prefill_depth_scale_tokens=(model_depth_scale_tokens if self.prefill_depth_scale_tokens is None
                                        else self.prefill_depth_scale_tokens),
            batch_prefill_tokens_beside_interactive=self.for_device("batch_prefill_tokens_beside_interactive"),
            interactive_recent_s=self.interactive_recent_s,
            yield_to_chats=bool(self.for_device("yield_to_chats")),
        )
