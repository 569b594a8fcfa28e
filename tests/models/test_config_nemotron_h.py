"""issue 19: Nemotron-H's config as NVIDIA publishes it (`hybrid_override_pattern`) and as
transformers 5 writes it (`layers_block_type`), and what is refused in one line."""

import pytest

from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict
from tests.support.nemotron_configs import NANO_30B_A3B


def test_published_nano_config_loads_its_layer_pattern():
    c = config_from_dict(NANO_30B_A3B, "nano")
    pattern = NANO_30B_A3B["hybrid_override_pattern"]
    assert c.num_hidden_layers == len(pattern) == 52
    assert [c.layer_type(i) == "mamba2" for i in range(52)] == [ch == "M" for ch in pattern]
    assert c.layer_blocks == tuple("mixer" if ch in "M*" else "ffn" for ch in pattern)
    assert c.moe_layers == tuple(ch == "E" for ch in pattern)
    assert (pattern.count("M"), pattern.count("E"), pattern.count("*")) == (23, 23, 6)
    # the attention layers have no RoPE; every layer one norm, the mixer's and the FFN's
    assert not any(c.rotates(i) for i in range(52))
    assert (c.block.attention_pre, c.block.ffn_pre, c.block.one_sublayer) == ("norm", "norm", True)
    assert (c.mamba_num_heads, c.mamba_head_dim, c.ssm_state_size, c.mamba_n_groups) == (
        64,
        64,
        128,
        8,
    )
    # no time_step_limit in the published config: its default [0, Infinity], no clamp
    assert (c.conv_kernel, c.mamba_chunk_size, c.mamba_conv_bias, c.mamba_dt_min) == (
        4,
        128,
        True,
        0.0,
    )
    # transformers 5's mixer is mamba_num_heads * mamba_head_dim wide; `expand` is not read
    assert c.mamba_inner == 4096 != NANO_30B_A3B["expand"] * NANO_30B_A3B["hidden_size"]
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (128, 6, 1856)
    assert (c.shared_expert_intermediate_size, c.routed_scaling_factor) == (3712, 2.5)
    assert (c.scoring_func, c.topk_method, c.norm_topk_prob) == ("sigmoid", "noaux_tc", True)
    assert c.hidden_act == "relu2" and not c.mlp_gated
    # no "-" layer: no dense MLP is built, so none is counted
    assert c.intermediate_size == 0
    assert (c.layers_prefix, c.embedding_name, c.final_norm_name) == (
        "backbone.layers",
        "backbone.embeddings",
        "backbone.norm_f",
    )


def test_the_list_transformers_writes_is_the_same_config():
    pattern = NANO_30B_A3B["hybrid_override_pattern"]
    names = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
    as_list = {k: v for k, v in NANO_30B_A3B.items() if k != "hybrid_override_pattern"}
    as_list["layers_block_type"] = [names[ch] for ch in pattern]
    assert config_from_dict(as_list, "nano") == config_from_dict(NANO_30B_A3B, "nano")
    # transformers' attribute_map spelling
    as_types = {k: v for k, v in as_list.items() if k != "layers_block_type"}
    as_types["layer_types"] = as_list["layers_block_type"]
    assert config_from_dict(as_types, "nano") == config_from_dict(NANO_30B_A3B, "nano")


