"""How many KV blocks this replica gets."""

import torch

from sluice.model.config import LlamaConfig
from sluice.model.kv_cache import kv_bytes_per_token


def kv_cache_blocks(
    config: LlamaConfig,
    dtype: torch.dtype,
    device: torch.device,
    block_size_tokens: int,
    configured_blocks: int,
    configured_bytes: int,
    gpu_memory_fraction: float,
) -> int:
    """Configured blocks win; then configured bytes; on CUDA with neither, a
    fraction of the device memory still free once the weights are loaded."""
    if configured_blocks:
        return configured_blocks
    block_bytes = kv_bytes_per_token(config, dtype) * block_size_tokens
    budget_bytes = configured_bytes
    if device.type == "cuda" and not budget_bytes:
        free_bytes, _total = torch.cuda.mem_get_info(device)
        budget_bytes = int(free_bytes * gpu_memory_fraction)
    blocks = budget_bytes // block_bytes
    if blocks < 1:
        raise ValueError(f"KV budget of {budget_bytes} bytes holds no block of {block_bytes} bytes")
    return blocks
