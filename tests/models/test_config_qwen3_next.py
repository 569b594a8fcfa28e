"""issue 19: Qwen3-Next's config: the published config.json loads as it is (preset and Hub
names), its layer pattern from full_attention_interval or layer_types, and what graphllm does
not model refused in one line."""

from __future__ import annotations

import pytest

import graphllm
from graphllm.build.builder import build_graph
from graphllm.errors import ConfigError
from graphllm.models.config import _load_preset, config_from_dict


def _published() -> dict:
    d, _ = _load_preset("qwen3-next-80b-a3b")
    return {k: v for k, v in d.items() if not k.startswith("_")}


def test_the_published_config_loads_with_its_pattern():
    cfg = config_from_dict(_published(), "q")
    assert cfg.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert cfg.layer_types.count("full_attention") == 12
    assert all(cfg.moe_layers) and cfg.num_experts == 512 and cfg.num_experts_per_tok == 10
    assert cfg.shared_expert_gate and cfg.norm_topk_prob
    assert cfg.rotary_dim == 64 and cfg.rope.theta == 1e7  # 0.25 of 256
    assert cfg.norm_weight_offset == 1.0 and cfg.attn_output_gate and cfg.qk_norm
    assert (cfg.linear_num_key_heads, cfg.linear_num_value_heads) == (16, 32)
    assert (cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.conv_kernel) == (128, 128, 4)


@pytest.mark.parametrize(
    "name", ["qwen3-next-80b-a3b", "Qwen/Qwen3-Next-80B-A3B-Instruct", "qwen3-next"]
)
def test_preset_and_hub_names(name):
    assert graphllm.load_config(name).model_type == "qwen3_next"


def test_layer_types_as_transformers_5_writes_them():
    d = _published() | {"num_hidden_layers": 4, "full_attention_interval": 2}
    a = config_from_dict(d, "a")
    b = config_from_dict(d | {"layer_types": list(a.layer_types)}, "b")
    assert a.layer_types == b.layer_types == ("linear_attention", "full_attention") * 2


def test_the_default_partial_rotary_and_its_transformers_5_spelling():
    d = _published()
    d.pop("partial_rotary_factor")
    assert config_from_dict(d, "a").rotary_dim == 64  # Qwen3NextConfig's default 0.25
    d.pop("rope_theta")
    d["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5}
    assert config_from_dict(d, "b").rotary_dim == 128


def test_unmodelled_fields_are_named_in_one_line():
    d = _published() | {"use_sliding_window": True, "sliding_window": 4096, "attn_scale": 2.0}
    with pytest.raises(ConfigError) as e:
        config_from_dict(d, "q")
    msg = str(e.value)
    assert "\n" not in msg
    for key in ("use_sliding_window", "sliding_window", "attn_scale"):
        assert key in msg


def test_a_layer_kind_it_has_not_is_refused():
    d = _published() | {"num_hidden_layers": 2, "layer_types": ["sliding_attention"] * 2}
    with pytest.raises(ConfigError, match="'full_attention' and 'linear_attention' for qwen3_next"):
        config_from_dict(d, "q")


def test_value_heads_a_multiple_of_key_heads():
    with pytest.raises(ConfigError, match="30 linear value heads are not a multiple of 16"):
        config_from_dict(_published() | {"linear_num_value_heads": 30}, "q")


def test_the_checkpoints_mtp_layer_is_declared_for_mtp():
    """The config names no MTP layer; the checkpoint has one (mtp.layers.0, attention + MoE),
    which --mtp builds (tests/build/test_mtp_qwen3_next.py)."""
    cfg = graphllm.load_config("qwen3-next-80b-a3b")
    assert (cfg.num_nextn_predict_layers, cfg.mtp_moe_layers, cfg.mtp_layout) == (1, (True,), "mtp")
    dense_first = config_from_dict(_published() | {"mlp_only_layers": [0]}, "q")
    assert dense_first.mtp_moe_layers == (False,)  # the MTP block follows layer 0's rule
    assert "mtp.layers.0.mlp.gate_proj.weight" in build_graph(dense_first.with_layers(4), mtp=True)