def test_older_field_spellings_are_the_same_fields():
    old = {k: v for k, v in NANO_30B_A3B.items() if k not in ("n_groups", "conv_kernel")}
    old |= {"mamba_n_groups": 8, "mamba_d_conv": 4}
    assert config_from_dict(old, "nano") == config_from_dict(NANO_30B_A3B, "nano")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"num_nextn_predict_layers": 1, "mtp_hybrid_override_pattern": "*E"},
            r"MTP layers \(num_nextn_predict_layers, mtp_hybrid_override_pattern\) are not",
        ),
        ({"moe_latent_size": 1024}, "moe_latent_size=1024 is not modelled"),
        ({"mamba_hidden_act": "gelu"}, 'mamba_hidden_act="gelu" is not modelled'),
        ({"mlp_hidden_act": "silu"}, "mlp_hidden_act"),
        ({"hybrid_override_pattern": "M*X"}, "hybrid_override_pattern has 'X'"),
        ({"num_hidden_layers": 50}, "num_hidden_layers 50 disagrees with the 52 layers"),
        ({"sliding_window": 1024}, "sliding_window=1024 is not modelled"),
        ({"attention_bias": True}, "attention_bias=true is not modelled"),
        ({"layers_block_type": ["mlp"]}, "layers_block_type disagrees"),
        ({"n_routed_experts": 130, "n_group": 4}, "n_routed_experts 130 is not divisible"),
        ({"time_step_limit": [0.0, 0.1]}, r"time_step_limit=\[0.0, 0.1\] is not modelled"),
        ({"time_step_limit": [0.5, 0.1]}, "time_step_limit"),
        ({"time_step_limit": "wide"}, "time_step_limit must be"),
    ],
)
def test_refused_in_one_line(change, message):
    with pytest.raises(ConfigError, match=message) as e:
        config_from_dict(NANO_30B_A3B | change, "x")
    assert "\n" not in str(e.value)


def test_every_unmodelled_feature_in_one_line():
    with pytest.raises(ConfigError) as e:
        config_from_dict(
            NANO_30B_A3B | {"num_nextn_predict_layers": 1, "moe_latent_size": 1024}, "x"
        )
    assert "MTP layers" in str(e.value) and "moe_latent_size" in str(e.value)


@pytest.mark.parametrize("model_type", ["falcon_h1", "granitemoehybrid"])
def test_other_mamba2_hybrids_are_refused_by_name(model_type):
    with pytest.raises(ConfigError, match="not modelled yet; nemotron_h's Mamba2 layers are"):
        config_from_dict({"model_type": model_type}, "x")


def test_mamba_heads_must_fill_the_groups():
    with pytest.raises(ConfigError, match="mamba_num_heads 60 is not a multiple of n_groups 8"):
        config_from_dict(NANO_30B_A3B | {"mamba_num_heads": 60}, "x")


def test_dt_is_clamped_at_time_step_limits_floor_not_at_time_step_min():
    """transformers >= 5.25 clamps the chunked scan's dt at time_step_limit (mamba_ssm's
    dt_limit); time_step_min only initialises dt_bias. Published configs leave the limit at its
    default [0, Infinity], which save_pretrained writes as {"__float__": "Infinity"}."""
    assert config_from_dict(NANO_30B_A3B, "nano").mamba_dt_min == 0.0
    written = [0.001, {"__float__": "Infinity"}]
    cfg = config_from_dict(NANO_30B_A3B | {"time_step_limit": written}, "nano")
    assert cfg.mamba_dt_min == 0.001
    moved = config_from_dict(NANO_30B_A3B | {"time_step_min": 0.01}, "nano")
    assert moved.mamba_dt_min == 0.0


def test_a_yaml_configs_infinite_limit_is_written_as_transformers_writes_it(tmp_path):
    """YAML's .inf is refused (no other field may be infinite), with the spelling that loads."""
    import yaml

    from graphllm.models.config import load_config

    bad = tmp_path / "nano.yaml"
    bad.write_text(yaml.safe_dump(NANO_30B_A3B) + "time_step_limit: [0.001, .inf]\n")
    with pytest.raises(
        ConfigError, match=r'\.inf is not a finite number; .*\{__float__: "Infinity"\}'
    ):
        load_config(bad)
    good = tmp_path / "nano2.yaml"
    good.write_text(
        yaml.safe_dump(NANO_30B_A3B) + 'time_step_limit: [0.001, {__float__: "Infinity"}]\n'
    )
    assert load_config(good).mamba_dt_min == 0.001
