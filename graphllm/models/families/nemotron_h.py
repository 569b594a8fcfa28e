"""Nemotron-H and Nemotron-3-Nano (transformers' nemotron_h): Mamba2, attention, MLP and MoE
layers, one mixer a layer."""

from __future__ import annotations

import math

from graphllm.echo import shown
from graphllm.errors import ConfigError
from graphllm.models.family import FULL, Family
from graphllm.models.fields import (
    COMMON,
    Spec,
    any_value,
    dt_limit,
    flag,
    nonneg_int,
    pos_float,
    pos_int,
    str_list,
    string,
)
from graphllm.models.model_config import BlockLayout, MoENames, check_size
from graphllm.models.parse import json_float, show

# Nemotron-H and Nemotron-3-Nano (transformers' nemotron_h: NemotronHConfig,
# NemotronHBlock, NemotronHMamba2Mixer, NemotronHAttention, NemotronHMLP, NemotronHMoE). Each
# layer is ONE mixer behind its own RMSNorm and residual: Mamba2 (M), attention without RoPE (*),
# a relu^2 MLP (-) or an MoE of relu^2 experts with a shared one (E), as the published
# `hybrid_override_pattern` string or transformers 5's `layers_block_type` list
# ("linear_attention" there is a Mamba2 layer) gives them.
_NEMOTRON_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_NEMOTRON_LAYER = {  # layers_block_type -> (layer_types entry, layer_blocks entry)
    "linear_attention": ("mamba2", "mixer"),
    "full_attention": (FULL, "mixer"),
    # an FFN layer has no mixer; its layer_types entry is not read
    "mlp": (FULL, "ffn"),
    "moe": (FULL, "ffn"),
}
_NEMOTRON_MTP = ("num_nextn_predict_layers", "mtp_layers_block_type", "mtp_hybrid_override_pattern")


def _nemotron_prepare(v: dict) -> dict:
    pattern, listed = v["hybrid_override_pattern"], v["layers_block_type"]
    if pattern is not None:
        bad = sorted(set(pattern) - set(_NEMOTRON_PATTERN))
        if bad:
            raise ConfigError(
                f"hybrid_override_pattern has {shown(bad[0])}; Nemotron-H's layers are "
                "M (Mamba2), * (attention), - (MLP) and E (MoE)"
            )
        from_pattern = [_NEMOTRON_PATTERN[ch] for ch in pattern]
        if listed is not None and list(listed) != from_pattern:
            raise ConfigError("layers_block_type disagrees with hybrid_override_pattern")
        listed = from_pattern
    if listed is None:
        listed = ["linear_attention", "moe", "full_attention", "mlp"]  # NemotronHConfig's
    bad = [t for t in listed if t not in _NEMOTRON_LAYER]
    if bad:
        raise ConfigError(
            f"layers_block_type has {shown(bad[0])}; Nemotron-H's layers are "
            f"{', '.join(map(repr, _NEMOTRON_LAYER))}"
        )
    if not listed:
        raise ConfigError("layers_block_type is empty")
    n = v["num_hidden_layers"]
    if n is not None and n != len(listed):
        raise ConfigError(
            f"num_hidden_layers {n} disagrees with the {len(listed)} layers of the layer pattern"
        )
    check_size("num_hidden_layers", len(listed))
    # Nemotron-H-8B's config names the head width attention_head_dim (NVIDIA's remote code reads
    # it; transformers 5 reads head_dim, 128 by default): one width, or the two models differ
    width = v["attention_head_dim"]
    if width is not None and width != v["head_dim"]:
        raise ConfigError(
            f"attention_head_dim {width} disagrees with head_dim {v['head_dim']} "
            "(transformers reads head_dim, NVIDIA's remote code attention_head_dim)"
        )
    return v | {"layers_block_type": listed, "num_hidden_layers": len(listed)}


