"""DeepSeek-V2/V3 and Kimi-K2 (transformers' deepseek_v2, deepseek_v3): multi-head latent
attention (MLA) and DeepSeek's MoE (grouped top-k, shared experts, dense first layers)."""

from __future__ import annotations

from graphllm.echo import shown
from graphllm.errors import ConfigError
from graphllm.models.family import Family
from graphllm.models.fields import Spec, common_fields, flag, nonneg_int, pos_float, pos_int, string
from graphllm.models.model_config import MoENames


def _deepseek_fields(version: int) -> dict[str, Spec]:
    """DeepSeek-V2/V3 fields with transformers' defaults for each version."""
    v3 = version == 3
    return {
        "num_key_value_heads": Spec(pos_int, None),  # MLA: one K/V per query head
        "head_dim": Spec(pos_int, None),  # transformers writes qk_rope_head_dim here
        "qk_head_dim": Spec(pos_int, None),  # transformers writes nope + rope here
        "max_position_embeddings": Spec(pos_int, 4096 if v3 else 2048),
        "q_lora_rank": Spec(pos_int, 1536, nullable=True),  # null: one q_proj
        "kv_lora_rank": Spec(pos_int, 512),
        "qk_nope_head_dim": Spec(pos_int, 128),
        "qk_rope_head_dim": Spec(pos_int, 64),
        "v_head_dim": Spec(pos_int, 128),
        "n_routed_experts": Spec(pos_int, 256 if v3 else 64),
        "n_shared_experts": Spec(nonneg_int, 1 if v3 else 2),
        "num_experts_per_tok": Spec(pos_int, 8 if v3 else None),
        "moe_intermediate_size": Spec(pos_int, 2048 if v3 else 1407),
        "first_k_dense_replace": Spec(nonneg_int, 3 if v3 else 0),
        "moe_layer_freq": Spec(pos_int, 1),
        "n_group": Spec(pos_int, 8 if v3 else None),
        "topk_group": Spec(pos_int, 4 if v3 else None),
        "topk_method": Spec(string, "noaux_tc" if v3 else "greedy"),
        "scoring_func": Spec(string, "sigmoid" if v3 else "softmax"),
        "routed_scaling_factor": Spec(pos_float, 2.5 if v3 else 1.0),
        "norm_topk_prob": Spec(flag, v3),
        **({"rope_interleave": Spec(flag, True)} if v3 else {}),
        **({"num_nextn_predict_layers": Spec(nonneg_int, 1)} if v3 else {}),
    }


# per version: (scoring_func, topk methods) as transformers' DeepseekV2/V3TopkRouter compute them
_DEEPSEEK_ROUTING = {
    2: ("softmax", ("greedy", "group_limited_greedy")),
    3: ("sigmoid", ("noaux_tc",)),
}


def _mla(v: dict, version: int) -> dict:
    """MLA attention fields; head_dim is the query/key head width nope + rope."""
    nope, rope, heads = v["qk_nope_head_dim"], v["qk_rope_head_dim"], v["num_attention_heads"]
    if v["num_key_value_heads"] not in (None, heads):
        raise ConfigError(
            f"num_key_value_heads {v['num_key_value_heads']} must equal num_attention_heads "
            f"{heads}: MLA expands one key and value per query head"
        )
    if v["head_dim"] not in (None, rope):
        raise ConfigError(f"head_dim {v['head_dim']} must equal qk_rope_head_dim {rope} (MLA)")
    if v["qk_head_dim"] not in (None, nope + rope):
        raise ConfigError(
            f"qk_head_dim {v['qk_head_dim']} must be qk_nope + qk_rope = {nope + rope}"
        )
    if rope % 2:
        raise ConfigError(f"qk_rope_head_dim {rope} must be even: RoPE rotates pairs of channels")
    layout = "complex" if version == 2 else ("interleave" if v["rope_interleave"] else "half")
    return {
        "q_lora_rank": v["q_lora_rank"] or 0,
        "kv_lora_rank": v["kv_lora_rank"],
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v["v_head_dim"],
        "rope_layout": layout,
        "num_nextn_predict_layers": v.get("num_nextn_predict_layers", 0),
    }


