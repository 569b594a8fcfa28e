"""OLMo 2 (transformers' olmo2: Olmo2Config, Olmo2Attention, Olmo2DecoderLayer)."""

from __future__ import annotations

from graphllm.models.family import Family, attention_bias
from graphllm.models.fields import MHA, Spec, common_fields, flag, pos_float
from graphllm.models.model_config import BlockLayout

# OLMo 2 (transformers' olmo2: Olmo2Config, Olmo2Attention, Olmo2DecoderLayer)
OLMO2 = Family(
    common_fields(
        num_key_value_heads=MHA,
        rms_norm_eps=Spec(pos_float, 1e-5),
        attention_bias=Spec(flag, False),
    ),
    derive=lambda v: attention_bias(v) | {"qk_norm": True, "qk_norm_scope": "projection"},
    # each sub-layer's output normalised before its residual add; nothing normalises its input
    block=BlockLayout(
        attention_pre=None,
        attention_post="post_attention_layernorm",
        ffn_pre=None,
        ffn_post="post_feedforward_layernorm",
    ),
)


FAMILIES = {
    "olmo2": OLMO2,
}
