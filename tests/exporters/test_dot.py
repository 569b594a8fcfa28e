"""Graphviz views: rendered to SVG by each renderer and read back with xml.etree.

Every view is drawn for a dense (the article's MHA example), a GQA, a MoE and a shared-expert
config with Graphviz's `dot` (skipped where it is absent) and with the graphviz-pure wheel
(forced, even where `dot` exists); the checks read labels, shapes and edges off the SVG.
"""

from __future__ import annotations

import itertools
import re
import shutil
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.errors import GraphllmError
from graphllm.exporters import render as render_mod
from graphllm.exporters.dot import MIX_FILL, MIX_LINE, VIEWS, view_dot
from graphllm.exporters.render import render
from graphllm.models.hardware import load_hardware
from graphllm.passes import run
from tests.support.paths import EXAMPLES

SMALL = dict(
    vocab_size=32,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=24,
    max_position_embeddings=64,
)
CONFIGS = {
    "dense": EXAMPLES / "article.yaml",
    "gqa": dict(SMALL, model_type="llama"),
    "moe": dict(SMALL, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2),
    "shared": dict(
        SMALL,
        model_type="qwen2_moe",
        num_key_value_heads=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=8,
        shared_expert_intermediate_size=24,
    ),
    # issue 16: post-norms only, q/k norms over the whole projection
    "olmo2": dict(SMALL, model_type="olmo2"),
    "cohere": dict(SMALL, model_type="cohere", use_qk_norm=True),
    # issue 16: four norms per block, soft-capped scores and logits, a window on layer 0
    "gemma2": dict(SMALL, model_type="gemma2", head_dim=4, sliding_window=2),
    # issue 16: a local layer with its own RoPE base, then a global one with a scaled one
    "gemma3": dict(
        SMALL,
        model_type="gemma3_text",
        head_dim=4,
        sliding_window=2,
        sliding_window_pattern=2,
        rope_local_base_freq=10.0,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
    ),
    # issue 16: Llama 4, layers 0 and 2 chunked by 2 with RoPE and the L2 QK-norm, 1 and 3
    # global NoPE layers with the query temperature
    "llama4": dict(
        SMALL,
        model_type="llama4_text",
        num_hidden_layers=4,
        head_dim=4,
        moe_layers=[],
        intermediate_size_mlp=24,
        no_rope_layer_interval=2,
        attention_chunk_size=2,
        floor_scale=4,
    ),
    # issue 18: Llama 4 with its MoE on layer 1 (top 1 of 4, the weight on the expert's input)
    "llama4-moe": dict(
        SMALL,
        model_type="llama4_text",
        num_hidden_layers=2,
        head_dim=4,
        intermediate_size=8,
        intermediate_size_mlp=24,
        num_local_experts=4,
        interleave_moe_layer_step=2,
        attention_chunk_size=2,
    ),
}
SVG = "{http://www.w3.org/2000/svg}"
L0 = "model.layers.0"
ATT = f"{L0}.self_attn"


# -- reading an SVG back -------------------------------------------------------------------------
@dataclass
class Picture:
    nodes: dict[str, dict] = field(default_factory=dict)  # id -> {texts, classes, fill, stroke}
    edges: dict[tuple[str, str], dict] = field(default_factory=dict)  # -> {label, classes}
    clusters: list[str] = field(default_factory=list)  # labels
    title_texts: list[str] = field(default_factory=list)  # the graph label: title and legend

    def label(self, src: str, dst: str) -> str:
        return self.edges[(src, dst)]["label"]

    def find(self, pattern: str) -> list[str]:
        return [n for n in self.nodes if re.fullmatch(pattern, n)]

    def text(self, node: str) -> str:
        return " / ".join(self.nodes[node]["texts"])


