"""Llama-family decoder over a paged KV cache, plain PyTorch.

The forward pass takes a flattened batch: the tokens of every sequence in
this step concatenated into one ``[T]`` vector, with positions and
``AttentionMetadata`` saying where each sequence starts and where its K/V
goes. Submodule names follow Hugging Face's (minus the ``model.`` prefix),
except that the projections reading the same input are one Linear each, as
in vLLM: ``qkv_proj`` (q, k and v rows stacked) and ``gate_up_proj`` (gate
then up): one GEMM instead of three or two. The loader stacks the
checkpoint's ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj``
into them (``STACKED_SHARDS``).

There is one forward path. What makes it fast on a given machine (oneDNN
packed linears on CPU, sluice.model.cpu_fast_path) is applied from outside
by swapping modules, the way gpt-fast applies quantization: nothing here
knows about it.
"""

from __future__ import annotations

import torch
from torch import nn

from sluice.kernels.argmax import argmax_rows
from sluice.kernels.elementwise_cpu import rms_norm, silu_mul
from sluice.model.attention import AttentionBackend, AttentionMetadata, reference_attention
from sluice.model.config import LlamaConfig
from sluice.model.kv_cache import KVCache
from sluice.model import yielding
from sluice.model.rope import RotaryEmbedding, rotate
from sluice.model.yielding import YieldCheck

__all__ = ["AttentionMetadata", "LlamaModel", "RMSNorm", "STACKED_SHARDS"]

# Checkpoint projection -> (our fused Linear, its shard index): the fused
# weight holds the shards' rows in this order.
STACKED_SHARDS = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # In float32 whatever x is, as the HF reference (sluice.kernels.elementwise_cpu).
        return rms_norm(x, self.weight, self.eps)


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.backend = backend
        hidden, bias = config.hidden_size, config.attention_bias
        # q, k and v rows stacked: [(num_heads + 2 * num_kv_heads) * head_dim, hidden]
        self.qkv_proj = nn.Linear(hidden, (self.num_heads + 2 * self.num_kv_heads) * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)

    def shard_rows(self) -> tuple[int, int, int]:
        """Rows of q, k and v in ``qkv_proj.weight``."""
        q_rows, kv_rows = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return q_rows, kv_rows, kv_rows

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,  # [T, head_dim]
        sin: torch.Tensor,  # [T, head_dim]
        attn: AttentionMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        heads, kv_heads, head_dim = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(x)  # [T, (num_heads + 2 * num_kv_heads) * head_dim]
        qk_out = (heads + kv_heads) * head_dim
        # q and k rotate as one [T, num_heads + num_kv_heads, head_dim] tensor.
        qk = rotate(qkv[:, :qk_out].view(num_tokens, heads + kv_heads, head_dim), cos, sin)
        q, k = qk.split([heads, kv_heads], dim=1)  # [T, num_heads, head_dim], [T, num_kv_heads, head_dim]
        v = qkv[:, qk_out:].view(num_tokens, kv_heads, head_dim)  # [T, num_kv_heads, head_dim]
        out = self.backend(q, k, v, kv_cache, attn, self.scale)  # [T, num_heads, head_dim]
        out = out.reshape(num_tokens, self.num_heads * self.head_dim)  # [T, num_heads * head_dim]
        return self.o_proj(out)


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, inter, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.intermediate_size = inter
        self.gate_up_proj = nn.Linear(hidden, 2 * inter, bias=bias)  # gate rows, then up rows
        self.down_proj = nn.Linear(inter, hidden, bias=bias)

    def shard_rows(self) -> tuple[int, int]:
        """Rows of gate and up in ``gate_up_proj.weight``."""
        return self.intermediate_size, self.intermediate_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul(self.gate_up_proj(x)))  # [T, 2 * inter] -> [T, inter] -> [T, hidden]


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config: LlamaConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden]
        cos: torch.Tensor,
        sin: torch.Tensor,
        attn: AttentionMetadata,
        kv_cache: KVCache,
    ) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), cos, sin, attn, kv_cache)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaModel(nn.Module):
    """Decoder stack plus LM head.

    ``attention_backend`` is any callable with the ``AttentionBackend``
    signature; it is shared by all layers and defaults to the torch reference.
    """

    def __init__(
        self, config: LlamaConfig, attention_backend: AttentionBackend | None = None
    ) -> None:
        super().__init__()
        self.config = config
        backend = attention_backend or reference_attention
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary_emb = RotaryEmbedding(config.head_dim, config.rope_theta, config.rope_scaling)
        self.layers = nn.ModuleList(
            LlamaDecoderLayer(config, backend) for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.tie_weights()

    def tie_weights(self) -> None:
        """Share the embedding with the LM head when configured. Call again after
        ``to_empty``: moving off the meta device replaces Parameters one module
        at a time, which silently unties them."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def set_attention_backend(self, backend: AttentionBackend) -> None:
        for layer in self.layers:
            layer.self_attn.backend = backend

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        attn: AttentionMetadata,
        kv_caches: list[KVCache],
        should_yield: YieldCheck | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states [T, hidden]; writes this step's K/V.
        `should_yield` is asked before each layer (sluice.model.yielding)."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"need {len(self.layers)} KV caches, got {len(kv_caches)}")
        h = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rotary_emb(positions, h.dtype)  # each [T, head_dim]
        for layer, kv_cache in zip(self.layers, kv_caches):
            yielding.check(should_yield)
            h = layer(h, cos, sin, attn, kv_cache)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 logits [N, vocab]. Pass only the rows you sample."""
        return self.lm_head(hidden).float()

    def greedy_token_ids(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> int64 [N], the argmax of each row's logits. A head
        swapped in from outside may answer without full logits
        (sluice.model.greedy_head); the answer is the same."""
        screened = getattr(self.lm_head, "greedy_token_ids", None)
        if screened is not None:
            return screened(hidden)
        return argmax_rows(self.compute_logits(hidden))
