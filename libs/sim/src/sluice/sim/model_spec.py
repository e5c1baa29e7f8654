"""The shape of a Llama-family decoder, as far as the cost model needs it.

Parameters, per layer (no biases, as in every Llama):

    q, o        hidden x (heads x head_dim), twice
    k, v        hidden x (kv_heads x head_dim), twice
    gate, up    hidden x intermediate, twice
    down        intermediate x hidden
    2 RMSNorms  hidden each

plus the embedding table (vocab x hidden), the final RMSNorm (hidden) and
the lm head (vocab x hidden) unless it is tied to the embedding.
Llama-3-70B: 1.05e9 + 80 x 855.65e6 + 8,192 + 1.05e9 = 70.55e9.

KV cache bytes per token = 2 (K and V) x layers x kv_heads x head_dim x dtype
bytes; Llama-3-70B in bf16: 2 x 80 x 8 x 128 x 2 = 327,680 B.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Short names as the simulator's flags spell them, and the torch spellings
# the replica's settings use, so either can be passed through unchanged.
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "bf16": 2,
    "bfloat16": 2,
    "fp16": 2,
    "float16": 2,
    "fp8": 1,
    "float8": 1,
}


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; one of {', '.join(sorted(DTYPE_BYTES))}") from None


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_context_tokens: int
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        dims = {
            "num_layers": self.num_layers,
            "hidden_size": self.hidden_size,
            "num_attention_heads": self.num_attention_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "intermediate_size": self.intermediate_size,
            "vocab_size": self.vocab_size,
            "max_context_tokens": self.max_context_tokens,
        }
        for field_name, value in dims.items():
            if value < 1:
                raise ValueError(f"{self.name}: {field_name} must be >= 1, got {value}")
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"{self.name}: {self.num_attention_heads} attention heads do not group evenly "
                f"over {self.num_kv_heads} KV heads"
            )

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], name: str) -> "ModelSpec":
        """From a Hugging Face Llama-style `config.json` (already parsed)."""

        def required(key: str) -> int:
            if config.get(key) is None:
                raise ValueError(f"{name}: config.json has no {key!r}")
            return int(config[key])

        heads = required("num_attention_heads")
        # Older configs leave these out (or null): no GQA, and head_dim = hidden / heads.
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or required("hidden_size") // heads)
        return cls(
            name=name,
            num_layers=required("num_hidden_layers"),
            hidden_size=required("hidden_size"),
            num_attention_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=required("intermediate_size"),
            vocab_size=required("vocab_size"),
            max_context_tokens=required("max_position_embeddings"),
            # LlamaConfig's own default; PretrainedConfig's generic True does not apply.
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )

    @classmethod
    def from_config_file(cls, path: str | Path) -> "ModelSpec":
        """From a `config.json`, or a checkpoint directory holding one; the
        directory's name becomes the model's name."""
        config_path = Path(path)
        if config_path.is_dir():
            config_path = config_path / "config.json"
        config = json.loads(config_path.read_text(encoding="utf-8"))
        return cls.from_hf_config(config, name=config_path.resolve().parent.name)

    @property
    def q_dim(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def parameters_per_layer(self) -> int:
        attention = self.hidden_size * (2 * self.q_dim + 2 * self.kv_dim)
        mlp = 3 * self.hidden_size * self.intermediate_size
        norms = 2 * self.hidden_size
        return attention + mlp + norms

    def embedding_parameters(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_parameters(self) -> int:
        """The lm head's matrix, counted whether or not it is the embedding's:
        every sampling step reads it either way."""
        return self.vocab_size * self.hidden_size

    def num_parameters(self) -> int:
        untied_head = 0 if self.tie_word_embeddings else self.lm_head_parameters()
        final_norm = self.hidden_size
        return self.embedding_parameters() + self.num_layers * self.parameters_per_layer() + final_norm + untied_head

    def weight_bytes(self, dtype: str = "bf16") -> int:
        return self.num_parameters() * dtype_bytes(dtype)

    def kv_bytes_per_token(self, dtype: str = "bf16") -> int:
        return 2 * self.num_layers * self.kv_dim * dtype_bytes(dtype)


# The Llama 3 shapes with the 3.1 context (131,072 tokens): the layers,
# heads and widths are the same, and the workloads the planner sizes for
# (the seed's 32K-token documents) need the longer context.
LLAMA_3_70B = ModelSpec(
    name="llama-3-70b",
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=28672,
    vocab_size=128256,
    max_context_tokens=131072,
)

LLAMA_3_8B = ModelSpec(
    name="llama-3-8b",
    num_layers=32,
    hidden_size=4096,
    num_attention_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=14336,
    vocab_size=128256,
    max_context_tokens=131072,
)

# The dev stack's model: sluice.tinymodel's TinyLlamaDims and
# MODEL_MAX_LENGTH_TOKENS, restated here because importing sluice.tinymodel
# would pull torch into the simulator; a test checks the two agree.
TINY_LLAMA = ModelSpec(
    name="tiny-llama",
    num_layers=4,
    hidden_size=256,
    num_attention_heads=8,
    num_kv_heads=4,
    head_dim=32,
    intermediate_size=688,
    vocab_size=32000,
    max_context_tokens=4096,
)

MODELS: dict[str, ModelSpec] = {model.name: model for model in (LLAMA_3_70B, LLAMA_3_8B, TINY_LLAMA)}


def model_by_name_or_path(text: str) -> ModelSpec:
    """A preset by name, or the model whose `config.json` (or checkpoint
    directory) `text` points at."""
    preset = MODELS.get(text.strip().lower())
    if preset is not None:
        return preset
    path = Path(text)
    if path.is_file() or (path / "config.json").is_file():
        return ModelSpec.from_config_file(path)
    raise ValueError(
        f"{text!r} is neither a model preset ({', '.join(sorted(MODELS))}) "
        "nor a config.json or a directory holding one"
    )