def read_svg(path: Path) -> Picture:
    root = ET.parse(path).getroot()
    pic = Picture()
    graph = root.find(f"{SVG}g")
    for g in graph.iter(f"{SVG}g"):
        classes = set(g.get("class", "").split())
        title = g.findtext(f"{SVG}title")
        texts = [t.text or "" for t in g.iter(f"{SVG}text")]
        shape = next((e for e in g.iter() if e.tag in {f"{SVG}{x}" for x in SHAPES}), None)
        if "node" in classes:
            if not title.startswith("order"):  # invisible anchors that keep columns in order
                fill = shape.get("fill") if shape is not None else None
                stroke = shape.get("stroke") if shape is not None else None
                pic.nodes[title] = dict(texts=texts, classes=classes, fill=fill, stroke=stroke)
        elif "edge" in classes:
            src, dst = title.split("->")
            pic.edges[(src, dst)] = dict(label=" ".join(texts), classes=classes)
        elif "cluster" in classes:
            pic.clusters.append(" ".join(texts))
    pic.title_texts = [t.text or "" for t in graph.findall(f"{SVG}text")]
    return pic


SHAPES = ("path", "polygon", "ellipse")


# -- fixtures ------------------------------------------------------------------------------------
RENDERERS = ["dot", "pure"]


@pytest.fixture(params=RENDERERS)
def renderer(request):
    if request.param == "dot" and shutil.which("dot") is None:
        pytest.skip("Graphviz's dot binary is not installed")
    return request.param


_GRAPHS: dict[tuple, object] = {}


def graph_of(kind: str, seq_len: int = 3, **config):
    key = (kind, seq_len, tuple(sorted(config.items())))
    if key not in _GRAPHS:
        cfg = load_config(CONFIGS[kind])
        if config:
            cfg = replace(cfg, **config)
        _GRAPHS[key] = build_graph(cfg, Workload(seq_len=seq_len, dtype="fp32"))
    return _GRAPHS[key]


def draw(tmp_path: Path, graph, view: str, renderer: str, **opts) -> Picture:
    out = tmp_path / f"{view}-{renderer}.svg"
    render(view_dot(graph, view, **opts), out, renderer)
    return read_svg(out)


def mixing_boxes(pic: Picture) -> set[str]:
    return {n for n, v in pic.nodes.items() if "mixing" in v["classes"]}


# -- every view, every config, both renderers ----------------------------------------------------
@pytest.mark.parametrize("kind", list(CONFIGS))
def test_every_view_renders_and_colours_the_mixing_ops(tmp_path, renderer, kind):
    graph = graph_of(kind)
    mixing = {n for n, v in run(graph, ["tokens"])["tokens"].verdicts.items() if v.mixes}
    for view in VIEWS:
        pic = draw(tmp_path, graph, view, renderer)
        assert "mixes tokens (tokens pass)" in pic.title_texts
        boxes = mixing_boxes(pic)
        assert bool(boxes) == (view != "ffn"), view  # the feed-forward path mixes nothing
        for box in boxes:  # coloured where the tokens pass says, never elsewhere
            assert pic.nodes[box]["fill"] == MIX_FILL
        for box in pic.nodes:
            name = box.split(":", 1)[-1].split("#")[0]
            if name in mixing:
                assert box in boxes, (view, box)
        for (src, dst), e in pic.edges.items():
            assert src in pic.nodes and dst in pic.nodes, (view, src, dst)
            if e["label"]:
                assert re.fullmatch(r"[\dC×]+( \[\d\])?(, [\dC×]+( \[\d\])?)*", e["label"]), e


