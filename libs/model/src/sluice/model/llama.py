"""Llama-family decoder over a paged KV cache, plain PyTorch.

The forward pass takes a flattened batch: the tokens of every sequence in
this step concatenated into one ``[T]`` vector, with positions and
``AttentionMetadata`` saying where each sequence starts and where its K/V
goes. Submodule names follow Hugging Face's (minus the ``model.`` prefix) so
the loader can map checkpoint tensors one-to-one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from sluice.model.attention import AttentionBackend, AttentionMetadata, reference_attention
from sluice.model.config import LlamaConfig
from sluice.model.cpu_linear import PackedLinear
from sluice.model.kv_cache import KVCache
from sluice.model.rope import RotaryEmbedding, apply_rotary, rotate

__all__ = ["AttentionMetadata", "LlamaModel", "RMSNorm"]


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 (bf16 variance underflows), scale in the input dtype,
        # the same order of operations as the HF reference.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate Linears that read the same input into one [sum(out), in] weight
    (and bias), and make each Linear's parameters views into it.

    One GEMM instead of several is cheaper on CPU (fewer passes over the input,
    fewer kernel launches). The Linears keep their names and shapes, so
    checkpoint names, ``state_dict`` and direct calls still work, and the
    fused copy costs no extra memory: it *is* their storage.
    """
    weight = torch.cat([lin.weight.detach() for lin in linears], dim=0)  # [sum(out), in]
    has_bias = linears[0].bias is not None
    bias = torch.cat([lin.bias.detach() for lin in linears]) if has_bias else None  # [sum(out)]
    start = 0
    for lin in linears:
        rows = lin.out_features
        lin.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


class LlamaAttention(nn.Module):
    def __init__(self, config: LlamaConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = self.head_dim**-0.5
        self.backend = backend
        hidden, bias = config.hidden_size, config.attention_bias
        self.q_proj = nn.Linear(hidden, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden, bias=bias)
        # Set by fuse_projections(): q/k/v as one [(heads + 2 * kv_heads) * head_dim, hidden] GEMM.
        self._qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None
        # Set by pack_for_cpu(): the same GEMMs through oneDNN (see cpu_linear).
        self._qkv_packed: PackedLinear | None = None
        self._o_packed: PackedLinear | None = None

    def fuse_projections(self) -> None:
        self._qkv = fuse_linears([self.q_proj, self.k_proj, self.v_proj])

    def pack_for_cpu(self) -> None:
        assert self._qkv is not None, "fuse_projections first"
        self._qkv_packed = PackedLinear.pack(*self._qkv)
        self._o_packed = PackedLinear.pack(self.o_proj.weight, self.o_proj.bias)

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
        if self._qkv is not None:
            # [T, (num_heads + 2 * num_kv_heads) * head_dim]
            qkv = self._qkv_packed(x) if self._qkv_packed is not None else F.linear(x, *self._qkv)
            qk_out = (heads + kv_heads) * head_dim
            # q and k rotate as one [T, num_heads + num_kv_heads, head_dim] tensor.
            qk = rotate(qkv[:, :qk_out].view(num_tokens, heads + kv_heads, head_dim), cos, sin)
            q, k = qk.split([heads, kv_heads], dim=1)
            v = qkv[:, qk_out:].view(num_tokens, kv_heads, head_dim)
        else:
            q = self.q_proj(x).view(num_tokens, heads, head_dim)  # [T, num_heads, head_dim]
            k = self.k_proj(x).view(num_tokens, kv_heads, head_dim)  # [T, num_kv_heads, head_dim]
            v = self.v_proj(x).view(num_tokens, kv_heads, head_dim)
            q, k = apply_rotary(q, k, cos, sin)
        out = self.backend(q, k, v, kv_cache, attn, self.scale)  # [T, num_heads, head_dim]
        out = out.reshape(num_tokens, self.num_heads * self.head_dim)  # [T, num_heads * head_dim]
        return self._o_packed(out) if self._o_packed is not None else self.o_proj(out)


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, inter, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(hidden, inter, bias=bias)
        self.up_proj = nn.Linear(hidden, inter, bias=bias)
        self.down_proj = nn.Linear(inter, hidden, bias=bias)
        # Set by fuse_projections(): gate and up as one [2 * inter, hidden] GEMM.
        self._gate_up: tuple[torch.Tensor, torch.Tensor | None] | None = None
        # Set by pack_for_cpu(): the same GEMMs through oneDNN (see cpu_linear).
        self._gate_up_packed: PackedLinear | None = None
        self._down_packed: PackedLinear | None = None

    def fuse_projections(self) -> None:
        self._gate_up = fuse_linears([self.gate_proj, self.up_proj])

    def pack_for_cpu(self) -> None:
        assert self._gate_up is not None, "fuse_projections first"
        self._gate_up_packed = PackedLinear.pack(*self._gate_up)
        self._down_packed = PackedLinear.pack(self.down_proj.weight, self.down_proj.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._gate_up_packed is not None and self._down_packed is not None:
            gate, up = self._gate_up_packed(x).chunk(2, dim=-1)  # each [T, inter]
            return self._down_packed(F.silu(gate) * up)
        if self._gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate_up = F.linear(x, *self._gate_up)  # [T, 2 * inter]
        gate, up = gate_up.chunk(2, dim=-1)  # each [T, inter]
        return self.down_proj(F.silu(gate) * up)


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
    ) -> torch.Tensor:
        """Final-normed hidden states [T, hidden]; writes this step's K/V."""
        if len(kv_caches) != len(self.layers):
            raise ValueError(f"need {len(self.layers)} KV caches, got {len(kv_caches)}")
        h = self.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rotary_emb(positions, h.dtype)  # each [T, head_dim]
        for layer, kv_cache in zip(self.layers, kv_caches):
            h = layer(h, cos, sin, attn, kv_cache)
        return self.norm(h)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        # .to()/.to_empty() replace each Parameter on its own, which cuts the
        # Linears loose from the fused weights and the transposed LM head: rebuild them.
        super()._apply(fn, recurse)
        if getattr(self, "_fused", False):
            self.fuse_projections()
        if getattr(self, "_lm_head_packed", None) is not None:
            self.pack_for_cpu()
        return self

    def fuse_projections(self) -> None:
        """Run q/k/v and gate/up as one GEMM each (after the weights are loaded:
        the fused tensors become the Linears' storage, see ``fuse_linears``)."""
        self._fused = True
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def pack_for_cpu(self) -> None:
        """Run every linear (the fused q/k/v and gate/up, o, down and the LM
        head) through oneDNN with packed weights (see ``cpu_linear``; the
        loader does this for float32 on CPU where torch has oneDNN). The
        packed copies cost one more copy of the weights; the modules keep
        their own, so names and ``state_dict`` do not change."""
        if not getattr(self, "_fused", False):
            self.fuse_projections()
        for layer in self.layers:
            layer.self_attn.pack_for_cpu()
            layer.mlp.pack_for_cpu()
        self._lm_head_packed = PackedLinear.pack(self.lm_head.weight)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, hidden] -> float32 logits [N, vocab]. Pass only the rows you sample."""
        head = getattr(self, "_lm_head_packed", None)
        if head is not None:
            return head(hidden).float()
        return self.lm_head(hidden).float()
