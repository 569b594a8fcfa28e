"""The tokens pass: verdicts derived from signatures, dependence sets, and execution agreeing."""

from dataclasses import replace

import numpy as np
import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.ir import Dim, Graph, TensorType
from graphllm.passes import run
from graphllm.passes.tokens import mixing_verdict
from graphllm.runtime.observe import check_token_mixing

PRESETS = [
    "llama3-8b",
    "llama2-7b",
    "mistral-7b",
    "mixtral-8x7b",
    "qwen2-7b",
    "qwen1.5-moe-a2.7b",
    "qwen3-30b-a3b",
    "gemma-2b",
    "phi3-mini",
    "phi4-mini",  # partial rotary and longrope: RoPE stays local
    "granite-3.3-8b",
    "smollm3-3b",
    "olmo2-7b",  # issue 16
    "command-r-35b",  # issue 16
    "command-r7b",  # issue 16
    "gemma2-9b",  # issue 16
    "gemma3-1b",  # issue 16
    "gemma3-27b",  # issue 16: the text decoder of the multimodal config
    # issue 18: DeepSeek-V3's routing, partial RoPE, QKV bias, q/k norms; MiniMax-M2's
    "glm4.5",
    "glm4.5-air",
    "minimax-m2",
]
CORE = {"scores", "softmax", "pv"}


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("workload", [Workload(seq_len=16), Workload(seq_len=2, past_len=30)])
def test_only_core_attention_mixes(preset, workload):
    cfg = load_config(preset)
    graph = build_graph(cfg, workload)
    report = run(graph, ["tokens"])["tokens"]
    mixing = {name for name, _ in report.mixing_nodes}
    assert {op for _, op in report.mixing_nodes} == CORE
    # three mixing nodes per layer, all inside the layer's core attention
    assert len(mixing) == 3 * cfg.num_hidden_layers
    assert all(".self_attn.core." in name for name in mixing)
    local = {n.op for n in graph.nodes() if n.name not in mixing}
    norm = "layernorm" if cfg.norm_type == "layernorm" else "rmsnorm"  # Cohere's (issue 16)
    rope = "rope" if cfg.rope_layout == "half" else "rope_pairs"
    assert {"embedding", norm, "linear", rope, "mask", "add", "mul_const"} <= local
    if cfg.num_key_value_heads < cfg.num_attention_heads:  # repeat_kv only exists for GQA
        assert "repeat_kv" in local
    if workload.past_len:
        assert "kv_concat" in local
    if cfg.is_moe:
        assert {"topk", "moe_dispatch", "expert_linear", "moe_combine"} <= local


def test_verdicts_give_the_reason():
    graph = build_graph(load_config("llama3-8b"), Workload(seq_len=4))
    r = run(graph, ["tokens"])["tokens"].verdicts
    p = "model.layers.0.self_attn.core"
    assert "pairs positions t and s" in r[f"{p}.scores"].reason
    assert "whole position axis s" in r[f"{p}.softmax"].reason
    assert "contracts position axis s" in r[f"{p}.pv"].reason
    assert not r["model.layers.0.mlp.down_proj"].mixes
    # a softmax over experts is local: the rule looks at the role of the reduced axis, not the op
    moe = build_graph(load_config("mixtral-8x7b"), Workload(seq_len=4))
    v = run(moe, ["tokens"])["tokens"].verdicts
    assert not v["model.layers.0.block_sparse_moe.router.softmax"].mixes


def test_hand_built_reduction_over_tokens_mixes():
    # a made-up op use: softmax straight over the token axis must be flagged, with no name lists
    g = Graph("t", {"B": 1, "T": 4})
    x = g.add(
        "input",
        "x",
        (),
        {"type": TensorType((Dim("B", "batch"), Dim("d", "hidden", 2), Dim("T", "token")), "fp32")},
    )
    sm = g.add("softmax", "sm", (x,))
    assert mixing_verdict(g, sm).mixes
    assert not mixing_verdict(g, x).mixes


def _cfg(window=None, layers=3):
    cfg = load_config("llama3-8b")
    kinds = ("sliding_attention" if window else "full_attention",) * layers
    return replace(
        cfg,
        num_hidden_layers=layers,
        layer_types=kinds,
        sliding_window=window,
        moe_layers=(False,) * layers,
    )


