"""Llama-family model configuration, parsed from a Hugging Face config.json.

Both spellings of the RoPE settings are accepted:

- classic (Llama 2/3 checkpoints on the Hub): top-level ``rope_theta`` and
  ``rope_scaling = {"rope_type" | "type": ..., ...}``;
- transformers >= 5 ``save_pretrained``: ``rope_parameters = {"rope_theta":
  ..., "rope_type": ..., ...}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

SUPPORTED_ARCHITECTURES = frozenset({"LlamaForCausalLM"})
SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "llama3"})


@dataclass(slots=True, frozen=True)
class RopeScaling:
    """RoPE frequency scaling. ``rope_type`` is "linear" or "llama3".

    linear: every inverse frequency is divided by ``factor`` (position
    interpolation). llama3: low frequencies divided by ``factor``, high ones
    kept, a smooth blend in between (Llama 3.1 long-context recipe); the
    band edges are ``original_max_position_embeddings / {low,high}_freq_factor``
    wavelengths.
    """

    rope_type: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(f"unsupported rope scaling type {self.rope_type!r}")
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor}")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ValueError(
                "llama3 rope scaling needs high_freq_factor > low_freq_factor, got "
                f"{self.high_freq_factor} <= {self.low_freq_factor}"
            )


@dataclass(slots=True, frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    bos_token_id: int | None = None
    # Llama 3 instruct lists several end-of-turn ids; a plain int is one id.
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        positive = {
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "max_position_embeddings": self.max_position_embeddings,
        }
        for name, value in positive.items():
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be > 0")

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one KV head (GQA group size)."""
        return self.num_attention_heads // self.num_key_value_heads

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any]) -> "LlamaConfig":
        """Parse a Hugging Face ``config.json`` dict; ValueError if unsupported."""
        architectures = hf.get("architectures") or []
        model_type = hf.get("model_type")
        if architectures:
            unsupported = [a for a in architectures if a not in SUPPORTED_ARCHITECTURES]
            if unsupported:
                raise ValueError(
                    f"unsupported architecture(s) {unsupported}; supported: "
                    f"{sorted(SUPPORTED_ARCHITECTURES)}"
                )
        elif model_type != "llama":
            raise ValueError(
                f"config has no 'architectures' and model_type {model_type!r} is not 'llama'"
            )
        hidden_act = hf.get("hidden_act", "silu")
        if hidden_act != "silu":
            raise ValueError(f"unsupported hidden_act {hidden_act!r}; Llama uses 'silu'")
        if hf.get("pretraining_tp", 1) not in (1, None):
            raise ValueError("pretraining_tp > 1 checkpoints are not supported")

        try:
            hidden_size = int(hf["hidden_size"])
            num_heads = int(hf["num_attention_heads"])
            fields = dict(
                vocab_size=int(hf["vocab_size"]),
                hidden_size=hidden_size,
                intermediate_size=int(hf["intermediate_size"]),
                num_hidden_layers=int(hf["num_hidden_layers"]),
                num_attention_heads=num_heads,
            )
        except KeyError as exc:
            raise ValueError(f"config.json lacks required field {exc.args[0]!r}") from None
        num_kv_heads = hf.get("num_key_value_heads") or num_heads
        head_dim = hf.get("head_dim") or hidden_size // num_heads
        if not hf.get("head_dim") and hidden_size % num_heads:
            raise ValueError(
                f"hidden_size {hidden_size} is not divisible by num_attention_heads {num_heads}"
            )
        rope_theta, rope_scaling = _parse_rope(hf)
        return cls(
            **fields,
            num_key_value_heads=int(num_kv_heads),
            head_dim=int(head_dim),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)),
            mlp_bias=bool(hf.get("mlp_bias", False)),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=_parse_eos(hf.get("eos_token_id")),
        )


def _parse_eos(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)


def _parse_rope(hf: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    params = hf.get("rope_parameters")
    if params is not None:  # transformers >= 5 layout
        theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
        scaling = params
    else:
        theta = float(hf.get("rope_theta", 10000.0))
        scaling = hf.get("rope_scaling")
    if not scaling:
        return theta, None
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(
            f"unsupported rope scaling type {rope_type!r}; supported: "
            f"{sorted(SUPPORTED_ROPE_TYPES)}"
        )
    if rope_type == "default":
        return theta, None
    if "factor" not in scaling:
        raise ValueError(f"rope scaling {rope_type!r} needs a 'factor'")
    if rope_type == "linear":
        return theta, RopeScaling(rope_type="linear", factor=float(scaling["factor"]))
    try:
        return theta, RopeScaling(
            rope_type="llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as exc:
        raise ValueError(f"llama3 rope scaling lacks {exc.args[0]!r}") from None
