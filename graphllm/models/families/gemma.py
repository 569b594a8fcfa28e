"""Gemma (transformers' gemma: GemmaConfig, GemmaRMSNorm's x * (1 + w), the embeddings scaled
by sqrt(hidden_size), the tanh GELU)."""

from __future__ import annotations

from graphllm.echo import shown
from graphllm.errors import ConfigError
from graphllm.models.family import SILU, Family, attention_bias
from graphllm.models.fields import Spec, common_fields, flag, pos_int, string

# Gemma's published `gelu` means the tanh approximation (transformers rewrites it so)
GEMMA_ACTS = {**SILU, "gelu": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def gemma_derive(v: dict) -> dict:
    # transformers 4.4x read `hidden_activation` and 5.x reads `hidden_act`: they must agree
    act = v["hidden_activation"]
    if act is not None and GEMMA_ACTS.get(act) != GEMMA_ACTS.get(v["hidden_act"]):
        raise ConfigError(
            f"hidden_activation {shown(act)} disagrees with hidden_act {shown(v['hidden_act'])}; "
            "give one gelu-tanh activation"
        )
    return attention_bias(v) | {
        "norm_weight_offset": 1.0,  # RMSNorm scales by (1 + w)
        "embedding_multiplier": v["hidden_size"] ** 0.5,
    }


GEMMA = Family(
    common_fields(
        max_position_embeddings=Spec(pos_int, 8192),
        head_dim=Spec(pos_int, 256),
        hidden_act=Spec(string, "gelu_pytorch_tanh"),
        hidden_activation=Spec(string, None),
        tie_word_embeddings=Spec(flag, True),
        attention_bias=Spec(flag, False),
    ),
    derive=gemma_derive,
    acts=GEMMA_ACTS,
    genai_type="gemma",
)


FAMILIES = {
    "gemma": GEMMA,
}
