"""ModelConfig's own checks and defaults, the family table's resolution of the block layout, the
MoE names and the routing quirks into fields, and the round trip through JSON (ONNX metadata)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from graphllm.build.builder import build_graph
from graphllm.errors import ConfigError
from graphllm.models.config import load_config, preset_names
from graphllm.models.model_config import BlockLayout, ModelConfig, MoENames, config_from_fields

SIZES = {
    "name": "tiny",
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 48,
}


def test_per_layer_fields_default_to_full_attention_dense_and_rope_everywhere():
    c = ModelConfig(**SIZES)
    assert c.layer_types == ("full_attention",) * 3 and c.moe_layers == (False,) * 3
    assert c.rope_layers == () and all(c.rotates(i) for i in range(3))
    assert c.block == BlockLayout() and c.moe_names == MoENames()
    nope = ModelConfig(**SIZES, rope_layers=(True, True, False))
    assert [nope.rotates(i) for i in range(3)] == [True, True, False]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rope_layers": (True, False)}, "rope_layers has 2 entries for 3 hidden layers"),
        ({"layer_types": ("full_attention",) * 4}, "layer_types has 4 entries for 3"),
        ({"moe_layers": (True,)}, "moe_layers has 1 entries for 3"),
        ({"layer_types": ("sparse_attention",) * 3}, "layer_types has 'sparse_attention'"),
        # issue 19: a linear-attention layer needs its heads, widths and conv kernel
        ({"layer_types": ("linear_attention",) * 3}, "linear heads, their widths or conv_kernel"),
        # issue 16: a chunked layer needs its chunk size
        (
            {"layer_types": ("chunked_attention",) * 3},
            "chunked_attention layers but attention_chunk_size is unset",
        ),
        (
            {"kv_lora_rank": 16, "qk_rope_head_dim": 4, "rope_layers": (True, False, True)},
            "an MLA layer always rotates",
        ),
        ({"block": {"ffn_pre": None}}, "block must be a BlockLayout"),
    ],
)
def test_a_config_that_contradicts_itself_is_one_line(fields, message):
    with pytest.raises(ConfigError, match=message):
        ModelConfig(**SIZES, **fields)


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"attention_post": "input_layernorm"}, "two norms are both named 'input_layernorm'"),
        # Llama's name for the FFN's pre-norm is taken by the attention's post-norm (Gemma 2
        # names it pre_feedforward_layernorm)
        (
            {"attention_post": "post_attention_layernorm"},
            "two norms are both named 'post_attention_layernorm'",
        ),
        ({"ffn_pre": ""}, "a norm's name must be a non-empty string"),
        ({"ffn_post": 3}, "a norm's name must be a non-empty string, got 3"),
    ],
)
def test_a_block_layout_names_each_norm_once(layout, message):
    with pytest.raises(ConfigError, match=message):
        BlockLayout(**layout)


def test_a_cut_config_stays_valid():
    # the per-layer tuples given, rope_layers left empty: every layer rotates
    c = dataclasses.replace(
        load_config("llama3-8b"),
        num_hidden_layers=2,
        layer_types=("full_attention",) * 2,
        moe_layers=(False,) * 2,
    )
    assert build_graph(c).meta["blocks"] == [
        "model.layers.0.mlp_residual",
        "model.layers.1.mlp_residual",
    ]


# the families whose block is not Llama's (issue 16), as transformers' decoder layers have them
BLOCKS = {
    "olmo2": BlockLayout(
        attention_pre=None,
        attention_post="post_attention_layernorm",
        ffn_pre=None,
        ffn_post="post_feedforward_layernorm",
    ),
    "cohere": BlockLayout(ffn_pre=None, parallel=True),
    "cohere2": BlockLayout(ffn_pre=None, parallel=True),
    # a norm before and after each sub-layer
    "gemma2": BlockLayout(
        attention_post="post_attention_layernorm",
        ffn_pre="pre_feedforward_layernorm",
        ffn_post="post_feedforward_layernorm",
    ),
}
BLOCKS["gemma3_text"] = BLOCKS["gemma2"]
# issue 19: one mixer or one FFN per layer, behind its own norm
BLOCKS["nemotron_h"] = BlockLayout(attention_pre="norm", ffn_pre="norm", one_sublayer=True)


@pytest.mark.parametrize("preset", preset_names())
def test_every_family_here_is_llamas_block_with_rope_everywhere(preset):
    c = load_config(preset)
    assert c.block == BLOCKS.get(c.model_type, BlockLayout())
    # SmolLM3's every 4th layer and Cohere 2's global layers have no RoPE (issue 16)
    if c.model_type == "cohere2":
        assert c.rope_layers == tuple(t == "sliding_attention" for t in c.layer_types)
    elif c.model_type == "llama4_text":  # issue 18: every 4th layer NoPE, pairs adjacent
        assert c.rope_layers == (True, True, True, False) * 12 and c.rope_layout == "complex"
        return
    elif c.model_type == "nemotron_h":  # issue 19: NemotronHAttention has no RoPE
        assert c.rope_layers == (False,) * c.num_hidden_layers
        return
    else:
        assert (c.rope_layers == ()) != (c.model_type == "smollm3")
    # RoPE on halves of each head, but for MLA's and Cohere's adjacent pairs (issue 16)
    assert c.is_mla or c.rope_layout == ("complex" if "cohere" in c.model_type else "half")


def test_the_family_table_names_each_moe_block():
    assert load_config("mixtral-8x7b").moe_names == MoENames(
        block="block_sparse_moe", expert_gate="w1", expert_up="w3", expert_down="w2"
    )
    assert load_config("qwen1.5-moe-a2.7b").moe_names == MoENames()
    for preset in ("deepseek-v2-lite", "deepseek-v3"):
        assert load_config(preset).moe_names == MoENames(shared="shared_experts")


DS2 = {
    "model_type": "deepseek_v2",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "kv_lora_rank": 16,
    "q_lora_rank": None,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "first_k_dense_replace": 1,
    "routed_scaling_factor": 2.0,
}


def _router(cfg: ModelConfig) -> list[str]:
    """The router's ops after the top-k, in order."""
    g = build_graph(cfg)
    p = "model.layers.1.mlp.router."
    return [n.name.removeprefix(p) for n in g.nodes() if n.name.startswith(p)]


