"""Gemma 2 (transformers' gemma2: Gemma2Config, Gemma2Attention, Gemma2DecoderLayer)."""

from __future__ import annotations

from graphllm.models.families.gemma import GEMMA, gemma_derive
from graphllm.models.family import Family, global_every
from graphllm.models.fields import Spec, nonneg_int, pos_float, string
from graphllm.models.model_config import BlockLayout

# Gemma 2/3 read hidden_activation through ACT2FN, where `gelu` is the exact GELU (only Gemma 1's
# config rewrites it to the tanh form): the tanh one is what graphllm models
GEMMA2_ACTS = {"gelu_pytorch_tanh": "gelu_tanh"}


def gemma2_derive(v: dict) -> dict:
    # Gemma 2 and 3 read hidden_activation alone (Family.act_field); a hidden_act that says
    # otherwise is refused all the same, as a config at odds with itself
    return gemma_derive(v) | {
        "attention_scale": v["query_pre_attn_scalar"] ** -0.5,
        "attn_logit_softcapping": v["attn_logit_softcapping"],
        "final_logit_softcapping": v["final_logit_softcapping"],
    }


# Gemma 2 (transformers' gemma2: Gemma2Config, Gemma2Attention, Gemma2DecoderLayer):
# Gemma's norms, activation and embedding scale, a pre- and a post-norm around each sub-layer,
# soft-capped attention scores and logits, every other layer a sliding window
GEMMA2 = Family(
    {
        **GEMMA.fields,
        # transformers 5 reads hidden_activation alone; the published files carry both names
        "hidden_activation": Spec(string, "gelu_pytorch_tanh"),
        "query_pre_attn_scalar": Spec(pos_float, 256.0),
        "sliding_window": Spec(nonneg_int, 4096, nullable=True),
        # null: no cap
        "attn_logit_softcapping": Spec(pos_float, 50.0, nullable=True),
        "final_logit_softcapping": Spec(pos_float, 30.0, nullable=True),
    },
    derive=gemma2_derive,
    windows=global_every("gemma2", 2),
    reads_layer_types=True,
    acts=GEMMA2_ACTS,
    act_field="hidden_activation",
    # google/gemma-2-*'s published config.json gives the window twice (sliding_window_size is
    # the name of the original release); transformers reads sliding_window
    aliases={"sliding_window_size": "sliding_window"},
    # the published files' cache kind: transformers builds the same model whatever it says
    noop_only={"cache_implementation": ("hybrid", None)},
    block=BlockLayout(
        attention_pre="input_layernorm",
        attention_post="post_attention_layernorm",
        ffn_pre="pre_feedforward_layernorm",
        ffn_post="post_feedforward_layernorm",
    ),
    genai_type="gemma2",
)


FAMILIES = {
    "gemma2": GEMMA2,
}