def test_causal_dependence_is_the_prefix():
    r = run(build_graph(_cfg(), Workload(seq_len=6)), ["tokens"])["tokens"]
    np.testing.assert_array_equal(r.dependence, np.tril(np.ones((6, 6), bool)))
    assert r.receptive_field == 6
    assert r.depends_on(2) == [0, 1, 2]


@pytest.mark.parametrize("exact", [True, False])
def test_window_grows_by_w_minus_one_per_layer(exact):
    w, layers, t = 3, 3, 12
    r = run(build_graph(_cfg(w, layers), Workload(seq_len=t)), ["tokens"], exact_sets=exact)
    rep = r["tokens"]
    assert [x["reach"] for x in rep.per_layer] == [w + i * (w - 1) for i in range(layers)]
    assert rep.depends_on(11) == list(range(11 - (layers * (w - 1)), 12))
    assert rep.exact is exact


def test_decode_with_past_sees_the_cache():
    r = run(build_graph(_cfg(), Workload(seq_len=2, past_len=5)), ["tokens"])["tokens"]
    assert r.depends_on(0) == list(range(6)) and r.depends_on(1) == list(range(7))


def test_long_sequences_use_intervals_equal_to_exact_sets():
    cfg = _cfg(window=5, layers=4)
    g = build_graph(cfg, Workload(seq_len=40, past_len=7))
    exact = run(g, ["tokens"], exact_sets=True)["tokens"]
    hull = run(g, ["tokens"], exact_sets=False)["tokens"]
    np.testing.assert_array_equal(exact.dependence, hull.dependence)
    big = run(build_graph(cfg, Workload(seq_len=50_000)), ["tokens"])["tokens"]
    assert not big.exact
    assert big.receptive_field == 5 + 3 * 4


@pytest.mark.parametrize(
    "preset",
    [
        "llama3-8b",
        "mistral-7b",
        "qwen1.5-moe-a2.7b",
        "mixtral-8x7b",
        "gemma2-9b",
        "gemma3-1b",
        "glm4.5-air",  # issue 18
        "minimax-m2",  # issue 18
        # issue 16 audit: the other families' layer patterns, observed too (Cohere 2's window
        # layers beside its global NoPE one, SmolLM3's NoPE layers, the parallel block,
        # post-norms, muP multipliers, partial rotary with longrope)
        "command-r7b",
        "command-r",
        "smollm3-3b",
        "olmo2-7b",
        "granite-3.3-8b",
        "phi4-mini",  # its small instance once crashed: rotary_dim 96 beside head_dim 8
        "phi3.5-mini",  # and 48 longrope factors for 4 pairs
    ],
)
def test_prediction_matches_perturbation(preset):
    check = check_token_mixing(load_config(preset), seq_len=10)
    assert check.agrees, check.differences()
    # the check can fail: a wrong prediction is reported cell by cell
    wrong = replace(check, predicted=np.ones_like(check.predicted))
    assert not wrong.agrees and wrong.differences()[0][2:] == (True, False)


def test_rolling_window_cache_holds_the_last_positions():
    # W=3, P=5: each window layer's cache holds positions 3 and 4 only
    r = run(build_graph(_cfg(window=3), Workload(seq_len=2, past_len=5)), ["tokens"])["tokens"]
    assert r.depends_on(0) == [3, 4, 5]
    assert r.depends_on(1) == [3, 4, 5, 6]


def test_logits_for_the_last_position_only():
    r = run(build_graph(_cfg(), Workload(seq_len=4, logits="last")), ["tokens"])["tokens"]
    assert r.depends_on(3) == [0, 1, 2, 3] and r.depends_on(0) == []


# issue 16: Gemma 2's pattern, a window layer then a global one
def test_gemma2_window_layer_then_global_layer_reaches_the_prefix():
    cfg = load_config("gemma2-9b").with_layers(4)
    assert cfg.layer_types == ("sliding_attention", "full_attention") * 2
    w, t = 3, 12
    cfg = replace(cfg, sliding_window=w)
    rep = run(build_graph(cfg, Workload(seq_len=t)), ["tokens"])["tokens"]
    # the window layer reaches W back, the global one everything before it
    assert [x["reach"] for x in rep.per_layer][:2] == [w, t]
    assert rep.depends_on(t - 1) == list(range(t))


