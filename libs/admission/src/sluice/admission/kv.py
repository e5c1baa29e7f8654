"""KV arithmetic from a model config.

    bytes per token = 2 (K and V) x layers x KV heads x head dim x dtype bytes
    Llama-3-70B, bf16: 2 * 80 * 8 * 128 * 2 = 327,680 B (~0.31 MiB); 32K tokens ~ 10 GiB

Blocks of `block_size_tokens` are the capacity unit everywhere (admission,
the scheduler's reservations, the replica's block manager); a partly filled
block costs a whole one.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8": 1, "fp8": 1}


@dataclass(frozen=True, slots=True)
class KVShape:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    block_size_tokens: int = 16

    def __post_init__(self) -> None:
        if min(self.num_layers, self.num_kv_heads, self.head_dim, self.dtype_bytes, self.block_size_tokens) < 1:
            raise ValueError(f"every KV dimension must be >= 1: {self}")

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], dtype: str, block_size_tokens: int = 16) -> "KVShape":
        """From a Hugging Face Llama-family config.json."""
        heads = int(config["num_attention_heads"])
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
        if dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown KV dtype {dtype!r}; one of {sorted(DTYPE_BYTES)}")
        return cls(
            num_layers=int(config["num_hidden_layers"]),
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            dtype_bytes=DTYPE_BYTES[dtype],
            block_size_tokens=block_size_tokens,
        )

    @property
    def bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_token * self.block_size_tokens

    def blocks_for(self, num_tokens: int) -> int:
        return blocks_for(num_tokens, self.block_size_tokens)

    def blocks_in(self, num_bytes: int) -> int:
        """Whole blocks that fit in `num_bytes` of KV memory."""
        return num_bytes // self.bytes_per_block


def blocks_for(num_tokens: int, block_size_tokens: int) -> int:
    return -(-max(num_tokens, 0) // block_size_tokens)
