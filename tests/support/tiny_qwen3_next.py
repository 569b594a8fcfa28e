"""Tiny transformers Qwen3-Next models with random weights (the `tiny_qwen3_next` fixture): Gated
DeltaNet layers between attention ones with the output gate, partial rotary and the zero-centred
norms, the MoE with its gated shared expert (issue 19)."""

from __future__ import annotations

from tests.support.tiny_models import BATCH, SEQ, TinyModel
from tests.support.tiny_models import presents as carried  # the states are presents too

__all__ = ["BATCH", "CASES", "LONG", "SEQ", "SMALL", "TinyQwen3Next", "carried"]

LONG = 70  # a prefill longer than transformers' chunk of 64: the second chunk is padded
SMALL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,  # partial_rotary_factor 0.25: RoPE on 4 channels of each head
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 6,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 20,
    "intermediate_size": 48,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
CASES: dict[str, tuple[str, dict]] = {
    # layers 0 and 3 attend, 1 and 2 are Gated DeltaNet; every layer routes
    "qwen3_next": (
        "qwen3_next",
        {
            "layer_types": [
                "full_attention",
                "linear_attention",
                "linear_attention",
                "full_attention",
            ]
        },
    ),
    # the published pattern (full_attention_interval), layer 1 dense (mlp_only_layers)
    "qwen3_next-interval": (
        "qwen3_next",
        {"full_attention_interval": 2, "mlp_only_layers": [1], "num_hidden_layers": 2},
    ),
}


class TinyQwen3Next(TinyModel):
    cases = CASES
    small = SMALL

    def past_len(self, past: dict) -> int:
        # the attention layers' (a state says nothing of it)
        kv = [v.shape[2] for k, v in past.items() if k.endswith((".key", ".value"))]
        return max(kv, default=0)