# -- the article's example: exact shapes -----------------------------------------------------------
def test_article_attention_shapes(tmp_path, renderer):
    pic = draw(tmp_path, graph_of("dense"), "attention", renderer)
    expect = [  # (from, to, shape) in every head lane h
        ("q_proj", "q_heads#{h}", "3×8"),  # the projections: 3×8
        ("k_proj", "k_heads#{h}", "3×8"),
        ("v_proj", "v_heads#{h}", "3×8"),
        ("q_heads#{h}", "q_rope#{h}", "3×4"),  # split into heads: 3×4 per head
        ("k_heads#{h}", "k_rope#{h}", "3×4"),
        ("q_rope#{h}", "core.scores#{h}", "3×4"),
        ("k_rope#{h}", "core.scores#{h}", "3×4"),
        ("core.scores#{h}", "core.scale#{h}", "3×3"),  # the score matrix: 3×3
        ("core.scale#{h}", "core.mask#{h}", "3×3"),
        ("core.mask#{h}", "core.softmax#{h}", "3×3"),
        ("core.softmax#{h}", "core.pv#{h}", "3×3"),
        ("v_heads#{h}", "core.pv#{h}", "3×4"),
        ("core.pv#{h}", "merge_heads", "3×4"),  # per head after PV: 3×4
        ("merge_heads", "o_proj", "3×8"),  # after the concat: 3×8
    ]
    for h in (0, 1):
        for a, b, shape in expect:
            assert pic.label(f"{ATT}.{a}".format(h=h), f"{ATT}.{b}".format(h=h)) == shape
    # RoPE on Q and K only: V goes to P V unrotated
    ropes = {dst for (_, dst) in pic.edges if "rope" in pic.text(dst)} - {"out:present.0.key"}
    assert {r.split(".")[-1] for r in ropes} == {"q_rope#0", "q_rope#1", "k_rope#0", "k_rope#1"}
    assert not [e for e in pic.edges if "v_heads" in e[0] and "rope" in e[1]]
    # one lane per head; core attention inside each; the ops named by op and caption
    assert {"head 0", "head 1"} <= set(pic.clusters)
    assert pic.clusters.count("core attention · core") == 2
    assert "scores / Q Kᵀ" in pic.text(f"{ATT}.core.scores#0")
    assert "mask / causal" in pic.text(f"{ATT}.core.mask#1")
    assert "W 8×8" in pic.text(f"{ATT}.q_proj")
    assert "MHA: each head has its own K and V" in " ".join(pic.text(n) for n in pic.nodes)
    assert {b.split(".")[-1] for b in mixing_boxes(pic)} == {
        f"{op}#{h}" for op in ("scores", "softmax", "pv") for h in (0, 1)
    }


def test_article_model_and_block(tmp_path, renderer):
    graph = graph_of("dense")
    pic = draw(tmp_path, graph, "model", renderer)
    block = "blocks:0"
    assert pic.label("in:input_ids", "model.embed_tokens") == "3"
    assert pic.label("model.embed_tokens", block) == "3×8"
    assert pic.label(block, "model.norm") == "3×8"
    assert pic.label("model.norm", "lm_head") == "3×8"
    assert pic.label("lm_head", "out:logits") == "3×16"
    assert pic.text(block).startswith("decoder block 0")
    assert "mixes tokens: scores, softmax, pv" in pic.text(block)

    pic = draw(tmp_path, graph, "block", renderer)
    stream = ["from:model.embed_tokens:0", f"{L0}.attn_residual", f"{L0}.mlp_residual"]
    assert pic.label(stream[0], stream[1]) == pic.label(stream[1], stream[2]) == "3×8"
    assert (stream[2], f"to:{L0}.mlp_residual") in pic.edges
    side = [f"{L0}.input_layernorm", ATT, f"{L0}.attn_residual"]
    side2 = [f"{L0}.post_attention_layernorm", f"{L0}.mlp", f"{L0}.mlp_residual"]
    for path in (side, side2):
        assert all(pic.label(a, b) == "3×8" for a, b in itertools.pairwise(path))
    assert pic.text(ATT).startswith("attention / self_attn")
    assert pic.text(f"{L0}.mlp").startswith("gated MLP / mlp")
    assert mixing_boxes(pic) == {ATT}


def test_model_view_runs_of_blocks_and_all_layers(tmp_path, renderer):
    graph = graph_of("gqa")
    pic = draw(tmp_path, graph, "model", renderer)
    assert pic.text("blocks:0").startswith("decoder block × 2 / layers 0-1")
    pic = draw(tmp_path, graph, "model", renderer, all_layers=True, layer=1)
    assert pic.label("blocks:0", "blocks:1") == "3×16"
    assert pic.text("blocks:1").startswith(f"decoder block 1 / {L0[:-1]}1")