def _nemotron_unmodelled(given: dict) -> list[str]:
    out = []
    mtp = given.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp > 0:
        # the MTP layers' fields are transformers' defaults (it writes them) unless MTP is on
        named = [k for k in _NEMOTRON_MTP if given.get(k) is not None]
        out.append(f"Nemotron-H's MTP layers ({', '.join(named)}) are not modelled")
    if given.get("moe_latent_size") is not None:
        out.append(
            f"moe_latent_size={show(given['moe_latent_size'])} is not modelled (only null: "
            "the latent MoE projections fc1/fc2_latent_proj)"
        )
    limit = given.get("time_step_limit")
    if isinstance(limit, (list, tuple)):
        limit = [json_float(x) for x in limit]
    high = limit[1] if isinstance(limit, list) and len(limit) == 2 else None
    if isinstance(high, (int, float)) and not isinstance(high, bool) and math.isfinite(high):
        out.append(
            f"time_step_limit={show(list(limit))} is not modelled (a finite upper bound on "
            "dt; only [low, Infinity])"
        )
    act = given.get("mamba_hidden_act")
    if act is not None and act != "silu":
        out.append(f"mamba_hidden_act={show(act)} is not modelled (only 'silu')")
    return out


def _nemotron_layers(v: dict) -> tuple[tuple[str, ...], int | None]:
    return tuple(_NEMOTRON_LAYER[t][0] for t in v["layers_block_type"]), None


def _nemotron_moe(v: dict) -> dict:
    # NemotronHTopkRouter: DeepSeek-V3's noaux_tc (sigmoid scores, the stored correction bias
    # chooses, groups ranked by their two best), renormalised and scaled; NemotronHExperts: up
    # and down only (mlp_gated False), stored one tensor per expert; one shared MLP of moe_shared_expert_intermediate_size
    # whatever n_shared_experts says (transformers builds one)
    e, groups, top = v["n_routed_experts"], v["n_group"], v["topk_group"]
    if e % groups:
        raise ConfigError(f"n_routed_experts {e} is not divisible by n_group {groups}")
    if top > groups:
        raise ConfigError(f"topk_group {top} exceeds n_group {groups}")
    if groups > 1 and e // groups < 2:
        raise ConfigError("noaux_tc ranks groups by their two best experts: n_group too large")
    moe = tuple(t == "moe" for t in v["layers_block_type"])
    return {
        "num_experts": e,
        "num_experts_per_tok": v["num_experts_per_tok"],
        "moe_intermediate_size": v["moe_intermediate_size"],
        "norm_topk_prob": v["norm_topk_prob"],
        "shared_expert_intermediate_size": v["moe_shared_expert_intermediate_size"],
        "moe_layers": moe,
        "moe_names": MoENames(block="mixer", expert_up="up_proj", shared="shared_experts"),
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "n_group": groups,
        "topk_group": top,
        "routed_scaling_factor": v["routed_scaling_factor"],
    }


def _nemotron_h(v: dict) -> dict:
    types = v["layers_block_type"]
    n = len(types)
    dense = v["intermediate_size"] if "mlp" in types else 0  # only NemotronHMLP reads it
    return {
        "intermediate_size": dense,
        "mlp_bias": v["mlp_bias"],
        "rms_norm_eps": v["layer_norm_epsilon"],
        "layer_blocks": tuple(_NEMOTRON_LAYER[t][1] for t in types),
        "rope_layers": (False,) * n,  # NemotronHAttention has no rotary embedding
        # NVIDIA's checkpoints' names, which transformers 5's save_pretrained writes back
        "layers_prefix": "backbone.layers",
        "attention_name": "mixer",
        "mlp_name": "mixer",
        "embedding_name": "backbone.embeddings",
        "final_norm_name": "backbone.norm_f",
        "mlp_gated": False,
        "mamba_num_heads": v["mamba_num_heads"],
        "mamba_head_dim": v["mamba_head_dim"],
        "ssm_state_size": v["ssm_state_size"],
        "mamba_n_groups": v["n_groups"],
        "conv_kernel": v["conv_kernel"],
        "mamba_chunk_size": v["chunk_size"],
        "mamba_conv_bias": v["use_conv_bias"],
        "mamba_proj_bias": v["use_bias"],
        # transformers >= 5.25's NemotronHMamba2Mixer clamps dt at the config's time_step_limit
        # in its chunked scan (mamba_ssm's dt_limit), not in its recurrent step; before 5.25 it
        # took (time_step_min, inf) whatever the config said. time_step_min only initialises
        "mamba_dt_min": v["time_step_limit"][0],
    }


