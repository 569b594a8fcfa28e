"""Traced models of each kind against transformers' own forward: parameters, matmul FLOPs
(torch's FlopCounterMode), logits (prefill and a cached step), and the token mixing the tokens
pass derives from the traced ops' signatures."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.models.workload import Workload
from graphllm.trace import traced_graph
from graphllm.trace.recurrences import reference_conv_flops
from tests.support.traced import FAMILIES, MLA, TINY, P, check_traced


@pytest.mark.parametrize("past", [0, P], ids=["prefill", "decode"])
@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_traced_equals_transformers(kind, past):
    c = check_traced(FAMILIES[kind], past)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    # transformers' torch conv pads both sides and drops K-1 outputs; graphllm counts a kernel's
    assert c.conv_flops == reference_conv_flops(c.graph)
    assert (c.conv_flops > 0) == (kind in ("linear_attention", "mamba2", "short_conv"))
    np.testing.assert_allclose(c.logits, c.want, atol=2e-5, rtol=1e-4)


# recurrences and convs mix tokens too; Llama 4's experts take every token repeated once an
# expert (`repeat` along the flattened tokens), which the tokens pass reads as mixing them: not
# yet a same-position regroup; XGLM's and MPT's attention is their own ops; Doge's per-key
# bias is broadcast over the queries
NOT_ATTENTION_ONLY = ("linear_attention", "mamba2", "short_conv", "chunked_complex_rope")
NOT_ATTENTION_ONLY += ("dynamic_mask",)
OWN = ("own_attention", "own_attention_filled")
ATTENTION_ONLY = sorted(k for k in FAMILIES if k not in (*NOT_ATTENTION_ONLY, *OWN))


@pytest.mark.parametrize("kind", ATTENTION_ONLY)
def test_only_core_attention_mixes_tokens(kind):
    c = check_traced(FAMILIES[kind], P)
    tokens = c.results["tokens"].to_dict()
    assert sorted(tokens["mixing_ops"]) == ["pv", "scores", "softmax"]
    assert all(".core." in n["name"] for n in tokens["nodes"])


def test_roles_of_the_traced_dims():
    g = check_traced(FAMILIES["sliding"], P).graph
    assert [d.role for d in g["input_ids"].out.dims] == ["batch", "token"]
    past = g["past_key_values.0.key"].out
    assert [d.role for d in past.dims] == ["batch", "kv_head", "key_token", "head_dim"]
    assert [(d.name, d.role) for d in g["model.layers.0.self_attn.core.scores"].out.dims] == [
        ("B", "batch"),
        ("h", "head"),
        ("T", "token"),
        ("S", "key_token"),
    ]
    # the mask's relation comes from the model's own mask function: a window of 64
    assert g["model.layers.0.self_attn.core.mask"].attrs == {"causal": True, "window": 64}
    assert g.output_role("present.1.value") == "cache"
    # the projections are named by their modules, their weights by the checkpoint's names
    q = g["model.layers.1.self_attn.q_proj"]
    assert q.op == "linear" and q.inputs[1].node == "model.layers.1.self_attn.q_proj.weight"


@pytest.mark.parametrize(("seq", "past"), [(40, 0), (5, 40), (3, 100)])
def test_past_a_sliding_window(monkeypatch, seq, past):
    """Past the window each sliding layer keeps its last W - 1 keys: traced in that regime
    (probes past the window), the graph still gives transformers' logits and FLOPs."""
    import tests.support.traced as support

    monkeypatch.setattr(support, "T", seq)
    c = check_traced(dict(FAMILIES["sliding"], sliding_window=16), past)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    np.testing.assert_allclose(c.logits, c.want, atol=2e-5, rtol=1e-4)
    if past:  # the cache kept and read: the window's last 15 keys
        key = c.graph["past_key_values.0.key"].out.dims[2]
        assert (key.size, key.role, key.positions) == (15, "key_token", ("P-15", "P"))


def test_between_the_probes_and_the_window_is_refused():
    from graphllm.errors import ConfigError
    from graphllm.models.workload import Workload
    from graphllm.trace import traced_graph

    with pytest.raises(ConfigError, match="too short to trace"):
        traced_graph(dict(FAMILIES["sliding"], sliding_window=16), Workload(seq_len=3, past_len=8))


