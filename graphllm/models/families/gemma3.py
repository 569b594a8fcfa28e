"""Gemma 3 (transformers' gemma3): the text decoder gemma3_text, and the multimodal gemma3
wrapper that loads as it."""

from __future__ import annotations

from graphllm.models.families.gemma2 import GEMMA2, GEMMA2_ACTS, gemma2_derive
from graphllm.models.family import Family, Multimodal, global_every
from graphllm.models.fields import Spec, pos_float, pos_int

# Gemma 3's text decoder (transformers' gemma3: Gemma3TextConfig, Gemma3Attention,
# Gemma3DecoderLayer, Gemma3ForCausalLM): Gemma 2's block, per-head q/k RMSNorms, five local
# layers to one global, the local ones with their own RoPE base; soft-capping off by default.
# Its defaults are Gemma3TextConfig's, which a `gemma3` checkpoint's sparse text_config relies on
GEMMA3_TEXT = Family(
    {
        **GEMMA2.fields,
        "vocab_size": Spec(pos_int, 262208),
        "hidden_size": Spec(pos_int, 2304),
        "intermediate_size": Spec(pos_int, 9216),
        "num_hidden_layers": Spec(pos_int, 26),
        "num_attention_heads": Spec(pos_int, 8),
        "num_key_value_heads": Spec(pos_int, 4),
        "max_position_embeddings": Spec(pos_int, 131072),
        "attn_logit_softcapping": Spec(pos_float, None, nullable=True),
        "final_logit_softcapping": Spec(pos_float, None, nullable=True),
        "rope_local_base_freq": Spec(pos_float, None),
        "sliding_window_pattern": Spec(pos_int, 6),
    },
    derive=lambda v: gemma2_derive(v) | {"qk_norm": True},
    windows=global_every("gemma3_text"),
    reads_layer_types=True,
    acts=GEMMA2_ACTS,
    act_field="hidden_activation",
    default_theta=1e6,
    # transformers 4.5x's spelling of the pattern
    aliases={"_sliding_window_pattern": "sliding_window_pattern"},
    noop_only={"cache_implementation": ("hybrid", None)},
    block=GEMMA2.block,
    rope_by_layer_type=True,
    genai_type="gemma3_text",
)


FAMILIES = {
    "gemma3_text": GEMMA3_TEXT,
}

# Gemma3ForConditionalGeneration: a SigLIP vision tower and a projector around gemma3_text
MULTIMODAL = {
    "gemma3": Multimodal(
        text="gemma3_text",
        parts=frozenset(
            {
                "vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index",
                "image_token_index", "image_token_id", "boi_token_id", "eoi_token_id",
            }
        ),
        unused=(
            "model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
            "multi_modal_projector.",
        ),
    ),
}  # fmt: skip