def test_model_view_groups_runs_of_alike_blocks(tmp_path, renderer):
    cfg = dict(CONFIGS["shared"], num_hidden_layers=3, mlp_only_layers=[0])
    graph = build_graph(load_config(cfg), Workload(seq_len=3))
    pic = draw(tmp_path, graph, "model", renderer, layer=2)
    assert pic.text("blocks:0").startswith(
        "decoder block 0 / model.layers.0 / attention + gated MLP"
    )
    assert pic.text("blocks:1").startswith("decoder block × 2 / layers 1-2 / attention + MoE")
    assert pic.label("blocks:0", "blocks:1") == "3×16"


# -- GQA ---------------------------------------------------------------------------------------
def test_gqa_lanes_show_which_heads_share_which_kv_head(tmp_path, renderer):
    pic = draw(tmp_path, graph_of("gqa"), "attention", renderer)
    assert "kv head 0 · query heads 0-1" in pic.clusters
    assert "kv head 1 · query heads 2-3" in pic.clusters
    for j in range(4):
        assert (f"{ATT}.k_rope#{j // 2}", f"{ATT}.k_repeat#{j}") in pic.edges
        assert (f"{ATT}.v_heads#{j // 2}", f"{ATT}.v_repeat#{j}") in pic.edges
    assert pic.label(f"{ATT}.k_proj", f"{ATT}.k_heads#1") == "3×8"
    assert pic.label(f"{ATT}.k_heads#1", f"{ATT}.k_rope#1") == "3×4"
    note = pic.text("note:lanes")
    assert "GQA: heads 0-1 share kv head 0, heads 2-3 share kv head 1" in note


def test_many_heads_draw_one_representative_lane(tmp_path, renderer):
    graph = graph_of("gqa", num_attention_heads=32, num_key_value_heads=8, head_dim=2)
    pic = draw(tmp_path, graph, "attention", renderer)
    assert pic.find(rf"{re.escape(ATT)}\.q_rope#\d+") == [f"{ATT}.q_rope#0"]
    assert "head 0 (1 of 32, the others alike)" in pic.clusters
    assert "kv head 0 · query heads 0-3 (1 of 8 groups)" in pic.clusters
    note = pic.text("note:lanes")
    assert note.startswith("32 heads, 1 drawn")
    assert "heads 0-3 share kv head 0, heads 4-7 share kv head 1" in note
    assert "heads 28-31 share kv head 7" in note


# -- feed-forward ---------------------------------------------------------------------------------
def test_ffn_gated_mlp(tmp_path, renderer):
    pic = draw(tmp_path, graph_of("dense"), "ffn", renderer)
    m = f"{L0}.mlp"
    assert pic.label(f"{m}.gate_proj", f"{m}.act_fn") == "3×16"
    assert pic.label(f"{m}.act_fn", f"{m}.mul") == pic.label(f"{m}.up_proj", f"{m}.mul") == "3×16"
    assert pic.label(f"{m}.mul", f"{m}.down_proj") == "3×16"
    assert pic.label(f"{m}.down_proj", f"to:{m}.down_proj") == "3×8"
    assert pic.text(f"{m}.act_fn") == "act_fn / silu"
    assert pic.text(f"{m}.mul") == "mul / elementwise ×"
    assert not mixing_boxes(pic)


def test_ffn_moe_router_experts_combine(tmp_path, renderer):
    pic = draw(tmp_path, graph_of("moe"), "ffn", renderer)
    m = f"{L0}.block_sparse_moe"
    assert "router" in pic.clusters and "experts" in pic.clusters
    assert "expert 0 (1 of 8, the others alike)" in pic.clusters
    assert pic.label(f"{m}.gate", f"{m}.router.softmax") == "3×8"  # one logit per expert
    assert "W 8×16" in pic.text(f"{m}.gate")
    assert pic.label(f"{m}.router.topk", f"{m}.experts.dispatch#0") == "3×2 [1]"
    assert pic.label(f"{m}.experts.dispatch#0", f"{m}.experts.w1#0") == "C×16"
    assert pic.label(f"{m}.experts.w1#0", f"{m}.experts.act_fn#0") == "C×24"
    assert pic.label(f"{m}.experts.w2#0", f"{m}.experts.combine") == "C×16"
    assert pic.text(f"{m}.experts.combine").endswith("weighted combine")
    assert "W 24×16" in pic.text(f"{m}.experts.w1#0")  # one expert's weight
    note = pic.text("note:lanes")
    assert "8 experts, 1 drawn" in note and "top-2" in note and "C = 0.75" in note


