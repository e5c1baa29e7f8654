"""Shape/stride/dtype checks shared by the Triton kernel wrappers.

Kept free of triton imports: the checks run before any launch, and on the
CPU path nothing here is needed, but importing it must never pull triton in.
"""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
SUPPORTED_HEAD_DIMS = (32, 64, 128)


def is_power_of_2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def check_paged_cache(
    key_cache: torch.Tensor, value_cache: torch.Tensor, dtype: torch.dtype
) -> tuple[int, int, int, int]:
    """Assert the cache pair is usable by the kernels; returns its shape.

    key_cache, value_cache: [num_blocks, block_size, num_kv_heads, head_dim]
    """
    assert key_cache.dim() == 4, f"key_cache must be 4-D, got {tuple(key_cache.shape)}"
    assert value_cache.shape == key_cache.shape, (value_cache.shape, key_cache.shape)
    assert key_cache.dtype == dtype and value_cache.dtype == dtype, (
        f"cache dtypes {key_cache.dtype}/{value_cache.dtype} != query dtype {dtype}"
    )
    assert key_cache.stride(-1) == 1 and value_cache.stride(-1) == 1, (
        "cache head_dim must be contiguous (stride 1)"
    )
    assert key_cache.stride() == value_cache.stride(), (
        f"key/value cache strides differ: {key_cache.stride()} vs {value_cache.stride()}"
    )
    num_blocks, block_size, num_kv_heads, head_dim = key_cache.shape
    assert is_power_of_2(block_size), f"block_size must be a power of 2, got {block_size}"
    assert head_dim in SUPPORTED_HEAD_DIMS, (
        f"head_dim must be one of {SUPPORTED_HEAD_DIMS}, got {head_dim}"
    )
    return num_blocks, block_size, num_kv_heads, head_dim


def check_query(query: torch.Tensor, name: str = "query") -> None:
    """query/out: [num_tokens, num_heads, head_dim], last dim contiguous."""
    assert query.dim() == 3, f"{name} must be [tokens, heads, head_dim], got {tuple(query.shape)}"
    assert query.dtype in SUPPORTED_DTYPES, f"{name} dtype {query.dtype} not in {SUPPORTED_DTYPES}"
    assert query.stride(-1) == 1, f"{name} head_dim must be contiguous (stride 1)"


def check_int_vector(t: torch.Tensor, length: int, name: str, device: torch.device) -> None:
    assert t.dim() == 1 and t.shape[0] == length, f"{name} must be [{length}], got {tuple(t.shape)}"
    assert t.dtype in (torch.int32, torch.int64), f"{name} must be int32/int64, got {t.dtype}"
    assert t.device == device, f"{name} on {t.device}, query on {device}"


def check_block_tables(block_tables: torch.Tensor, num_seqs: int, device: torch.device) -> None:
    assert block_tables.dim() == 2 and block_tables.shape[0] == num_seqs, (
        f"block_tables must be [{num_seqs}, max_blocks], got {tuple(block_tables.shape)}"
    )
    assert block_tables.dtype in (torch.int32, torch.int64), block_tables.dtype
    assert block_tables.stride(-1) == 1, "block_tables rows must be contiguous"
    assert block_tables.device == device, f"block_tables on {block_tables.device}, query on {device}"


def use_fp32_dot(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether kernels should upcast ``tl.dot`` operands to fp32.

    fp32 inputs: always (exact "ieee" products, not tf32, so fp32 results
    match the reference to ~1e-5). bf16 off CUDA, i.e. under
    TRITON_INTERPRET: the interpreter's bf16 ``tl.dot`` returns garbage in
    triton 3.7, and upcasting bf16 is exact, so numerics match the GPU path.
    """
    return dtype == torch.float32 or (dtype == torch.bfloat16 and device.type != "cuda")