@pytest.mark.parametrize(
    ("past", "rule"), [(0, "gated_delta_chunked"), (P, "gated_delta_chunked_state")]
)
def test_a_linear_attention_layer_is_lifted_onto_the_delta_rows(past, rule):
    """Qwen3-Next's Gated DeltaNet: transformers' chunked delta rule and causal conv (their
    torch code loops over chunks) are one row each, so the trace holds at any length; the
    recurrent state and the conv state (its last K inputs, as transformers' cache keeps them)
    are carried outputs."""
    c = check_traced(FAMILIES["linear_attention"], past)
    g, tokens = c.graph, c.results["tokens"].to_dict()
    assert sorted(tokens["mixing_ops"]) == sorted(
        ["causal_conv1d", rule, "pv", "scores", "softmax"]
    )
    core = g["model.layers.0.linear_attn.core"]
    assert core.op == rule and core.attrs["chunk"] == 64
    assert [n.op for n in g.nodes() if n.name.endswith("_l2norm")] == ["l2normalize"] * 2
    conv = g["model.layers.0.linear_attn.conv1d"]
    assert conv.attrs["kernel"] == 4
    assert g.output_role("present.0.recurrent_state") == "state"
    state = g[g.outputs["present.0.conv_state"].node].outputs[0]
    assert state.dims[-1].size == 4  # (B, C, K)
    if past:
        assert "past_key_values.0.recurrent_state" in g and "past_key_values.0.conv_state" in g


def test_one_new_token_after_a_state_is_the_recurrent_form():
    """At one new token transformers runs the delta rule token by token: the traced graph,
    made from probes of several tokens, lowers to that form too."""
    from graphllm.models.workload import Workload
    from graphllm.trace import traced_graph

    g = traced_graph(FAMILIES["linear_attention"], Workload(seq_len=1, past_len=9))
    assert g["model.layers.0.linear_attn.core"].op == "gated_delta_step"


@pytest.mark.parametrize(("past", "rule"), [(0, "ssm_scan"), (P, "ssm_scan_past")])
def test_a_mamba2_layer_is_lifted_onto_the_scan_rows(past, rule):
    """Nemotron-H's Mamba2 mixer: transformers' chunked scan is one ssm_scan row, handed A
    itself (the model computes -exp(A_log) before the scan), with its conv and states."""
    c = check_traced(FAMILIES["mamba2"], past)
    g, tokens = c.graph, c.results["tokens"].to_dict()
    mixing = ["causal_conv1d_bias", rule, "pv", "scores", "softmax"]
    assert sorted(tokens["mixing_ops"]) == sorted(mixing)
    scan = g["model.layers.0.mixer.scan"]
    assert scan.op == rule and scan.attrs["a_is_rate"] and scan.attrs["chunk_size"] == 16
    assert scan.attrs["form"] == "chunked"
    assert g.output_role("present.0.recurrent_state") == "state"


def test_llama4_chunked_attention_and_its_repeated_tokens():
    """Llama 4's chunked layers: the chunk read from its mask function (which closes over
    per-sequence padding offsets, taken as none); its experts computed for every token as
    transformers' code does, the tokens repeated once an expert (read as mixing: a gap)."""
    c = check_traced(FAMILIES["chunked_complex_rope"], P)
    g = c.graph
    assert g["model.layers.0.self_attn.core.mask"].attrs == {
        "causal": True,
        "window": None,
        "chunk": 64,
    }
    assert g["model.layers.1.self_attn.core.mask"].attrs == {"causal": True, "window": None}
    mixing = sorted(c.results["tokens"].to_dict()["mixing_ops"])
    assert mixing == ["aten.repeat[a b -> c b]", "pv", "scores", "softmax"]


def test_a_model_that_applies_its_mask_itself():
    """XGLM computes attention in its own code and adds the mask to its scores: that add is
    the `mask` row with the relation read from the mask function; the scores, softmax and
    values are its own ops (bmm, softmax), and they are what mixes tokens."""
    c = check_traced(FAMILIES["own_attention"], P)
    g = c.graph
    masks = [n for n in g.nodes() if n.op == "mask"]
    assert len(masks) == 2 and all(n.attrs == {"causal": True, "window": None} for n in masks)
    mixing = sorted(c.results["tokens"].to_dict()["mixing_ops"])
    assert [m.split("[")[0] for m in mixing] == ["aten._softmax", "aten.bmm"]