# issue 16: Gemma 3's pattern, five window layers then a global one: the reach of a stack of
# window layers grows by W - 1 per layer, the global one reaches everything
def test_gemma3_five_window_layers_grow_by_w_minus_one_then_the_global_one_reaches_all():
    cfg = load_config("gemma3-1b").with_layers(6)
    assert cfg.layer_types == ("sliding_attention",) * 5 + ("full_attention",)
    w, t = 3, 16
    rep = run(build_graph(replace(cfg, sliding_window=w), Workload(seq_len=t)), ["tokens"])
    rep = rep["tokens"]
    assert [x["reach"] for x in rep.per_layer] == [w + k * (w - 1) for k in range(5)] + [t]
    assert rep.depends_on(t - 1) == list(range(t))


# issue 16: Llama 4's chunked layers, whose reach stops at the chunk boundary however deep
def _llama4(layers: int, chunk: int, **kw):
    from graphllm.models.config import config_from_dict

    d = {
        "model_type": "llama4_text",
        "num_hidden_layers": layers,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "vocab_size": 64,
        "intermediate_size_mlp": 48,
        "moe_layers": [],
        "attention_chunk_size": chunk,
        **kw,
    }
    return config_from_dict(d, "llama4-tiny")


@pytest.mark.parametrize("exact", [True, False])
def test_chunked_layers_depend_on_their_own_chunk_alone(exact):
    # three chunked layers of C=4 over 12 tokens: position t sees t's chunk only, at every depth
    # (a window of 4 would reach 3 + 3 + 3 back by the third layer)
    cfg = _llama4(3, 4, no_rope_layers=[1, 1, 1])
    assert cfg.layer_types == ("chunked_attention",) * 3
    rep = run(build_graph(cfg, Workload(seq_len=12)), ["tokens"], exact_sets=exact)["tokens"]
    for t in range(12):
        assert rep.depends_on(t) == list(range(t // 4 * 4, t + 1))
    assert [x["reach"] for x in rep.per_layer] == [4, 4, 4]


def test_chunked_decode_sees_its_chunk_in_the_rolled_cache():
    # P=6, C=4: the cache holds positions 3, 4, 5; the new tokens 6 and 7 are in chunk 4..7
    cfg = _llama4(2, 4, no_rope_layers=[1, 1])
    r = run(build_graph(cfg, Workload(seq_len=2, past_len=6)), ["tokens"])["tokens"]
    assert r.depends_on(0) == [4, 5, 6] and r.depends_on(1) == [4, 5, 6, 7]


def test_chunked_then_global_layer_reaches_the_prefix():
    # Llama 4's default pattern: a NoPE global layer after chunked ones reaches everything
    cfg = _llama4(4, 4, no_rope_layer_interval=2)
    assert cfg.layer_types == ("chunked_attention", "full_attention") * 2
    rep = run(build_graph(cfg, Workload(seq_len=10)), ["tokens"])["tokens"]
    assert rep.depends_on(9) == list(range(10))
    assert [x["reach"] for x in rep.per_layer][:2] == [2, 10]


def test_llama4_prediction_matches_perturbation():
    check = check_token_mixing(_llama4(4, 8192, no_rope_layers=[1, 1, 1, 0]), seq_len=10)
    assert check.agrees, check.differences()


@pytest.mark.parametrize("exact", [True, False])
def test_llama4_moe_keeps_each_token_to_its_own_chunk(exact):
    # issue 18: Llama4TextMoe's router weight on the expert's input (moe_scale_slots) and the
    # plain sum back (moe_sum) keep each token's slots its own: chunked layers with MoE FFNs
    # still reach their chunk alone
    cfg = _llama4(2, 4, no_rope_layers=[1, 1], moe_layers=None, num_local_experts=4)
    assert cfg.moe_layers == (True, True) and cfg.moe_weights_input
    g = build_graph(cfg, Workload(seq_len=8))
    assert {"moe_scale_slots", "moe_sum", "expert_matmul"} <= {n.op for n in g.nodes()}
    rep = run(g, ["tokens"], exact_sets=exact)["tokens"]
    for t in range(8):
        assert rep.depends_on(t) == list(range(t // 4 * 4, t + 1))
    assert not rep.verdicts["model.layers.0.feed_forward.experts.scale"].mixes
