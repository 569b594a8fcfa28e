"""GLM-4.5 / GLM-4.5-Air (transformers' glm4_moe)."""

from __future__ import annotations

from graphllm.models.families.deepseek import deepseek_moe
from graphllm.models.family import Family
from graphllm.models.fields import Spec, common_fields, flag, nonneg_int, pos_float, pos_int


def _glm4_moe(v: dict) -> dict:
    # Glm4MoeTopkRouter is DeepSeek-V3's (sigmoid, correction bias, groups ranked by their two
    # best, renormalised, scaled) and Glm4MoeDecoderLayer routes from first_k_dense_replace on;
    # the MTP layers n, n+1, ... follow the rule too (vLLM's glm4_moe_mtp.py: MoE blocks)
    rule = {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
    return deepseek_moe(v | rule | {"rope_interleave": False})


def _glm4_moe_attention(v: dict) -> dict:
    # Glm4MoeAttention: q/k/v biased by attention_bias, o_proj never; with use_qk_norm an
    # RMSNorm over each head's head_dim, one weight for all heads, before RoPE (Qwen3's)
    return {
        "qkv_bias": v["attention_bias"],
        "qk_norm": v["use_qk_norm"],
        "num_nextn_predict_layers": v["num_nextn_predict_layers"],
    }


# GLM-4.5 / GLM-4.5-Air (transformers' glm4_moe: Glm4MoeConfig, Glm4MoeAttention,
# Glm4MoeTopkRouter, Glm4MoeDecoderLayer = DeepseekV3DecoderLayer): GQA with partial rotate-half
# RoPE (partial_rotary_factor, 0.5 by default), QKV bias, optional per-head QK-norm; DeepSeek-V3's
# MoE (sigmoid routing with correction bias, grouped top-k, shared experts, dense first layers);
# num_nextn_predict_layers MTP layers kept out of the main model
GLM4_MOE = Family(
    common_fields(
        max_position_embeddings=Spec(pos_int, 131072),
        rms_norm_eps=Spec(pos_float, 1e-5),
        attention_bias=Spec(flag, False),
        use_qk_norm=Spec(flag, False),
        partial_rotary_factor=Spec(pos_float, 0.5),  # Glm4MoeConfig's default
        # only the dense first layers read it
        intermediate_size=Spec(pos_int, None),
        moe_intermediate_size=Spec(pos_int, 1408),
        num_experts_per_tok=Spec(pos_int, 8),
        n_shared_experts=Spec(nonneg_int, 1),
        n_routed_experts=Spec(pos_int, 128),
        routed_scaling_factor=Spec(pos_float, 1.0),
        n_group=Spec(pos_int, 1),
        topk_group=Spec(pos_int, 1),
        first_k_dense_replace=Spec(nonneg_int, 1),
        norm_topk_prob=Spec(flag, True),
        num_nextn_predict_layers=Spec(nonneg_int, 1),
    ),
    derive=_glm4_moe_attention,
    moe=_glm4_moe,
    partial_rotary=True,
    aliases={
        "num_local_experts": "n_routed_experts",
        "num_mtp_layers": "num_nextn_predict_layers",
    },
    # the routing Glm4MoeTopkRouter always computes, as some exported configs spell it
    noop_only={"scoring_func": ("sigmoid",), "topk_method": ("noaux_tc",)},
)


FAMILIES = {
    "glm4_moe": GLM4_MOE,
}
