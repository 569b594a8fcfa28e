"""Llama 4 (transformers' llama4): the text decoder llama4_text (chunked and NoPE layers,
MoE layers with a shared expert), and the multimodal llama4 wrapper that loads as it."""

from __future__ import annotations

from typing import Any

from graphllm.errors import ConfigError
from graphllm.models.families.smollm3 import smollm3_rope_layers
from graphllm.models.family import CHUNKED, FULL, Family, Multimodal, attention_bias
from graphllm.models.fields import (
    Spec,
    common_fields,
    flag,
    int_list,
    is_int,
    nonneg_int,
    pos_float,
    pos_int,
)
from graphllm.models.model_config import MoENames, size_limit


# Llama 4's text decoder (transformers' llama4: Llama4TextConfig, Llama4TextAttention,
# Llama4TextDecoderLayer), its attention, dense and MoE FFNs
def _llama4_moe_layers(given: dict) -> list[int] | None:
    """The MoE layers Llama4TextConfig derives (`moe_layers`, else every
    interleave_moe_layer_step-th layer from step - 1), those below num_hidden_layers (the
    decoder layer asks `layer_idx in moe_layers`); None where a value is malformed, for the
    field checks to name."""
    n, step, given_layers = (
        given.get("num_hidden_layers"),
        given.get("interleave_moe_layer_step"),
        given.get("moe_layers"),
    )
    step = 1 if step is None else step
    if not is_int(n) or not 1 <= n <= size_limit("num_hidden_layers")[0] or not is_int(step):
        return None
    if given_layers is not None:
        if not isinstance(given_layers, list) or not all(is_int(x) for x in given_layers):
            return None
        return sorted({x for x in given_layers if 0 <= x < n})
    return list(range(step - 1, n, step)) if step >= 1 else None


def _flag_or_count(name: str, v: Any) -> bool:
    """true/false, or a non-negative integer read as its truth (0: false)."""
    if isinstance(v, bool):
        return v
    return nonneg_int(name, v) > 0


def _llama4_moe(v: dict) -> dict:
    """Llama4TextMoe on the layers in moe_layers: Llama4Router (a bias-free Linear,
    top-k of its logits, sigmoid of those) scales each chosen expert's input; the experts stored
    fused (Llama4TextExperts); a shared expert as wide as a routed one, always on."""
    n = v["num_hidden_layers"]
    moe = set(_llama4_moe_layers(v) or ())
    layers = tuple(i in moe for i in range(n))
    if not moe:
        return {"moe_layers": layers}
    if v["num_experts_per_tok"] > v["num_local_experts"]:
        raise ConfigError(
            f"num_experts_per_tok {v['num_experts_per_tok']} exceeds num_local_experts "
            f"{v['num_local_experts']}"
        )
    return {
        "num_experts": v["num_local_experts"],
        "num_experts_per_tok": v["num_experts_per_tok"],
        "moe_intermediate_size": v["intermediate_size"],
        "shared_expert_intermediate_size": v["intermediate_size"],
        "scoring_func": "sigmoid",
        "moe_weights_input": True,
        "fused_experts": True,
        "moe_layers": layers,
        "moe_names": MoENames(block="feed_forward", router="router", shared="shared_expert"),
        # the dense layers' width; 0 where every layer routes (Scout)
        "intermediate_size": v["intermediate_size_mlp"] if len(moe) < n else 0,
    }


def _llama4_rope_layers(v: dict) -> tuple[bool, ...]:
    # Llama4TextConfig: an empty no_rope_layers is falsy and takes the default, as None does
    return smollm3_rope_layers(v | {"no_rope_layers": v["no_rope_layers"] or None})


def _llama4_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # Llama4TextConfig: without layer_types, the RoPE layers are chunked (when a chunk size is
    # set) and the NoPE ones attend to everything
    chunk = v["attention_chunk_size"] is not None
    return tuple(CHUNKED if r and chunk else FULL for r in _llama4_rope_layers(v)), None


def _llama4(v: dict) -> dict:
    return (
        attention_bias(v)
        | {
            "intermediate_size": v["intermediate_size_mlp"],
            "mlp_name": "feed_forward",
            "rope_layers": _llama4_rope_layers(v),
            "rope_layout": "complex",  # apply_rotary_emb: (x_2i, x_2i+1) as one complex number
            "attention_chunk_size": v["attention_chunk_size"],
            "qk_l2_norm": v["use_qk_norm"],
            "temperature_floor_scale": v["floor_scale"] if v["attn_temperature_tuning"] else 0,
            "temperature_attn_scale": v["attn_scale"] if v["attn_temperature_tuning"] else 0.0,
        }
        | _llama4_moe(v)
    )


LLAMA4_TEXT = Family(
    common_fields(
        vocab_size=Spec(pos_int, 202048),
        hidden_size=Spec(pos_int, 5120),
        # the routed (and shared) experts' width
        intermediate_size=Spec(pos_int, 8192),
        intermediate_size_mlp=Spec(pos_int, 16384),
        num_hidden_layers=Spec(pos_int, 48),
        num_attention_heads=Spec(pos_int, 40),
        num_key_value_heads=Spec(pos_int, 8, nullable=True),  # null: one per query head
        head_dim=Spec(pos_int, 128),
        max_position_embeddings=Spec(pos_int, 4096 * 32),
        rms_norm_eps=Spec(pos_float, 1e-5),
        attention_bias=Spec(flag, False),
        num_experts_per_tok=Spec(pos_int, 1),
        num_local_experts=Spec(pos_int, 16),
        moe_layers=Spec(int_list, None),
        interleave_moe_layer_step=Spec(pos_int, 1),
        use_qk_norm=Spec(flag, True),
        no_rope_layers=Spec(int_list, None),
        no_rope_layer_interval=Spec(pos_int, 4),
        attention_chunk_size=Spec(pos_int, 8192, nullable=True),  # null: no chunked layer
        # Scout's published file writes 4, which transformers 4.5x's model reads as true (`if
        # self.attn_temperature_tuning`; transformers 5's strict config refuses the int)
        attn_temperature_tuning=Spec(_flag_or_count, True),
        floor_scale=Spec(pos_int, 8192),
        attn_scale=Spec(pos_float, 0.1),
    ),
    derive=_llama4,
    windows=_llama4_window,
    reads_layer_types=True,
    default_theta=500000.0,
    layer_kinds=(FULL, CHUNKED),
    noop_only={
        # the published files' cache kind: transformers builds the same model whatever it says
        "cache_implementation": ("hybrid", None),
        # Scout's published file: a quantisation tool's switch, false in the checkpoint
        "for_llm_compressor": (False,),
    },
)


FAMILIES = {
    "llama4_text": LLAMA4_TEXT,
}

# Llama4Config (Llama-4-Scout/Maverick's published config.json): its text_config is a
# Llama4ForCausalLM inside Llama4ForConditionalGeneration (language_model.*), which keeps
# vision_model and multi_modal_projector at the top level (the Hub's Scout/Maverick index:
# vision_model.*, multi_modal_projector.linear_1.*)
MULTIMODAL = {
    "llama4": Multimodal(
        text="llama4_text",
        parts=frozenset(
            {
                "vision_config", "boi_token_index", "eoi_token_index", "image_token_index",
                "image_token_id", "boi_token_id", "eoi_token_id",
            }
        ),
        unused=(
            "vision_model.", "multi_modal_projector.", "model.vision_model.",
            "model.multi_modal_projector.",
        ),
    ),
}  # fmt: skip
