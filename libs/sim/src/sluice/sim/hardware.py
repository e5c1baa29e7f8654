"""What one accelerator offers the cost model: memory, bandwidth, compute, links.

Peak numbers are the vendor's (dense, no sparsity); what a real kernel
achieves is a fraction of them, and that fraction lives in the cost model's
`Efficiency`, not here, so a preset stays a datasheet line anyone can check.

Memory is the total the driver reports (`nvidia-smi`, `torch.cuda.
mem_get_info`), because that is what a serving engine's memory fraction is
taken of. NVIDIA's "80 GB" and "141 GB" are neither exact GB nor exact GiB:
an H100 SXM reports 81,559 MiB (79.6 GiB, 85.5e9 B) and an H200 143,771 MiB
(140.4 GiB, 150.8e9 B).

The `cpu` preset is the local CPU as measured, not as specified: a modest
default whose efficiency terms `sluice sim calibrate` replaces with ones
fitted to real step timings on this machine (see the note at `CPU`).
"""

from dataclasses import dataclass

MIB_BYTES = 1024**2
GIB_BYTES = 1024**3


@dataclass(frozen=True, slots=True)
class Hardware:
    """One accelerator of a tensor-parallel group; a TP group is `tp` of these."""

    name: str
    memory_bytes: int
    hbm_bandwidth_bytes_per_s: float
    # Dense bf16 tensor-core peak, the dtype serving runs its matmuls in. fp8
    # checkpoints are not credited with Hopper's doubled fp8 rate: their gain
    # modelled is the halved weight and KV traffic, which is what decode feels.
    peak_flops_per_s: float
    # Per direction, between two GPUs of one tensor-parallel group.
    link_bandwidth_bytes_per_s: float
    # One hop of a collective: the cost every ring step pays however small its message.
    link_latency_s: float
    # A default on-demand price of one of these for an hour; the capacity
    # planner's caller overrides it with what they actually pay.
    price_per_hour: float = 0.0

    def __post_init__(self) -> None:
        if self.memory_bytes < 1:
            raise ValueError(f"{self.name}: memory_bytes must be >= 1, got {self.memory_bytes}")
        rates = {
            "hbm_bandwidth_bytes_per_s": self.hbm_bandwidth_bytes_per_s,
            "peak_flops_per_s": self.peak_flops_per_s,
            "link_bandwidth_bytes_per_s": self.link_bandwidth_bytes_per_s,
        }
        for field_name, value in rates.items():
            if not value > 0:
                raise ValueError(f"{self.name}: {field_name} must be > 0, got {value}")
        if self.link_latency_s < 0 or self.price_per_hour < 0:
            raise ValueError(f"{self.name}: link_latency_s and price_per_hour must be >= 0")


# NVLink 4 on HGX Hopper: 18 links x 25 GB/s per direction = 450 GB/s each way
# (the "900 GB/s" on the datasheet counts both directions).
_NVLINK4_BYTES_PER_S = 450e9
# Per ring hop. NCCL's small-message all-reduce on 8 NVLink GPUs takes some
# 15-25 us end to end; the ring formula charges 2 x (tp - 1) = 14 hops, so
# ~1.5 us a hop reproduces it.
_NVLINK_HOP_LATENCY_S = 1.5e-6

H100 = Hardware(
    name="h100",
    memory_bytes=81_559 * MIB_BYTES,
    hbm_bandwidth_bytes_per_s=3.35e12,
    peak_flops_per_s=989e12,
    link_bandwidth_bytes_per_s=_NVLINK4_BYTES_PER_S,
    link_latency_s=_NVLINK_HOP_LATENCY_S,
    # Rough 2025 on-demand market rate per GPU-hour; a default, not a quote.
    price_per_hour=2.50,
)

# Same GH100 die and NVLink as the H100; only the HBM3e stacks differ.
H200 = Hardware(
    name="h200",
    memory_bytes=143_771 * MIB_BYTES,
    hbm_bandwidth_bytes_per_s=4.8e12,
    peak_flops_per_s=989e12,
    link_bandwidth_bytes_per_s=_NVLINK4_BYTES_PER_S,
    link_latency_s=_NVLINK_HOP_LATENCY_S,
    price_per_hour=3.50,
)

# The local CPU, as the dev stack's replica runs the tiny model on it. A
# deliberately modest default (a few-core desktop: 24 GiB, ~20 GB/s of DRAM
# bandwidth, ~0.5 TFLOP/s of fp32 SIMD) rather than this machine's real RAM
# or core count: presets stay pure and never read the host. `sluice sim
# calibrate` times real engine steps here and replaces the cost model's
# `Efficiency` terms with fitted ones, which is what makes a CPU simulation
# match this machine; these peaks only fix the scale the fit is relative to.
# There is no tensor parallelism on CPU; the link terms are shared-memory
# copies, there only so a tp > 1 model stays well defined.
CPU = Hardware(
    name="cpu",
    memory_bytes=24 * GIB_BYTES,
    hbm_bandwidth_bytes_per_s=20e9,
    peak_flops_per_s=0.5e12,
    link_bandwidth_bytes_per_s=10e9,
    link_latency_s=10e-6,
    # The local machine is already paid for.
    price_per_hour=0.0,
)

HARDWARE: dict[str, Hardware] = {hardware.name: hardware for hardware in (H100, H200, CPU)}


def hardware_by_name(name: str) -> Hardware:
    """A preset by name (case-insensitive)."""
    preset = HARDWARE.get(name.strip().lower())
    if preset is None:
        raise ValueError(f"unknown hardware {name!r}; presets: {', '.join(sorted(HARDWARE))}")
    return preset