@pytest.mark.parametrize("past", [0, P], ids=["prefill", "decode"])
def test_a_model_that_fills_where_its_eager_mask_is_set(past):
    """MPT computes attention itself for eager's mask (0 where a key is attended, the minimum
    where not): it casts the mask to bool, True where a key is masked, and fills its scores
    there. It is handed the mask in that form, so the fill is the `mask` row with the causal
    relation and the graph keeps the keys transformers keeps (its logits)."""
    c = check_traced(FAMILIES["own_attention_filled"], past)
    masks = [n for n in c.graph.nodes() if n.op == "mask"]
    assert [n.name for n in masks] == [f"transformer.blocks.{i}.attn.mask" for i in (0, 1)]
    assert all(n.attrs == {"causal": True, "window": None} for n in masks)
    mixing = sorted(c.results["tokens"].to_dict()["mixing_ops"])
    assert [m.split("[")[0] for m in mixing] == ["aten._softmax", "aten.bmm"]
    np.testing.assert_allclose(c.logits, c.want, atol=2e-5, rtol=1e-4)


def test_a_mask_made_a_bias_by_the_model():
    """Doge's dynamic mask: exp(A softplus(dt_proj(v))) a key and head, broadcast over the
    queries, the minimum where the causal mask is False (its code turns sdpa's bool mask into
    eager's form and fills where it is not 0), handed to the attention as its mask. The mask
    rows keep the causal relation; the attention adds the bias to its scores, then masks; each
    position depends on itself and those before."""
    c = check_traced(FAMILIES["dynamic_mask"], 0)
    g = c.graph
    core = "model.layers.0.self_attn.core"
    assert g[f"{core}.mask_bias"].op == "add"
    assert g[f"{core}.mask"].attrs == g["model.layers.0.self_attn.mask"].attrs
    assert g[f"{core}.mask"].attrs == {"causal": True, "window": None}
    tokens = c.results["tokens"]
    assert [tokens.depends_on(t) for t in range(3)] == [[0], [0, 1], [0, 1, 2]]
    mixing = sorted(m.split("[")[0] for m in tokens.to_dict()["mixing_ops"])
    assert mixing == ["aten.expand", "pv", "scores", "softmax"]


def test_past_its_kept_keys_a_dynamic_mask_selects_keys():
    """Past keep_window_size keys each query keeps the keys its dynamic mask ranks highest
    (a top-k chosen at run time): refused in one line, up to it traced."""
    raw = FAMILIES["dynamic_mask"]
    with pytest.raises(ConfigError, match="top-k over the keys"):
        traced_graph(raw, Workload(seq_len=1, past_len=64))
    assert "logits" in traced_graph(raw, Workload(seq_len=1, past_len=63)).outputs


