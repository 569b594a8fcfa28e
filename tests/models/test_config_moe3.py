"""issue 18: the published GLM-4.5, Kimi-K2 and MiniMax-M2 configs load as they are, by preset
name and the Hub's; what graphllm does not model is refused, every such field in one line."""

import json

import pytest

from graphllm.errors import ConfigError
from graphllm.models.config import PRESETS_DIR, config_from_dict, load_config, preset_name


def _published(preset: str) -> dict:
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text())
    return {k: v for k, v in d.items() if not k.startswith("_")}


@pytest.mark.parametrize(
    ("alias", "preset"),
    [("GLM-4.5", "glm4.5"), ("GLM-4.5-Air", "glm4.5-air"), ("Kimi-K2-Instruct", "kimi-k2")],
)
def test_the_hubs_names_are_aliases(alias, preset):
    assert preset_name(alias) == preset and load_config(alias).name == preset


def test_glm_fields_resolve_as_transformers_reads_them():
    c = load_config("glm4.5")
    assert (c.rotary_dim, c.qkv_bias, c.o_bias, c.qk_norm, c.qk_norm_scope) == (
        64,
        True,
        False,
        True,
        "head",
    )
    assert c.moe_layers == (False,) * 3 + (True,) * 89 and c.mtp_moe_layers == (True,)
    assert (c.scoring_func, c.topk_method, c.routed_scaling_factor) == ("sigmoid", "noaux_tc", 2.5)
    assert c.shared_expert_intermediate_size == 1536 and c.norm_topk_prob
    assert not load_config("glm4.5-air").qk_norm


def test_kimi_is_deepseek_v3_from_the_same_fields():
    kimi = load_config("kimi-k2")
    as_v3 = config_from_dict(_published("kimi-k2") | {"model_type": "deepseek_v3"}, "kimi-k2")
    assert kimi.model_type == "kimi_k2"
    assert {**vars(kimi), "model_type": ""} == {**vars(as_v3), "model_type": ""}
    assert (kimi.num_experts, kimi.is_mla, kimi.num_nextn_predict_layers) == (384, True, 0)


def test_minimax_fields_resolve_as_transformers_reads_them():
    c = load_config("minimax-m2")
    assert (c.rotary_dim, c.qk_norm_scope, c.num_experts, c.shared_expert_intermediate_size) == (
        64,
        "projection",
        256,
        0,
    )
    assert c.moe_names.correction_bias == "e_score_correction_bias" and all(c.moe_layers)


def test_every_unmodelled_minimax_feature_is_named_in_one_line():
    d = _published("minimax-m2") | {
        "use_routing_bias": False,
        "shared_intermediate_size": 512,
        "qk_norm_type": "per_head",
        "lightning_block": 256,
    }
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, "m")
    msg = str(e.value)
    assert "\n" not in msg
    for part in (
        "use_routing_bias=false",
        "shared_intermediate_size=512",
        "qk_norm_type",
        "lightning_block",
    ):
        assert part in msg, part


def test_minimax_linear_attention_layers_are_refused():
    d = _published("minimax-m2") | {"attn_type_list": [0] + [1] * 61}
    with pytest.raises(ConfigError, match="attn_type_list has 0: MiniMax-M2 is modelled with full"):
        config_from_dict(d, "m")


def test_glm_refuses_another_routing_in_one_line():
    d = _published("glm4.5") | {"scoring_func": "softmax", "topk_method": "greedy"}
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, "g")
    assert "scoring_func" in str(e.value) and "topk_method" in str(e.value)


# issue 18 audit: every unmodelled field in one line, whichever check finds it
def test_minimax_linear_attention_layers_join_the_other_unmodelled_fields():
    d = _published("minimax-m2") | {"attn_type_list": [0] + [1] * 61, "hidden_act": "gelu"}
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, "m")
    assert "attn_type_list has 0" in str(e.value) and "hidden_act 'gelu'" in str(e.value)


def test_a_wrappers_unknown_keys_and_its_text_configs_are_named_together():
    d = _published("llama4-scout")
    d = d | {"vision_tower_v2": 1, "text_config": d["text_config"] | {"hidden_act": "gelu"}}
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, "s")
    msg = str(e.value)
    assert "'vision_tower_v2'" in msg and "text_config: hidden_act 'gelu'" in msg
    assert "\n" not in msg
