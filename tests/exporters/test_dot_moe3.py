"""issue 18: the diagrams draw GLM-4.5 (and its MTP layer), MiniMax-M2 and Kimi-K2 as they are."""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.errors import GraphllmError
from graphllm.exporters.dot import view_dot


@pytest.mark.parametrize("preset", ["glm4.5", "minimax-m2"])
def test_attention_view_draws_partial_rope_and_the_qk_norms(preset):
    layer = 3 if preset == "glm4.5" else 0
    dot = view_dot(build_graph(load_config(preset), Workload(seq_len=4)), "attention", layer=layer)
    for part in ("q_norm", "k_norm", "RoPE, on 64 of 128 channels", "o_proj"):
        assert part in dot, part


@pytest.mark.parametrize(("preset", "layer"), [("glm4.5", 3), ("minimax-m2", 0), ("kimi-k2", 1)])
def test_ffn_view_draws_the_biased_sigmoid_router(preset, layer):
    dot = view_dot(build_graph(load_config(preset), Workload(seq_len=4)), "ffn", layer=layer)
    for part in ("sigmoid", "correction bias", "unbiased weights", "top-8"):
        assert part in dot, part
    assert ("shared_experts" in dot) == (preset != "minimax-m2")  # MiniMax-M2 has none


def test_glm_dense_first_layers_draw_a_gated_mlp():
    dense = view_dot(build_graph(load_config("glm4.5"), Workload(seq_len=4)), "ffn", layer=2)
    assert "gate_proj" in dense and "router" not in dense  # first_k_dense_replace 3


def test_block_views_reach_glm_mtp_layer_past_the_main_layers():
    g = build_graph(load_config("glm4.5"), Workload(seq_len=4), mtp=True)
    block = view_dot(g, "block", layer=92)  # GLM-4.5's 92 layers are 0-91; 92 is the MTP layer
    for part in ("enorm", "hnorm", "eh_proj", "shared_head.head", "MoE"):
        assert part in block, part
    assert "q_norm" in view_dot(g, "attention", layer=92)  # its block is GLM's own
    with pytest.raises(GraphllmError, match="--layer 92: the model has 92 layers"):
        view_dot(build_graph(load_config("glm4.5"), Workload(seq_len=4)), "block", layer=92)


def test_model_view_draws_the_mtp_module():
    g = build_graph(load_config("glm4.5-air"), Workload(seq_len=4), mtp=True)
    dot = view_dot(g, "model")
    assert "MTP depth 1: decoder block" in dot and "model.layers.46" in dot
