"""Cohere (Command R) and Cohere 2 (Command R7B) (transformers' cohere, cohere2): LayerNorm,
attention and MLP side by side, interleaved RoPE."""

from __future__ import annotations

from graphllm.errors import ConfigError
from graphllm.models.family import Family, attention_bias, global_every
from graphllm.models.fields import MHA, Spec, common_fields, flag, nonneg_int, pos_float, pos_int
from graphllm.models.model_config import BlockLayout

# Cohere (transformers' cohere: CohereConfig, CohereLayerNorm, CohereDecoderLayer)
COHERE = Family(
    {
        **{
            k: s for k, s in common_fields().items() if k != "rms_norm_eps"
        },  # it has layer_norm_eps
        "num_key_value_heads": MHA,
        "max_position_embeddings": Spec(pos_int, 8192),
        "tie_word_embeddings": Spec(flag, True),
        "layer_norm_eps": Spec(pos_float, 1e-5),
        "logit_scale": Spec(pos_float, 0.0625),
        "attention_bias": Spec(flag, False),
        "use_qk_norm": Spec(flag, False),
    },
    derive=lambda v: (
        attention_bias(v)
        | {
            "norm_type": "layernorm",
            "rms_norm_eps": v["layer_norm_eps"],
            "qk_norm": v["use_qk_norm"],
            "qk_norm_scope": "each_head",
            "logits_multiplier": v["logit_scale"],
            # rotate_half pairs adjacent channels (x_2i, x_2i+1), written back interleaved
            "rope_layout": "complex",
        }
    ),
    # attention and MLP side by side, both reading the one input_layernorm
    block=BlockLayout(ffn_pre=None, parallel=True),
)


def _cohere2(v: dict) -> dict:
    # Cohere2Config sets head_dim to hidden_size // num_attention_heads whatever the file says
    heads, hidden = v["num_attention_heads"], v["hidden_size"]
    if v["head_dim"] is not None and v["head_dim"] * heads != hidden:
        raise ConfigError(
            f"head_dim {v['head_dim']} is not hidden_size // num_attention_heads "
            f"({hidden // heads}), which transformers' cohere2 always uses"
        )
    return COHERE.derive(v | {"use_qk_norm": False})


# Cohere 2 (transformers' cohere2): Cohere's block, sliding-window layers with a global
# one every few, the global ones without RoPE
COHERE2 = Family(
    {
        **{k: s for k, s in COHERE.fields.items() if k != "use_qk_norm"},
        "sliding_window": Spec(nonneg_int, 4096, nullable=True),
        "sliding_window_pattern": Spec(pos_int, 4),
    },
    derive=_cohere2,
    windows=global_every("cohere2", why=" (no layer would rotate)"),
    reads_layer_types=True,
    # the published files' own names for what transformers' cohere2 always builds: accepted at
    # that value, refused at any other
    noop_only={
        "use_qk_norm": (False, None),
        "use_parallel_block": (True,),
        "use_gated_activation": (True,),
        "use_embedding_sharing": (True,),
        "use_parallel_embedding": (True, False),  # how a TP run shards the table: same values
        "position_embedding_type": ("rope_gptj",),
        "rotary_pct": (1.0,),
        "order_of_interleaved_layers": ("local_attn_first",),
        "cache_implementation": ("hybrid", None),
    },
    block=BlockLayout(ffn_pre=None, parallel=True),
    rope_on_sliding_only=True,
)


FAMILIES = {
    "cohere": COHERE,
    "cohere2": COHERE2,
}
