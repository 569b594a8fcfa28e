"""Llama 1-3 (transformers' llama: LlamaConfig, LlamaAttention, LlamaMLP)."""

from __future__ import annotations

from graphllm.models.family import Family, attention_bias
from graphllm.models.fields import MHA, Spec, common_fields, flag

LLAMA = Family(
    common_fields(
        num_key_value_heads=MHA, attention_bias=Spec(flag, False), mlp_bias=Spec(flag, False)
    ),
    derive=lambda v: attention_bias(v) | {"mlp_bias": v["mlp_bias"]},
    genai_type="llama",
)


FAMILIES = {
    "llama": LLAMA,
}