def test_ffn_shared_expert_and_its_gate(tmp_path, renderer):
    pic = draw(tmp_path, graph_of("shared"), "ffn", renderer)
    m = f"{L0}.mlp"
    assert {"expert 0", "expert 3"} <= set(pic.clusters)  # four experts: all drawn
    assert "shared expert · shared_expert" in pic.clusters
    assert "router · shared_expert_gate" in pic.clusters
    assert pic.label(f"{m}.shared_expert.down_proj", f"{m}.shared_expert.gated") == "3×16"
    assert pic.label(f"{m}.shared_expert_gate.sigmoid", f"{m}.shared_expert.gated") == "3×1"
    assert (f"{m}.shared_expert.gated", f"{m}.add_shared") in pic.edges
    assert (f"{m}.experts.combine", f"{m}.add_shared") in pic.edges
    for j in range(4):
        assert (f"{m}.experts.down_proj#{j}", f"{m}.experts.combine") in pic.edges
    pic = draw(tmp_path, graph_of("shared"), "block", renderer)
    assert "4 experts, top-2, shared expert" in pic.text(m)


# -- tokens ---------------------------------------------------------------------------------------
def columns(pic: Picture, gather_only: bool = True) -> set[tuple[int, int]]:
    """(from column, to column) of the edges into the mixing ops, 0-based."""
    out = set()
    for (src, dst), e in pic.edges.items():
        if gather_only and "gather" not in e["classes"]:
            continue
        out.add((int(src.split(":")[0][1:]) - 1, int(dst.split(":")[0][1:]) - 1))
    return out


def test_tokens_view_gathers_the_causal_triangle(tmp_path, renderer):
    graph = graph_of("dense")
    pic = draw(tmp_path, graph, "tokens", renderer)
    assert [c for c in pic.clusters if c.startswith("token")] == ["token 1", "token 2", "token 3"]
    triangle = {(s, t) for t in range(3) for s in range(t + 1)}
    assert columns(pic) == triangle  # token 1 from 1; 2 from 1, 2; 3 from 1, 2, 3
    # between columns: only those gathers, and only into the mixing ops
    across = {(a, b) for a, b in columns(pic, gather_only=False) if a != b}
    assert across == {(s, t) for s, t in triangle if s != t}
    for (src, dst), _e in pic.edges.items():
        if src.split(":")[0] != dst.split(":")[0]:
            assert dst in mixing_boxes(pic)
    # the same sets as the tokens pass (one block: the block's own dependence)
    deps = run(graph, ["tokens"])["tokens"]
    assert triangle == {(s, t) for t in range(3) for s in deps.depends_on(t)}
    # per token, shapes lose the token axis: one score row per head
    assert pic.label(f"t2:{ATT}.core.scores", f"t2:{ATT}.core.scale") == "2×3"


def test_tokens_view_sliding_window_drops_the_older_tokens(tmp_path, renderer):
    graph = graph_of("dense", 4, layer_types=("sliding_attention",), sliding_window=2)
    pic = draw(tmp_path, graph, "tokens", renderer)
    window = {(s, t) for t in range(4) for s in range(4) if t - 2 < s <= t}
    assert columns(pic) == window
    deps = run(graph, ["tokens"])["tokens"]
    assert window == {(s, t) for t in range(4) for s in deps.depends_on(t)}


