"""Mixtral (transformers' mixtral: MixtralConfig, MixtralSparseMoeBlock): Mistral's
attention, every layer an MoE of num_local_experts experts."""

from __future__ import annotations

from graphllm.models.family import Family, every_layer_routes, every_layer_window
from graphllm.models.fields import Spec, common_fields, nonneg_int, pos_float, pos_int
from graphllm.models.model_config import MoENames


def mixtral_moe(v: dict) -> dict:
    # every layer routes, and the top-k weights are always renormalised to sum to 1
    return every_layer_routes(v) | {
        "norm_topk_prob": True,
        "moe_names": MoENames(
            block="block_sparse_moe", expert_gate="w1", expert_up="w3", expert_down="w2"
        ),
    }


MIXTRAL = Family(
    common_fields(
        max_position_embeddings=Spec(pos_int, 131072),
        rms_norm_eps=Spec(pos_float, 1e-5),
        sliding_window=Spec(nonneg_int, None, nullable=True),
        num_local_experts=Spec(pos_int),
        num_experts_per_tok=Spec(pos_int),
    ),
    derive=lambda v: {},
    windows=every_layer_window,
    moe=mixtral_moe,
    default_theta=1e6,
    aliases={"num_experts": "num_local_experts"},
)


FAMILIES = {
    "mixtral": MIXTRAL,
}