@pytest.mark.parametrize(
    ("config", "norm", "replaces", "ops"),
    [
        # DeepSeek-V2's MoEGate: top-k > 1 with norm_topk_prob renormalises instead of scaling
        (DS2 | {"norm_topk_prob": True}, True, True, ["softmax", "topk", "normalize"]),
        # ... top-1 (or no norm_topk_prob): scales, never renormalises
        (
            DS2 | {"norm_topk_prob": True, "num_experts_per_tok": 1},
            False,
            True,
            ["softmax", "topk", "scale"],
        ),
        (DS2, False, True, ["softmax", "topk", "scale"]),
        # DeepSeek-V3: renormalises, then scales
        (
            DS2 | {"model_type": "deepseek_v3", "n_group": 4, "topk_group": 2},
            True,
            False,
            ["sigmoid", "bias", "group_limit", "topk", "gather", "normalize", "scale"],
        ),
    ],
)
def test_the_family_table_resolves_deepseeks_routing_into_fields(config, norm, replaces, ops):
    c = load_config(config)
    assert (c.norm_topk_prob, c.renorm_replaces_scaling) == (norm, replaces)
    assert c.routed_scaling_factor == 2.0  # as published
    assert _router(c) == ops


def test_the_json_round_trip_rebuilds_the_nested_records():
    exotic = ModelConfig(
        **SIZES,
        block=BlockLayout(attention_post="post_attention_layernorm", ffn_pre=None, parallel=True),
        rope_layers=(True, False, True),
        moe_names=MoENames(block="block_sparse_moe"),
    )
    for c in (exotic, load_config("deepseek-v3"), load_config("mixtral-8x7b")):
        text = json.dumps(dataclasses.asdict(c))
        assert config_from_fields(json.loads(text)) == c
    with pytest.raises(ConfigError, match="unknown config field 'moe_naming'"):
        config_from_fields(dataclasses.asdict(exotic) | {"moe_naming": "qwen"})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(layer_types=("sliding_attention",) * 32), "sliding_window is unset"),
        (dict(moe_layers=(True,) * 32), "num_experts is 0"),
        (
            dict(num_attention_heads=30, num_key_value_heads=8),
            "30 attention heads are not a multiple",
        ),
        (dict(num_nextn_predict_layers=1, mtp_moe_layers=(True, True)), "2 entries for 1"),
    ],
)
def test_fields_that_would_build_another_model_are_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        dataclasses.replace(load_config("llama3-8b"), **fields)


def test_with_layers_cuts_every_per_layer_field():
    cfg = load_config("qwen2-7b").with_layers(3)
    assert cfg.num_hidden_layers == 3 and len(cfg.layer_types) == len(cfg.moe_layers) == 3
    v3 = load_config("deepseek-v3").with_layers(4)
    assert v3.moe_layers == (False, False, False, True)  # first_k_dense_replace = 3


# issue 16: the q/k norms are the model's own norm kind, and the kinds go together
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"qk_norm": True, "qk_norm_scope": "each_head"}, "'each_head' goes with 'layernorm'"),
        ({"qk_norm": True, "norm_type": "layernorm"}, "qk_norm_scope 'head' is not modelled"),
        ({"norm_type": "layernorm", "norm_weight_offset": 1.0}, "norm weight offset"),
        ({"norm_type": "batchnorm"}, "norm_type must be one of rmsnorm, layernorm"),
        ({"logits_multiplier": float("nan")}, "logits_multiplier must be a finite number"),
    ],
)
def test_norm_kinds_that_do_not_go_together_are_refused(fields, message):
    base = load_config("llama3-8b")
    with pytest.raises(ConfigError, match=re.escape(message)):
        dataclasses.replace(base, **fields)
