"""The policies a simulation can run, each built from the production
policy objects' own configs (nothing here branches inside them):

    sluice           the deployed defaults: chunked prefill capped per step
                     and by depth, interactive before batch, VTC fairness
                     across tenants, KV admission with early refusal at
                     the SLO, overload stages
    fcfs-no-chunk    the classic baseline: one queue in arrival order (one
                     tenant, one class for the scheduler), whole prompts
                     prefilled in one step, no early refusal, no stages
    chunked-unfair   chunked prefill as Sluice does it, but one queue in
                     arrival order and no early refusal or stages
    no-kv-admission  Sluice's policy, except the scheduler believes every
                     replica has far more KV than it has: requests are
                     dispatched at once and wait (and get preempted) inside
                     the replicas, as in a router without KV admission
"""

from dataclasses import dataclass, replace

from sluice.admission.overload import OverloadPolicy
from sluice.engine.scheduler_config import SchedulerConfig
from sluice.placement.config import ClassPolicy, OverloadLevers, PlacementConfig

from sluice.sim.model_spec import ModelSpec

POLICIES = ("sluice", "fcfs-no-chunk", "chunked-unfair", "no-kv-admission")
# A queue that never refuses and never times out a request (the baselines).
UNBOUNDED = ClassPolicy(ttft_slo_s=1e9, max_queue_wait_s=1e9, max_queue_length=10_000_000)
NO_STAGES = OverloadLevers(policy=OverloadPolicy(enabled=False), critical_kv_reserve_share=0.0, critical_queue_slots=0)


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    engine: SchedulerConfig
    placement: PlacementConfig
    single_tenant: bool = False  # the scheduler sees one tenant: VTC is arrival order
    single_class: bool = False   # every request interactive: no class priority
    reported_kv_factor: float = 1.0


def prefill_depth_scale_tokens(model: ModelSpec) -> int:
    """The depth at which a token's attention costs as much as its linear
    layers (the replica derives it the same way from the model's shape):
    per layer, linears take 2 x params FLOPs per token, attention about
    4 x depth x heads x head_dim."""
    per_layer_params = (
        model.hidden_size * model.num_attention_heads * model.head_dim * 2
        + model.hidden_size * model.num_kv_heads * model.head_dim * 2
        + 3 * model.hidden_size * model.intermediate_size
    )
    return max(1, per_layer_params // (2 * model.num_attention_heads * model.head_dim))


def gpu_engine_config(model: ModelSpec, max_num_seqs: int = 256) -> SchedulerConfig:
    """The replica's settings on CUDA (services/replica DEVICE_DEFAULTS and
    settings defaults): a 2,048-token step, prompts over 2,048 tokens long,
    512-token long-prefill chunks scaled by depth, 256 batch prefill tokens
    beside interactive work."""
    return SchedulerConfig(
        max_num_batched_tokens=2048, max_num_seqs=max_num_seqs, max_model_len_tokens=model.max_context_tokens,
        interactive_preempt_after_s=0.25, long_prefill_chunk_tokens=512, max_long_prefills_per_step=1,
        long_prefill_threshold_tokens=2048, prefill_depth_scale_tokens=prefill_depth_scale_tokens(model),
        batch_prefill_tokens_beside_interactive=256, interactive_recent_s=1.0,
    )


def cpu_engine_config(model: ModelSpec, max_num_seqs: int = 128) -> SchedulerConfig:
    """The replica's settings on CPU (DEVICE_DEFAULTS): prompts over 512
    tokens long, 128-token long-prefill chunks (48 while another tenant's
    chats are live), 64 batch prefill tokens beside interactive work, and
    steps that give way to chats."""
    return replace(
        gpu_engine_config(model, max_num_seqs), long_prefill_chunk_tokens=128, batch_prefill_tokens_beside_interactive=64,
        long_prefill_threshold_tokens=512, long_prefill_chunk_tokens_beside_chats=48, yield_to_chats=True)


def slo_placement(ttft_slo_s: float, batch_ttft_slo_s: float) -> PlacementConfig:
    """The deployed placement with interactive admission at `ttft_slo_s`
    (a queued request leaving after ten times that) and batch at its own."""
    interactive = ClassPolicy(ttft_slo_s=ttft_slo_s, max_queue_wait_s=10.0 * ttft_slo_s, max_queue_length=1024)
    return PlacementConfig(interactive=interactive, batch=replace(PlacementConfig().batch, ttft_slo_s=batch_ttft_slo_s))


def build_policy(name: str, engine: SchedulerConfig, placement: PlacementConfig) -> Policy:
    """`engine` and `placement` are Sluice's; the baselines are derived from them."""
    if name == "sluice":
        return Policy(name, engine, placement)
    fcfs = replace(placement, interactive=UNBOUNDED, batch=UNBOUNDED, overload=NO_STAGES)
    if name == "fcfs-no-chunk":
        whole = replace(
            engine, max_num_batched_tokens=max(engine.max_num_batched_tokens, engine.max_model_len_tokens),
            long_prefill_chunk_tokens=0, prefill_depth_scale_tokens=0, batch_prefill_tokens_beside_interactive=0,
            interactive_preempt_after_s=None, interactive_recent_s=0.0,
        )
        return Policy(name, whole, fcfs, single_tenant=True, single_class=True)
    if name == "chunked-unfair":
        return Policy(name, engine, fcfs, single_tenant=True, single_class=True)
    if name == "no-kv-admission":
        return Policy(name, engine, placement, reported_kv_factor=1000.0)
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")