# -- cost colours ---------------------------------------------------------------------------------
@pytest.mark.parametrize("color", ["flops", "bytes", "time"])
def test_color_by_cost_with_a_legend(tmp_path, color):
    hw = load_hardware("h100") if color == "time" else None
    pic = draw(tmp_path, graph_of("moe"), "attention", "pure", color=color, hardware=hw)
    title = {"flops": "FLOPs:", "bytes": "bytes moved:", "time": "roofline time:"}[color]
    assert title in pic.title_texts and "mixes tokens (tokens pass)" in pic.title_texts
    assert len([t for t in pic.title_texts if t.startswith("from ")]) == 6
    fills = {v["fill"] for v in pic.nodes.values()}
    assert len(fills) >= 3  # shades, not one colour
    unit = {"flops": "FLOP", "bytes": "B", "time": "s"}[color]
    assert pic.text(f"{ATT}.q_proj").endswith(unit)
    for box in mixing_boxes(pic):  # mixing now frames the box; the fill is the cost's
        assert pic.nodes[box]["stroke"] == MIX_LINE


def test_color_time_needs_a_device():
    with pytest.raises(GraphllmError, match="--hardware"):
        view_dot(graph_of("dense"), "model", color="time")


# -- renderers -----------------------------------------------------------------------------------
def test_dot_text_needs_no_renderer(tmp_path, monkeypatch):
    monkeypatch.setattr(render_mod.shutil, "which", lambda _: None)
    monkeypatch.setattr(render_mod, "_pure_binary", lambda: None)
    text = view_dot(graph_of("dense"), "block")
    assert render(text, tmp_path / "b.dot").read_text() == text
    with pytest.raises(GraphllmError, match=r"pip install 'graphllm\[render\]'") as e:
        render(text, tmp_path / "b.svg")
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.dot"]
    with pytest.raises(GraphllmError, match="the dot binary is not found"):
        render(text, tmp_path / "b.png", "dot")
    with pytest.raises(GraphllmError, match="graphviz-pure is not installed"):
        render(text, tmp_path / "b.png", "pure")


def test_pdf_needs_graphviz(tmp_path, monkeypatch):
    text = view_dot(graph_of("dense"), "model")
    with pytest.raises(GraphllmError, match="PDF needs Graphviz's dot binary"):
        render(text, tmp_path / "m.pdf", "pure")
    monkeypatch.setenv(render_mod.ENV, "pure")  # the variable forces the fallback too
    with pytest.raises(GraphllmError, match="PDF needs"):
        render(text, tmp_path / "m.pdf")
    assert render_mod.find_renderer("svg")[0] == "pure"
    monkeypatch.delenv(render_mod.ENV)
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot binary is not installed")
    assert render(text, tmp_path / "m.pdf").read_bytes().startswith(b"%PDF")


def test_png_from_both_renderers(tmp_path, renderer):
    out = render(view_dot(graph_of("dense"), "model"), tmp_path / "m.png", renderer)
    assert out.read_bytes().startswith(b"\x89PNG")


def test_a_failed_render_leaves_no_file(tmp_path, renderer):
    with pytest.raises(GraphllmError, match="failed on"):
        render("digraph { a -> }", tmp_path / "x.svg", renderer)
    assert list(tmp_path.iterdir()) == []


def test_bad_requests_are_one_line_errors(tmp_path):
    graph = graph_of("dense")
    with pytest.raises(GraphllmError, match="unknown view"):
        view_dot(graph, "heads")
    with pytest.raises(GraphllmError, match=r"--layer 1: the model has 1 layer \(0-0\)"):
        view_dot(graph, "block", layer=1)
    with pytest.raises(GraphllmError, match="not a format to draw"):
        render("digraph {}", tmp_path / "x.jpg")
    with pytest.raises(GraphllmError, match="renderer 'cairo'"):
        render("digraph {}", tmp_path / "x.svg", "cairo")


def test_405b_every_block_in_seconds(tmp_path):
    start = time.perf_counter()
    graph = build_graph(load_config("llama3.1-405b"), Workload(seq_len=2048))
    out = render(view_dot(graph, "model", all_layers=True), tmp_path / "405b.svg")
    pic = read_svg(out)
    assert len(pic.find(r"blocks:\d+")) == 126
    assert time.perf_counter() - start < 15


