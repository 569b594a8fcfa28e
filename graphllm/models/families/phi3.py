"""Phi-3 / Phi-3.5 / Phi-4-mini (transformers' phi3): fused qkv and gate_up projections,
longrope, partial rotary."""

from __future__ import annotations

from graphllm.models.family import Family, every_layer_window
from graphllm.models.fields import MHA, Spec, common_fields, nonneg_int, pos_float, pos_int

PHI3 = Family(
    common_fields(
        num_key_value_heads=MHA,
        max_position_embeddings=Spec(pos_int, 4096),
        rms_norm_eps=Spec(pos_float, 1e-5),
        sliding_window=Spec(nonneg_int, None, nullable=True),
        # longrope's pre-scaling context (transformers prefers it to the rope section's)
        original_max_position_embeddings=Spec(pos_int, 4096),
        partial_rotary_factor=Spec(pos_float, None),  # Phi-4-mini: 0.75
    ),
    derive=lambda v: {"fused_qkv": True, "fused_gate_up": True},
    windows=every_layer_window,
    rope_types=("default", "longrope"),  # transformers' phi3 knows only these
    partial_rotary=True,
    noop_only={
        "attention_bias": (False,),  # published 4.x configs carry it; never a bias
        # Phi-4-mini's config carries these at the values transformers' Phi3 computes:
        # no bias in the MLP or on the LM head, every layer full attention
        # (full_attn_mod 1), no position interpolation (interpolate_factor 1)
        "mlp_bias": (False,),
        "lm_head_bias": (False,),
        "full_attn_mod": (1,),
        "interpolate_factor": (1,),
    },
    genai_type="phi3",
)


FAMILIES = {
    "phi3": PHI3,
}
