"""Qwen3 and Qwen3-MoE (transformers' qwen3, qwen3_moe): Qwen2's layout with per-head q/k
RMSNorms."""

from __future__ import annotations

from graphllm.models.families.qwen2 import QWEN_MOE, QWEN_WINDOW, qwen2_window, qwen_moe
from graphllm.models.family import Family, attention_bias, every_layer_window
from graphllm.models.fields import Spec, common_fields, flag, pos_int

QWEN3 = Family(
    common_fields(
        max_position_embeddings=Spec(pos_int, 32768),
        head_dim=Spec(pos_int, 128),
        attention_bias=Spec(flag, False),
        **QWEN_WINDOW,
    ),
    derive=lambda v: attention_bias(v) | {"qk_norm": True},
    windows=qwen2_window,
    reads_layer_types=True,
    genai_type="qwen3",
)

QWEN3_MOE = Family(
    common_fields(
        max_position_embeddings=Spec(pos_int, 32768),
        attention_bias=Spec(flag, False),
        **QWEN_WINDOW,
        **QWEN_MOE,
    ),
    # max_window_layers is written by Qwen3-MoE checkpoints but transformers 5 ignores it
    derive=lambda v: attention_bias(v) | {"qk_norm": True},
    windows=every_layer_window,
    moe=qwen_moe,
    aliases={"num_local_experts": "num_experts"},  # transformers 5 writes this spelling
    # Qwen3-Coder's published config also says what Qwen3MoeForCausalLM always builds and never
    # reads: no q/k/v bias, no shared expert, q/k norms on
    noop_only={
        "qkv_bias": (False,),
        "shared_expert_intermediate_size": (0,),
        "use_qk_norm": (True,),
    },
)


FAMILIES = {
    "qwen3": QWEN3,
    "qwen3_moe": QWEN3_MOE,
}
