"""issue 19: the diagrams draw Nemotron-H as it is: the model view shows the layer pattern (Mamba2,
MoE and NoPE attention layers, each one mixer), the block view one sub-layer behind its norm,
the attention view of a Mamba2 layer its mixer, and the tokens view the recurrence's edges."""

import re

from graphllm import Workload, build_graph, load_config
from graphllm.exporters.dot import view_dot


def _graph():
    return build_graph(load_config("nemotron-3-nano-30b-a3b"), Workload(seq_len=4))


def test_model_view_shows_the_layer_pattern():
    dot = view_dot(_graph(), "model", all_layers=True)
    kinds = re.findall(r"decoder block \d+\\nbackbone\.layers\.\d+\\n(\w+)", dot)
    pattern = load_config("nemotron-3-nano-30b-a3b").layer_types
    want = {"M": "Mamba2", "E": "MoE", "*": "attention"}
    assert "".join({v: k for k, v in want.items()}[k] for k in kinds) == (
        "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
    )
    assert len(kinds) == len(pattern)
    # NoPE marks the attention layers only; the Mamba2 layers say what mixes in them
    assert "attention\\n32 heads / 2 kv heads, d_h 128, NoPE" in dot
    assert (
        "Mamba2\\n64 heads / 8 kv heads, d_h 64\\nmixes tokens: causal_conv1d_bias, ssm_scan" in dot
    )
    assert 'MoE\\n128 experts, top-6, shared expert"' in dot


def test_block_view_is_one_sub_layer_behind_its_norm():
    mamba, moe = (view_dot(_graph(), "block", layer=i) for i in (0, 1))
    assert "norm\\nrmsnorm" in mamba and "Mamba2\\nmixer" in mamba
    assert 'label="attn_residual' in mamba and 'label="mlp_residual' not in mamba
    assert 'label="mlp_residual' in moe and 'label="attn_residual' not in moe


def test_the_mamba_mixer_is_drawn_op_by_op():
    dot = view_dot(_graph(), "attention", layer=0)
    for part in (
        "in_proj",
        "causal_conv1d_bias",
        "ssm_scan",
        "gated_group_rmsnorm",
        "out_proj",
        "present.0.conv_state",
        "present.0.recurrent_state",
        "zero_padding",
    ):
        assert part in dot, part


def test_tokens_view_draws_the_recurrence():
    dot = view_dot(_graph(), "tokens", layer=0)
    assert "scan" in dot and "conv1d" in dot
