"""Qwen3-Next (transformers' qwen3_next): Gated DeltaNet layers between attention ones."""

from __future__ import annotations

from graphllm.models.families.qwen2 import QWEN_MOE, qwen_moe
from graphllm.models.family import FULL, LINEAR, Family, attention_bias
from graphllm.models.fields import Spec, common_fields, flag, pos_float, pos_int

# Qwen3-Next (transformers' qwen3_next: Qwen3NextConfig, Qwen3NextGatedDeltaNet,
# Qwen3NextAttention with its output gate, Qwen3NextRMSNorm's x * (1 + w), Qwen3NextSparseMoeBlock)


def _qwen3_next_layers(v: dict) -> tuple[tuple[str, ...], int | None]:
    # Qwen3NextConfig: every full_attention_interval-th layer attends, the others are linear
    n, every = v["num_hidden_layers"], v["full_attention_interval"]
    return tuple(LINEAR if (i + 1) % every else FULL for i in range(n)), None


def _qwen3_next(v: dict) -> dict:
    return attention_bias(v) | {
        "qk_norm": True,  # per head, Qwen3NextRMSNorm like every norm of the model
        "norm_weight_offset": 1.0,  # zero-centred: x * (1 + w), as Gemma's
        "attn_output_gate": True,
        "conv_kernel": v["linear_conv_kernel_dim"],
        "linear_num_key_heads": v["linear_num_key_heads"],
        "linear_num_value_heads": v["linear_num_value_heads"],
        "linear_key_head_dim": v["linear_key_head_dim"],
        "linear_value_head_dim": v["linear_value_head_dim"],
        # the checkpoint's one MTP layer, mtp.layers.0 (the config does not declare it; vLLM's
        # qwen3_next_mtp.py reads num_nextn_predict_layers with a default of 1): a full-attention
        # layer whose MLP follows layer 0's rule (its prefix's index 0 in Qwen3NextDecoderLayer)
        "num_nextn_predict_layers": 1,
        "mtp_moe_layers": (
            0 not in v["mlp_only_layers"]
            and v["num_experts"] > 0
            and v["decoder_sparse_step"] == 1,
        ),
        "mtp_layout": "mtp",
    }


QWEN3_NEXT = Family(
    common_fields(
        max_position_embeddings=Spec(pos_int, 32768),
        head_dim=Spec(pos_int, 256),
        attention_bias=Spec(flag, False),
        partial_rotary_factor=Spec(pos_float, None),
        full_attention_interval=Spec(pos_int, 4),
        linear_conv_kernel_dim=Spec(pos_int, 4),
        linear_key_head_dim=Spec(pos_int, 128),
        linear_value_head_dim=Spec(pos_int, 128),
        linear_num_key_heads=Spec(pos_int, 16),
        linear_num_value_heads=Spec(pos_int, 32),
        shared_expert_intermediate_size=Spec(pos_int, 512),
        **{
            **QWEN_MOE,
            "num_experts": Spec(pos_int, 512),
            "num_experts_per_tok": Spec(pos_int, 10),
            "moe_intermediate_size": Spec(pos_int, 512),
            "norm_topk_prob": Spec(flag, True),
            "intermediate_size": Spec(pos_int, 5632),
        },
    ),
    derive=_qwen3_next,
    windows=_qwen3_next_layers,
    reads_layer_types=True,
    layer_kinds=(FULL, LINEAR),
    moe=qwen_moe,
    partial_rotary=True,
    # the published config.json writes these at the values the model has anyway
    noop_only={"use_sliding_window": (False,), "sliding_window": (None,)},
    default_partial_rotary=0.25,
)


FAMILIES = {
    "qwen3_next": QWEN3_NEXT,
}
