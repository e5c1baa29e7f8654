"""The depth at which a prefill token's attention costs as much as its
linear layers, from the model's shape."""

from sluice.model.config import LlamaConfig
from sluice.model.step_cost import attention_depth_scale_tokens


def llama(hidden: int, intermediate: int, heads: int, kv_heads: int, head_dim: int) -> LlamaConfig:
    return LlamaConfig(vocab_size=32000, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=2,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
                       max_position_embeddings=4096)


def test_the_dev_stacks_tiny_model():
    # 256 x (256 + 2 x 128) + 256 x 256 + 3 x 256 x 688 = 724,992 over 2 x 256
    assert attention_depth_scale_tokens(llama(256, 688, 8, 4, 32)) == 1416


def test_a_70b_model_barely_notices_depth_at_chat_lengths():
    scale = attention_depth_scale_tokens(llama(8192, 28672, 64, 8, 128))
    assert 50_000 < scale < 55_000


def test_wider_mlp_means_attention_matters_later():
    assert attention_depth_scale_tokens(llama(256, 2048, 8, 4, 32)) > attention_depth_scale_tokens(
        llama(256, 688, 8, 4, 32))
