"""What a prefill token costs at depth, from the model's shape.

A token's linear layers (q/k/v/o projections and the MLP) cost the same at
any position; its attention costs in proportion to the tokens before it.
The depth at which the two are equal is the scale the replica's iteration
scheduler sizes long-prompt chunks by (SchedulerConfig.
prefill_depth_scale_tokens). Multiply-adds per layer:

    linear     hidden x (q_dim + 2 kv_dim) + q_dim x hidden + 3 x hidden x intermediate
    attention  2 x q_dim per token attended to (scores, then the weighted values)

It assumes attention runs as efficiently as the matmuls; on the tiny model
on CPU the measured scale (~1,000 tokens) was a little under this one
(~1,400), so chunks come out a little large rather than starved.
"""

from sluice.model.config import LlamaConfig


def attention_depth_scale_tokens(config: LlamaConfig) -> int:
    hidden = config.hidden_size
    q_dim = config.num_attention_heads * config.head_dim
    kv_dim = config.num_key_value_heads * config.head_dim
    linear = hidden * (q_dim + 2 * kv_dim) + q_dim * hidden + 3 * hidden * config.intermediate_size
    return max(round(linear / (2 * q_dim)), 1)
