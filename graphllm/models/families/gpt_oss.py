"""gpt-oss (transformers' gpt_oss)."""

from __future__ import annotations

from graphllm.errors import ConfigError
from graphllm.models.family import Family, attention_bias, every_layer_routes, global_every
from graphllm.models.fields import Spec, common_fields, flag, nonneg_int, pos_float, pos_int
from graphllm.models.model_config import MoENames


def _gpt_oss_moe(v: dict) -> dict:
    # GptOssMLP: every layer routes; GptOssTopKRouter takes the top-k of the biased router
    # logits and softmaxes the k chosen; GptOssExperts keeps each projection stacked for all
    # experts (E, in, out) with biases, gate and up interleaved, through a clamped SwiGLU
    return every_layer_routes(v) | {
        "moe_names": MoENames(
            router="router", expert_gate="gate_up_proj", expert_up="gate_up_proj"
        ),
        "router_bias": True,
        "topk_then_score": True,
        "experts_stacked": True,
        "swiglu_limit": v["swiglu_limit"],
        "swiglu_alpha": v["swiglu_alpha"],
    }


def _gpt_oss(v: dict) -> dict:
    if v["experts_per_token"] not in (None, v["num_experts_per_tok"]):
        raise ConfigError(
            f"experts_per_token {v['experts_per_token']} disagrees with num_experts_per_tok "
            f"{v['num_experts_per_tok']}"
        )
    # GptOssAttention: q/k/v/o all biased by attention_bias, and a learned sink per head
    return attention_bias(v) | {"attention_sinks": True}


# gpt-oss (transformers' gpt_oss: GptOssConfig, GptOssAttention, GptOssTopKRouter,
# GptOssExperts): GQA with attention sinks and biases, every other layer a 128-token window,
# YaRN RoPE, a biased top-4 router softmaxed over its choice, 32 or 128 experts with biases and a
# clamped SwiGLU. The published config.json's experts_per_token and initial_context_length are
# the original release's names (the first must equal num_experts_per_tok; the second is
# rope_scaling's original_max_position_embeddings)
GPT_OSS = Family(
    common_fields(
        head_dim=Spec(pos_int, 64),
        rms_norm_eps=Spec(pos_float, 1e-5),
        max_position_embeddings=Spec(pos_int, 131072),
        sliding_window=Spec(nonneg_int, 128, nullable=True),
        attention_bias=Spec(flag, True),
        num_local_experts=Spec(pos_int, 128),
        num_experts_per_tok=Spec(pos_int, 4),
        experts_per_token=Spec(pos_int, None),
        initial_context_length=Spec(pos_int, None),
        swiglu_limit=Spec(pos_float, 7.0),
        swiglu_alpha=Spec(pos_float, 1.702),
    ),
    derive=_gpt_oss,
    windows=global_every("gpt_oss", 2),
    reads_layer_types=True,
    moe=_gpt_oss_moe,
    default_theta=150000.0,
    aliases={"num_experts": "num_local_experts"},
    genai_type="gptoss",
)


FAMILIES = {
    "gpt_oss": GPT_OSS,
}