NEMOTRON_H = Family(
    {
        **{k: s for k, s in COMMON.items() if k not in ("layer_types", "rms_norm_eps")},
        "vocab_size": Spec(pos_int, 131072),
        "hidden_size": Spec(pos_int, 4096),
        "num_hidden_layers": Spec(pos_int, None),
        "num_attention_heads": Spec(pos_int, 32),
        "num_key_value_heads": Spec(pos_int, 8),
        "head_dim": Spec(pos_int, 128),
        "attention_head_dim": Spec(pos_int, None),
        "intermediate_size": Spec(pos_int, 21504),
        "max_position_embeddings": Spec(pos_int, 4096),
        "hybrid_override_pattern": Spec(string, None),
        "layers_block_type": Spec(str_list, None),
        "layer_norm_epsilon": Spec(pos_float, 1e-5),
        "mlp_hidden_act": Spec(string, "relu2"),
        "mlp_bias": Spec(flag, False),
        "use_bias": Spec(flag, False),
        "mamba_num_heads": Spec(pos_int, 128),
        "mamba_head_dim": Spec(pos_int, 64),
        "ssm_state_size": Spec(pos_int, 128),
        "n_groups": Spec(pos_int, 8),
        "conv_kernel": Spec(pos_int, 4),
        "chunk_size": Spec(pos_int, 128),
        "use_conv_bias": Spec(flag, True),
        "mamba_hidden_act": Spec(string, "silu"),
        "time_step_limit": Spec(dt_limit, (0.0, math.inf)),
        "n_routed_experts": Spec(pos_int, 8),
        "num_experts_per_tok": Spec(pos_int, 2),
        "moe_intermediate_size": Spec(pos_int, 7688),
        "moe_shared_expert_intermediate_size": Spec(pos_int, 7688),
        "norm_topk_prob": Spec(flag, True),
        "routed_scaling_factor": Spec(pos_float, 1.0),
        "n_group": Spec(pos_int, 1),
        "topk_group": Spec(pos_int, 1),
        "moe_latent_size": Spec(pos_int, None),
        "num_nextn_predict_layers": Spec(nonneg_int, 0),
        "mtp_layers_block_type": Spec(str_list, None),
        "mtp_hybrid_override_pattern": Spec(string, None),
        # not read by NemotronHForCausalLM (initialisation, kernels, the bf16 residual dtype,
        # a derived width that mamba_num_heads * mamba_head_dim replaces, a count the one shared
        # MLP ignores, the published configs' second spelling of the norm's epsilon, Mamba 1's
        # dt projection rank that the 8K-context checkpoints still carry)
        **{
            k: Spec(any_value, None)
            for k in (
                "expand",
                "time_step_min",
                "time_step_max",
                "time_step_floor",
                "time_step_rank",
                "use_mamba_kernels",
                "mamba_ssm_cache_dtype",
                "residual_in_fp32",
                "rescale_prenorm_residual",
                "hidden_dropout",
                "num_logits_to_keep",
                "n_shared_experts",
                "moe_shared_expert_overlap",
                "norm_eps",
                "rms_norm_eps",
            )
        },
    },
    derive=_nemotron_h,
    windows=_nemotron_layers,
    moe=_nemotron_moe,
    acts={"relu2": "relu2"},
    act_field="mlp_hidden_act",
    layer_kinds=(),
    aliases={
        "layer_types": "layers_block_type",
        "num_local_experts": "n_routed_experts",
        # NemotronHConfig's older spellings (its __post_init__ renames them)
        "mamba_n_groups": "n_groups",
        "mamba_d_conv": "conv_kernel",
        "mamba_expand": "expand",
        "mamba_dt_min": "time_step_min",
        "mamba_dt_max": "time_step_max",
        "mamba_dt_limit": "time_step_limit",
        "mamba_dt_init_floor": "time_step_floor",
        "mamba_conv_bias": "use_conv_bias",
        "mamba_chunk_size": "chunk_size",
    },
    noop_only={
        # NemotronHAttention builds q/k/v/o without biases whatever attention_bias says, and
        # the mixer reads use_bias, not mamba_proj_bias: accepted where they agree
        "attention_bias": (False,),
        "mamba_proj_bias": (False,),
        "sliding_window": (None,),
    },
    unmodelled=_nemotron_unmodelled,
    prepare=_nemotron_prepare,
    block=BlockLayout(attention_pre="norm", ffn_pre="norm", one_sublayer=True),
)


FAMILIES = {
    "nemotron_h": NEMOTRON_H,
}
