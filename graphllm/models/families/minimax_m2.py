"""MiniMax-M2 (transformers' minimax_m2)."""

from __future__ import annotations

from graphllm.errors import ConfigError
from graphllm.models.families.mixtral import mixtral_moe
from graphllm.models.family import Family
from graphllm.models.fields import (
    Spec,
    common_fields,
    flag,
    int_list,
    nonneg_int,
    pos_float,
    pos_int,
)
from graphllm.models.model_config import MoENames
from graphllm.models.parse import show


def _minimax_m2_moe(v: dict) -> dict:
    # MiniMaxM2SparseMoeBlock: Mixtral's block with sigmoid scores, the block's
    # e_score_correction_bias added to choose the top-k, the unbiased scores of the chosen ones
    # renormalised to weight them; every layer routes, no shared expert
    names = MoENames(
        block="block_sparse_moe",
        expert_gate="w1",
        expert_up="w3",
        expert_down="w2",
        correction_bias="e_score_correction_bias",
    )
    return mixtral_moe(v) | {
        "moe_names": names,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
    }


def _minimax_m2_unmodelled(given: dict) -> list[str]:
    # a layer of another attention type (0: MiniMax-Text-01's lightning attention) is a feature,
    # named with the config's other unmodelled fields
    types = given.get("attn_type_list")
    # a value of the wrong kind is the field check's to refuse
    bad = sorted({t for t in types if type(t) is int and t != 1}) if isinstance(types, list) else []
    if bad:
        return [
            f"attn_type_list has {show(bad[0])}: MiniMax-M2 is modelled with full attention (1) "
            "in every layer, as transformers' minimax_m2 builds it"
        ]
    return []


def _minimax_m2(v: dict) -> dict:
    if v["attn_type_list"] is not None and len(v["attn_type_list"]) != v["num_hidden_layers"]:
        raise ConfigError(
            f"attn_type_list has {len(v['attn_type_list'])} entries for "
            f"{v['num_hidden_layers']} hidden layers"
        )
    rot = v["rotary_dim"]
    if rot is not None:
        # MiniMaxM2Config.convert_rope_params_to_dict: the released checkpoints' rotary_dim is
        # partial_rotary_factor = rotary_dim / head_dim
        prf = rot / v["head_dim"]
        if v["partial_rotary_factor"] not in (None, prf):
            raise ConfigError(
                f"rotary_dim {rot} disagrees with partial_rotary_factor {v['partial_rotary_factor']}"
            )
        v["partial_rotary_factor"] = prf
    # MiniMaxM2Attention (FlexOlmo's): RMSNorms over the whole q and k projections before the
    # head split, no biases
    return {"qk_norm": True, "qk_norm_scope": "projection"}


# MiniMax-M2 (transformers' minimax_m2: MiniMaxM2Config, MiniMaxM2Attention,
# MiniMaxM2SparseMoeBlock): GQA with QK-norm over the full projection width, partial rotate-half
# RoPE (rotary_dim), sigmoid routing with a correction bias over 256 experts. The published
# config's MTP modules (use_mtp, num_mtp_modules, mtp_transformer_layers) are not part of the main
# model, and transformers has no module for them: they are accepted and left out
MINIMAX_M2 = Family(
    common_fields(
        head_dim=Spec(pos_int, 128),
        max_position_embeddings=Spec(pos_int, 196608),
        num_local_experts=Spec(pos_int, 256),
        num_experts_per_tok=Spec(pos_int, 8),
        rotary_dim=Spec(pos_int, None),
        partial_rotary_factor=Spec(pos_float, None),
        attn_type_list=Spec(int_list, None),
        # the published file's width of a dense MLP that no MiniMax-M2 layer has
        mlp_intermediate_size=Spec(pos_int, None),
        use_mtp=Spec(flag, False),
        num_mtp_modules=Spec(nonneg_int, 0),
        mtp_transformer_layers=Spec(nonneg_int, 1),
    ),
    derive=_minimax_m2,
    moe=_minimax_m2_moe,
    unmodelled=_minimax_m2_unmodelled,
    partial_rotary=True,
    default_theta=5e6,
    aliases={"num_experts": "num_local_experts"},
    # the published file's names for what transformers' minimax_m2 always computes
    noop_only={
        "scoring_func": ("sigmoid",),
        "use_routing_bias": (True,),
        "use_qk_norm": (True,),
        "qk_norm_type": ("per_layer",),
        "shared_intermediate_size": (0,),
        "shared_moe_mode": ("sigmoid",),
        "sliding_window": (None,),
        "attention_bias": (False,),
        "layernorm_full_attention_beta": (1.0,),
        "layernorm_linear_attention_beta": (1.0,),
        "layernorm_mlp_beta": (1.0,),
    },
)


FAMILIES = {
    "minimax_m2": MINIMAX_M2,
}