def test_attention_view_names_partial_rotary_and_longrope():
    text = view_dot(build_graph(load_config("phi4-mini"), Workload(seq_len=4)), "attention")
    assert "RoPE, on 96 of 128 channels, longrope: long factors from position 4096" in text
    plain = view_dot(build_graph(load_config("phi3-mini"), Workload(seq_len=4)), "attention")
    assert "on 96 of" not in plain and "longrope" not in plain


# -- issue 16: OLMo 2 ----------------------------------------------------------------------------
def test_olmo2_block_draws_its_norms_after_each_sub_layer(tmp_path, renderer):
    graph = graph_of("olmo2")
    pic = draw(tmp_path, graph, "block", renderer)
    assert f"{L0}.input_layernorm" not in pic.nodes
    side = [ATT, f"{L0}.post_attention_layernorm", f"{L0}.attn_residual"]
    side2 = [f"{L0}.mlp", f"{L0}.post_feedforward_layernorm", f"{L0}.mlp_residual"]
    for path in (side, side2):
        assert all(pic.label(a, b) == "3×16" for a, b in itertools.pairwise(path)), path
    pic = draw(tmp_path, graph, "attention", renderer)
    # one norm over all heads' channels, before the split into heads
    assert pic.label(f"{ATT}.q_proj", f"{ATT}.q_norm") == "3×16"
    assert pic.label(f"{ATT}.k_proj", f"{ATT}.k_norm") == "3×8"
    assert (f"{ATT}.q_norm", f"{ATT}.q_heads#0") in pic.edges  # drawn once, then per head


# -- issue 16: Cohere ----------------------------------------------------------------------------
def test_cohere_block_draws_attention_beside_the_mlp_and_the_model_its_logit_scale(
    tmp_path, renderer
):
    graph = graph_of("cohere")
    pic = draw(tmp_path, graph, "block", renderer)
    norm = f"{L0}.input_layernorm"
    # one norm feeds both sub-layers; the MLP does not read the attention's residual sum
    assert {(norm, ATT), (norm, f"{L0}.mlp")} <= set(pic.edges)
    assert (f"{L0}.attn_residual", f"{L0}.mlp") not in pic.edges
    assert pic.text(norm).startswith("input_layernorm / layernorm")
    pic = draw(tmp_path, graph, "model", renderer)
    assert pic.label("lm_head", "lm_head.logits_multiplier") == "3×32"
    assert "× 0.0625" in pic.text("lm_head.logits_multiplier")


# -- issue 16: Gemma 2 ---------------------------------------------------------------------------
def test_gemma2_block_draws_a_norm_before_and_after_each_sub_layer_and_the_caps(tmp_path, renderer):
    graph = graph_of("gemma2")
    pic = draw(tmp_path, graph, "block", renderer)
    attn = [f"{L0}.input_layernorm", ATT, f"{L0}.post_attention_layernorm", f"{L0}.attn_residual"]
    ffn = [
        f"{L0}.pre_feedforward_layernorm",
        f"{L0}.mlp",
        f"{L0}.post_feedforward_layernorm",
        f"{L0}.mlp_residual",
    ]
    for path in (attn, ffn):
        assert all(pic.label(a, b) == "3×16" for a, b in itertools.pairwise(path)), path
    assert pic.label(f"{L0}.attn_residual", ffn[0]) == "3×16"
    pic = draw(tmp_path, graph, "model", renderer)
    # layer 0 local (its window), layer 1 global
    assert "window 2" in pic.text("blocks:0") and "window" not in pic.text("blocks:1")
    assert pic.label("lm_head", "lm_head.softcap") == "3×32"
    assert "30·tanh(x / 30)" in pic.text("lm_head.softcap")
    pic = draw(tmp_path, graph, "attention", renderer)
    core = f"{ATT}.core"
    assert "50·tanh(x / 50)" in pic.text(f"{core}.softcap#0")
    assert (f"{core}.scale#0", f"{core}.softcap#0") in pic.edges
    assert (f"{core}.softcap#0", f"{core}.mask#0") in pic.edges