def deepseek_moe(v: dict) -> dict:
    n, first, freq = v["num_hidden_layers"], v["first_k_dense_replace"], v["moe_layer_freq"]
    version = 3 if "rope_interleave" in v else 2
    scoring, methods = _DEEPSEEK_ROUTING[version]
    if v["scoring_func"] != scoring:
        raise ConfigError(
            f"scoring_func {shown(v['scoring_func'])} is not modelled for deepseek_v{version} "
            f"(transformers computes {scoring!r})"
        )
    method = v["topk_method"]
    if method not in methods:
        raise ConfigError(
            f"topk_method {shown(method)} is not modelled for deepseek_v{version} "
            f"(modelled: {', '.join(methods)})"
        )
    e, k = v["n_routed_experts"], v["num_experts_per_tok"]
    if k is None:
        raise ConfigError("missing required field 'num_experts_per_tok'")
    groups, top_groups = v["n_group"] or 1, v["topk_group"] or 1
    if method != "greedy":
        if v["n_group"] is None or v["topk_group"] is None:
            raise ConfigError(f"topk_method {method!r} needs n_group and topk_group")
        if e % groups:
            raise ConfigError(f"n_routed_experts {e} is not divisible by n_group {groups}")
        if top_groups > groups:
            raise ConfigError(f"topk_group {top_groups} exceeds n_group {groups}")
        if top_groups * (e // groups) < k:
            raise ConfigError(
                f"topk_group {top_groups} groups of {e // groups} experts hold fewer than "
                f"num_experts_per_tok {k}"
            )
        if method == "noaux_tc" and e // groups < 2:
            raise ConfigError("noaux_tc ranks groups by their two best experts: n_group too large")
    # DeepSeek's rule (transformers reads first_k_dense_replace alone; the same when freq is 1);
    # the multi-token-prediction layers n, n+1, ... follow it too (vLLM's DeepseekV2DecoderLayer)
    rule = [i >= first and i % freq == 0 for i in range(n + v.get("num_nextn_predict_layers", 0))]
    moe = tuple(rule[:n])
    # DeepSeek-V2's own MoEGate renormalises only top-k > 1 weights, and then does not scale them
    renorm = v.get("norm_topk_prob", False) and (version == 3 or k > 1)
    return {
        "num_experts": e,
        "num_experts_per_tok": k,
        "moe_intermediate_size": v["moe_intermediate_size"],
        "intermediate_size": v["intermediate_size"] if not all(moe) else 0,
        "norm_topk_prob": renorm,
        "shared_expert_intermediate_size": v["n_shared_experts"] * v["moe_intermediate_size"],
        "moe_layers": moe,
        "mtp_moe_layers": tuple(rule[n:]),
        "moe_names": MoENames(shared="shared_experts"),  # n_shared_experts fused into one MLP
        "renorm_replaces_scaling": version == 2,
        "scoring_func": scoring,
        "topk_method": method,
        "n_group": groups if method != "greedy" else 1,
        "topk_group": top_groups if method != "greedy" else 1,
        "routed_scaling_factor": v["routed_scaling_factor"],
    }


DEEPSEEK_V2 = Family(
    common_fields(**_deepseek_fields(2)),
    derive=lambda v: _mla(v, 2),
    moe=deepseek_moe,
    aliases={"num_experts": "n_routed_experts"},
    noop_only={"attention_bias": (False,), "mlp_bias": (False,)},
    mla=True,
)

DEEPSEEK_V3 = Family(
    common_fields(**_deepseek_fields(3)),
    derive=lambda v: _mla(v, 3),
    moe=deepseek_moe,
    aliases={
        "num_local_experts": "n_routed_experts",
        "num_mtp_layers": "num_nextn_predict_layers",
    },
    noop_only={"attention_bias": (False,)},
    mla=True,
)

# Kimi-K2 (moonshotai/Kimi-K2-*) is DeepSeek-V3's architecture under a model_type of
# its own. transformers has no kimi_k2 class (its kimi_k25 rewrites a kimi_k2 text_config to
# deepseek_v3, and Moonshot's README says to do the same), so it reads as deepseek_v3 from the
# same fields with the same defaults


FAMILIES = {
    "deepseek_v2": DEEPSEEK_V2,
    "deepseek_v3": DEEPSEEK_V3,
    "kimi_k2": DEEPSEEK_V3,
}
