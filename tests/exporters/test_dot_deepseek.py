"""The diagrams draw MLA (both forms) and DeepSeek's grouped sigmoid router."""

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.errors import GraphllmError
from graphllm.exporters.dot import view_dot


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
def test_attention_view_draws_mla(mla):
    g = build_graph(load_config("deepseek-v3"), Workload(seq_len=4, past_len=3), mla=mla)
    dot = view_dot(g, "attention", layer=3)
    for part in ("q_a_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "o_proj", "RoPE (pairs"):
        assert part in dot, part
    assert ("q · W_uk" in dot) == (mla == "absorbed")
    assert ("concat [latent, RoPE]" in dot) == (mla == "absorbed")
    assert ("concat [no-RoPE, RoPE]" in dot) == (mla == "naive")
    assert ("kv_b_proj" in dot) and (("latent → per-head K/V" in dot) == (mla == "naive"))


def test_ffn_view_draws_the_grouped_sigmoid_router_and_shared_experts():
    g = build_graph(load_config("deepseek-v3"), Workload(seq_len=4))
    dot = view_dot(g, "ffn", layer=3)
    for part in ("sigmoid", "correction bias", "best 4 of 8 groups", "unbiased weights", "top-8"):
        assert part in dot, part
    assert "shared_experts" in dot
    dense = view_dot(g, "ffn", layer=0)  # first_k_dense_replace: a gated MLP
    assert "gate_proj" in dense and "router" not in dense


@pytest.mark.parametrize("view", ["model", "block", "tokens"])
def test_other_views_render(view):
    g = build_graph(load_config("deepseek-v2-lite"), Workload(seq_len=4))
    assert view_dot(g, view, layer=1).startswith("digraph")


def test_render_with_mtp_draws_the_mtp_module(tmp_path):
    import xml.etree.ElementTree as ET

    from click.testing import CliRunner

    from graphllm.cli import main

    out = tmp_path / "mtp.svg"
    args = ["render", "--model", "deepseek-v3", "-t", "4", "--mtp", "--view", "model"]
    r = CliRunner().invoke(main, [*args, "-o", str(out), "--renderer", "pure"])
    assert r.exit_code == 0, r.output
    texts = [t.text or "" for t in ET.parse(out).iter() if t.tag.endswith("text")]
    for part in ("MTP depth 1: decoder block", "model.layers.61", "eh_proj", "hnorm", "enorm"):
        assert part in texts, part
    assert {"mtp.1.input_ids", "mtp.1.logits", "shared_head.head"} <= set(texts)


def test_block_views_reach_the_mtp_module_past_the_main_layers():
    g = build_graph(load_config("deepseek-v3"), Workload(seq_len=4), mtp=True)
    block = view_dot(g, "block", layer=61)  # V3's 61 layers are 0-60; 61 is the MTP module
    for part in ("enorm", "hnorm", "concat [embedding, hidden]", "eh_proj", "shared_head.head"):
        assert part in block, part
    assert "MoE" in block and "mixes tokens" in block  # its decoder block, drawn in place
    assert "kv_a_proj_with_mqa" in view_dot(g, "attention", layer=61)
    with pytest.raises(GraphllmError, match=r"--layer 62: .* 61 layers and 1 MTP module \(0-61\)"):
        view_dot(g, "block", layer=62)
    with pytest.raises(GraphllmError, match="--layer 61: the model has 61 layers"):
        view_dot(build_graph(load_config("deepseek-v3"), Workload(seq_len=4)), "block", layer=61)
