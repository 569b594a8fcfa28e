"""Granite 3 (transformers' granite: GraniteConfig): Llama's block with muP multipliers."""

from __future__ import annotations

from graphllm.models.family import Family, attention_bias
from graphllm.models.fields import MHA, Spec, common_fields, flag, pos_float


def _granite(v: dict) -> dict:
    # muP (GraniteModel / GraniteForCausalLM): the embeddings times embedding_multiplier, scores
    # times attention_multiplier (in place of 1/sqrt(d_h)), each sub-layer's output times
    # residual_multiplier, the logits divided by logits_scaling
    return attention_bias(v) | {
        "mlp_bias": v["mlp_bias"],
        "embedding_multiplier": float(v["embedding_multiplier"]),
        "attention_scale": float(v["attention_multiplier"]),
        "residual_multiplier": float(v["residual_multiplier"]),
        "logits_multiplier": 1.0 / v["logits_scaling"],
    }


GRANITE = Family(
    common_fields(
        num_key_value_heads=MHA,
        attention_bias=Spec(flag, False),
        mlp_bias=Spec(flag, False),
        embedding_multiplier=Spec(pos_float, 1.0),
        attention_multiplier=Spec(pos_float, 1.0),
        residual_multiplier=Spec(pos_float, 1.0),
        logits_scaling=Spec(pos_float, 1.0),
    ),
    derive=_granite,
    genai_type="granite",
)


FAMILIES = {
    "granite": GRANITE,
}