# -- issue 16: Gemma 3 ---------------------------------------------------------------------------
def test_gemma3_model_view_marks_local_and_global_layers_and_their_ropes(tmp_path, renderer):
    graph = graph_of("gemma3")
    pic = draw(tmp_path, graph, "model", renderer)
    local, full = pic.text("blocks:0"), pic.text("blocks:1")
    assert "window 2" in local and "RoPE θ 10" in local and "linear" not in local
    assert "window" not in full and "RoPE θ 1,000,000 linear ×8" in full
    pic = draw(tmp_path, graph, "block", renderer)
    assert {f"{L0}.pre_feedforward_layernorm", f"{L0}.post_feedforward_layernorm"} <= set(pic.nodes)


def test_a_multimodal_configs_model_view_says_only_its_text_decoder_is_drawn(tmp_path, renderer):
    cfg = load_config("gemma3-27b").with_layers(2)
    pic = draw(tmp_path, build_graph(cfg, Workload(seq_len=3)), "model", renderer)
    title = " ".join(pic.title_texts)
    assert "the text decoder of gemma3; its vision tower is not modelled" in " ".join(title.split())


# -- issue 16: Llama 4 ---------------------------------------------------------------------------
def test_llama4_model_view_marks_chunked_and_nope_layers(tmp_path, renderer):
    graph = graph_of("llama4")
    pic = draw(tmp_path, graph, "model", renderer)
    # layer 0 chunked with RoPE, layer 1 global and NoPE
    assert "chunked 2" in pic.text("blocks:0") and "NoPE" not in pic.text("blocks:0")
    assert "NoPE" in pic.text("blocks:1") and "chunked" not in pic.text("blocks:1")
    pic = draw(tmp_path, graph, "attention", renderer, layer=0)
    core = f"{ATT}.core"
    assert "causal, chunked 2" in pic.text(f"{core}.mask#0")
    assert "L2 norm" in pic.text(f"{ATT}.q_norm#0")
    pic = draw(tmp_path, graph, "attention", renderer, layer=1)
    att1 = "model.layers.1.self_attn"
    assert "⌊(i + 1) / 4⌋" in pic.text(f"{att1}.attn_temperature#0")
    assert "chunked" not in pic.text(f"{att1}.core.mask#0")


# -- issue 16 audit: the model view of the presets whose NoPE layers had no test ----------------
@pytest.mark.parametrize(
    ("preset", "local", "nope"),
    [("command-r7b", "window 4096", "NoPE"), ("smollm3-3b", None, "NoPE")],
)
def test_model_view_marks_window_and_nope_layers_of_the_presets(
    tmp_path, renderer, preset, local, nope
):
    # Cohere 2: layers 0-2 a window with RoPE, layer 3 global without; SmolLM3: layer 3 NoPE
    cfg = load_config(preset).with_layers(4)
    pic = draw(tmp_path, build_graph(cfg, Workload(seq_len=3)), "model", renderer)
    first, fourth = pic.text("blocks:0"), pic.text("blocks:3")  # runs named by their first layer
    assert nope not in first and nope in fourth
    if local is not None:
        assert local in first and "window" not in fourth


def test_llama4_moe_view_shows_the_weight_on_the_expert_input(tmp_path, renderer):
    # issue 18: the router weight scales the slots before the fused experts; a plain sum after
    graph = graph_of("llama4-moe")
    labels = {n.name: n for n in graph.nodes()}
    assert "model.layers.1.feed_forward.experts.scale" in labels
    assert "model.layers.0.feed_forward.experts.scale" not in labels  # a dense layer
    pic = draw(tmp_path, graph, "ffn", renderer, layer=1)
    m = "model.layers.1.feed_forward"
    assert {"router", "experts", "expert 3", "shared expert · shared_expert"} <= set(pic.clusters)
    assert pic.text(f"{m}.experts.scale#0").endswith("× router weight (input)")
    assert pic.text(f"{m}.experts.combine").endswith("sum of experts")
    assert "each token goes to its top-1" in pic.text("note:lanes")