def test_a_model_that_picks_its_attention_class_by_name():
    """GPT-Neo keys its attention classes by the implementation's name, so it takes no
    registered function: it is built with its eager attention, recorded op by op, its local
    layers' window read from the mask function graphllm's mask interface receives."""
    raw = dict(
        model_type="gpt_neo",
        vocab_size=96,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        attention_types=[[["global", "local"], 1]],
        window_size=3,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    c = check_traced(raw, P)
    assert c.params == c.results["params"].total
    assert c.results["cost"].flops["matmul"] == c.flops
    assert np.abs(c.logits - c.want).max() < 1e-4


INKLING = dict(
    TINY,
    model_type="inkling_text",
    swa_num_attention_heads=4,
    swa_num_key_value_heads=2,
    swa_head_dim=8,
    sliding_window_size=64,
    d_rel=4,
    rel_extent=16,
    layer_types=["hybrid_sliding", "hybrid"],
    mlp_layer_types=["sparse", "sparse"],
    moe_intermediate_size=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_shared_experts=1,
)


def test_a_position_bias_the_attention_function_is_given():
    """Inkling hands its attention function relative-position logits (position_bias), added to
    the scaled scores; its router reads log_sigmoid and logsumexp."""
    c = check_traced(INKLING, P)
    biased = [n for n in c.graph.nodes() if n.name.endswith("core.position_bias")]
    assert len(biased) == 2
    assert "model.layers.0.self_attn.r_proj" in c.graph  # the bias's projection is read
    assert c.results["cost"].flops["matmul"] == c.flops
    assert np.abs(c.logits - c.want).max() < 1e-4


def test_a_layer_with_two_attentions_keeps_two_cache_entries():
    """LongCat-Flash's layer i attends twice, through cache entries 2i and 2i + 1: the second
    layer, a replay of the first, reads and writes entries 2 and 3. Its zero experts spread
    their tokens with a floor division."""
    raw = dict(
        {k: v for k, v in MLA.items() if k != "num_hidden_layers"},  # its attentions': 2 a layer
        model_type="longcat_flash",
        num_layers=2,
        ffn_hidden_size=64,
        expert_ffn_hidden_size=16,
        moe_topk=2,
        zero_expert_num=2,
        head_dim=4,
    )
    c = check_traced(raw, P)
    inputs = {n.name for n in c.graph.nodes("input")}
    assert {f"past_key_values.{i}.key" for i in range(4)} <= inputs
    assert {f"present.{i}.value" for i in range(4)} <= set(c.graph.outputs)
    assert np.abs(c.logits - c.want).max() < 1e-4


INKLING2 = dict(
    TINY,
    model_type="inkling2_text",
    unpadded_vocab_size=90,
    moe_intermediate_size=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    sliding_window_size=64,
    layer_types=["hybrid_sliding", "hybrid"],
)


def test_a_convolution_over_windows_of_tokens():
    """Inkling 2's keys and values pass a short conv whose taps each token computes: the
    windows come from `unfold` over the tokens (each output position reads the K ending at
    it), its attention a sink logit per query."""
    c = check_traced(INKLING2, P)
    assert any(n.op.startswith("aten.unfold") for n in c.graph.nodes())
    assert any(n.op == "softmax_token_sink" for n in c.graph.nodes())
    mixing = c.results["tokens"].to_dict()["mixing_ops"]
    assert any(m.startswith("aten.unfold") for m in mixing)
    assert c.results["cost"].flops["matmul"] == c.flops
    assert np.abs(c.logits - c.want).max() < 1e-4


def test_a_looped_model_that_copies_its_cache_layers():
    """Inkling2-Loop runs its middle layers three times, each pass with its own copies of their
    cache layers (copy.deepcopy in its forward: a clone), its convs once a call."""
    raw = dict(
        INKLING2,
        model_type="inkling2_loop_text",
        num_hidden_layers=4,
        layer_types=["hybrid_sliding", "hybrid_sliding", "hybrid", "hybrid_sliding"],
        n_layers_per_attn_res_block=1,
        loop_layer_index_start=1,
        loop_layer_index_end=3,
    )
    c = check_traced(raw, P)
    assert "model.layers.1.self_attn.k_proj.sconv_3.channels_last" in c.graph
    assert c.params == c.results["params"].total
    assert c.results["cost"].flops["matmul"] == c.flops
    assert np.abs(c.logits - c.want).max() < 1e-4


def test_convolutions_over_the_tokens_in_torch_code():
    """ZAYA mixes its queries and keys with two valid convs over the tokens after its conv
    state (or K-1 zeros): a depthwise one, then one in head groups; each output position reads
    the K positions ending at it, and their work is torch's, output for output."""
    raw = dict(
        TINY,
        model_type="zaya",
        num_hidden_layers=2,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=1,
        layer_types=["hybrid", "hybrid"],
    )
    c = check_traced(raw, P)
    convs = [n for n in c.graph.nodes() if n.op.startswith("aten.convolution")]
    assert len(convs) == 4
    assert reference_conv_flops(c.graph) == c.conv_flops
    mixing = c.results["tokens"].to_dict()["mixing_ops"]
    assert any(m.startswith("aten.convolution") for m in mixing)
    assert c.results["cost"].flops["matmul"] == c.flops
    assert np.abs(c.logits - c.want).max() < 1e-4
