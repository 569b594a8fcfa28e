"""The op table's rows: every row complete, shapes and FLOPs inferred from signatures (with the
error naming the node and the axis), and the numpy impls on small arrays."""

import math

import numpy as np
import pytest

from graphllm.errors import GraphError
from graphllm.ir import Dim, Graph, TensorType
from graphllm.ir.signature import parse
from graphllm.ops import CATEGORIES, OPS, SOURCE, node_flops

B, T, S = Dim("B", "batch"), Dim("T", "token"), Dim("S", "key_token")
D8 = Dim("d", "hidden", 8)


def test_every_row_is_complete():
    for name, spec in OPS.items():
        assert spec.name == name
        assert spec.doc
        parse(spec.sig)
        if spec.category != SOURCE:
            assert spec.impl is not None, name
            assert len(spec.out_dtypes) == len(spec.signature.outputs), name
    assert {spec.category for spec in OPS.values()} <= set(CATEGORIES)


def _graph(**b) -> Graph:
    return Graph("t", {"B": 2, "T": 3, "S": 5} | b)


def _inp(g, name, *dims, dtype="fp32"):
    return g.input(name, TensorType(tuple(dims), dtype))


def test_linear_shape_and_flops():
    g = _graph()
    x = _inp(g, "x", B, T, D8)
    f = Dim("f", "ffn", 16)
    w = _inp(g, "w", f, D8)
    y = g.add("linear", "y", (x, w))
    assert y.out.dims == (B, T, f)
    assert node_flops(g, y) == (2 * 2 * 3 * 8 * 16, 0)


def test_linear_with_wrong_inner_dim_names_the_node():
    g = _graph()
    x = _inp(g, "x", B, T, D8)
    w = _inp(g, "w", Dim("f", "ffn", 16), Dim("d", "hidden", 9))
    with pytest.raises(GraphError, match=r"y \(linear\): axis d is d=8 in one input, d=9 in 1"):
        g.add("linear", "y", (x, w))


def test_split_heads_checks_the_group_size():
    g = _graph()
    x = _inp(g, "x", B, T, D8)
    h, e = Dim("h", "head", 2), Dim("e", "head_dim", 4)
    y = g.add("split_heads", "y", (x,), {"axes": {"h": h, "e": e}})
    assert y.out.dims == (B, h, T, e)
    with pytest.raises(GraphError, match=r"should be \(h e\) = 6"):
        g.add(
            "split_heads",
            "z",
            (x,),
            {"axes": {"h": Dim("h", "head", 2), "e": Dim("e", "head_dim", 3)}},
        )


def test_repeat_kv_needs_a_multiple():
    g = _graph()
    k = _inp(g, "k", B, Dim("g", "kv_head", 2), S, Dim("e", "head_dim", 4))
    with pytest.raises(GraphError, match="3 heads are not a multiple of 2 kv heads"):
        g.add("repeat_kv", "r", (k,), {"axes": {"h": Dim("h", "head", 3)}})


def test_attention_flops_count_all_axes():
    g = _graph()
    h, e = Dim("h", "head", 4), Dim("e", "head_dim", 8)
    q = _inp(g, "q", B, h, T, e)
    k = _inp(g, "k", B, h, S, e)
    s = g.add("scores", "s", (q, k))
    assert s.out.dims == (B, h, T, S)
    assert node_flops(g, s) == (2 * 2 * 4 * 3 * 5 * 8, 0)
    sm = g.add("softmax", "sm", (s,))
    assert node_flops(g, sm) == (0, 5 * 2 * 4 * 3 * 5)


def test_moe_flops_count_routed_pairs():
    # C = B*T*k/E: the expert contraction counts exactly B*T*k token-expert pairs
    n_exp, k = Dim("E", "expert", 8), Dim("k", "topk", 2)
    c = Dim("C", "slot")
    g = _graph(C=2 * 3 * 2 / 8)
    x = _inp(g, "x", B, T, D8)
    idx = _inp(g, "idx", B, T, k, dtype="int64")
    wts = _inp(g, "wts", B, T, k)
    slots = g.add("moe_dispatch", "disp", (x, idx), {"axes": {"x": n_exp, "c": c}})
    f = Dim("f", "ffn", 16)
    w = _inp(g, "w", n_exp, f, D8)
    up = g.add("expert_linear", "up", (slots, w))
    assert up.out.dims == (n_exp, c, f)
    assert math.isclose(node_flops(g, up)[0], 2 * (2 * 3 * 2) * 8 * 16)
    w2 = _inp(g, "w2", n_exp, D8, f)
    down = g.add("expert_linear", "down", (up, w2))
    comb = g.add("moe_combine", "comb", (down, wts, idx))
    assert comb.out.dims == (B, T, D8)
    assert node_flops(g, comb) == (0, 2 * 2 * 3 * 2 * 8)  # a weighted sum, not a GEMM


def run(op, *xs, **attrs):
    return OPS[op].impl(list(xs), attrs)


def test_mask_causal_with_past_and_window():
    x = np.zeros((1, 1, 2, 5), np.float32)  # 2 new queries after 3 past keys
    m = run("mask", x, causal=True, window=None)
    assert (np.isfinite(m[0, 0]) == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]).all()
    m = run("mask", x, causal=True, window=2)
    assert (np.isfinite(m[0, 0]) == [[0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]).all()


def test_pair_dispatch_and_gather_keep_each_choice_its_own_vector():
    # a mixture of attention heads: a (token, choice) pair's own vector into its expert's slot
    # and back, or weighted into its token
    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 5, 2, 4)).astype(np.float32)
    w, idx = run("topk", rng.random((2, 5, 3)).astype(np.float32), k=2)
    axes = {"x": Dim("E", "expert", 3)}
    slots = run("moe_dispatch_pairs", a, idx, axes=axes)
    assert slots.shape == (3, 2 * 5, 4)
    np.testing.assert_array_equal(run("moe_gather", slots, idx), a)
    np.testing.assert_allclose(
        run("moe_combine", slots, w, idx), np.einsum("btk,btkd->btd", w, a), rtol=1e-6
    )
    # a token's vector dispatched to its k experts comes back once a choice
    x = a[:, :, 0]
    back = run("moe_gather", run("moe_dispatch", x, idx, axes=axes), idx)
    np.testing.assert_array_equal(back, np.repeat(x[:, :, None], 2, axis=2))


def test_softmax_rows_sum_to_one_with_masked_entries():
    x = run("mask", np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32))
    p = run("softmax", x)
    np.testing.assert_allclose(p.sum(-1), 1, rtol=1e-6)
    assert p[0, 0, 0, 1] == 0


def test_topk_dispatch_combine_round_trip():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    scores = rng.random((2, 5, 3)).astype(np.float32)
    w, idx = run("topk", scores, k=2)
    assert (w[..., 0] >= w[..., 1]).all() and idx.dtype == np.int64
    np.testing.assert_array_equal(np.take_along_axis(scores, idx, -1), w)
    slots = run("moe_dispatch", x, idx, axes={"x": Dim("E", "expert", 3)})
    assert slots.shape == (3, 2 * 5, 4)  # room for every token in every expert
    ones = np.ones_like(w)
    # identity experts with unit weights: each token comes back k times
    np.testing.assert_allclose(run("moe_combine", slots, ones, idx), 2 * x, rtol=1e-6)
    # issue 18 (Llama 4): each slot scaled by its own pair's weight, then a plain sum: with
    # identity experts, the router-weighted sum of the token itself; empty slots stay zero
    scaled = run("moe_scale_slots", slots, w, idx)
    assert (scaled[slots == 0] == 0).all()
    np.testing.assert_allclose(run("moe_sum", scaled, idx), w.sum(-1)[..., None] * x, rtol=1e-6)
    np.testing.assert_allclose(run("moe_sum", slots, idx), 2 * x, rtol=1e-6)
    # a nonlinear expert after the scale is not the scale after the expert
    sq = run("moe_sum", scaled**2, idx)
    assert not np.allclose(sq, run("moe_combine", slots**2, w, idx), atol=1e-3)


def test_expert_matmul_takes_in_out_matrices():
    rng = np.random.default_rng(2)
    slots, w = rng.standard_normal((3, 4, 5)), rng.standard_normal((3, 5, 6))
    out = run("expert_matmul", slots, w)
    np.testing.assert_allclose(out, run("expert_linear", slots, w.transpose(0, 2, 1)), rtol=1e-5)


def test_rope_rotates_pairs_by_position():
    x = np.zeros((1, 1, 2, 4), np.float32)
    x[..., 0] = 1.0  # first half, feature 0
    pos = np.array([[0, 1]])
    y = run("rope", x, pos, inv_freq=np.array([1.0, 0.5]), attention_scaling=1.0)
    np.testing.assert_allclose(y[0, 0, 0], [1, 0, 0, 0], atol=1e-7)
    np.testing.assert_allclose(y[0, 0, 1], [np.cos(1), 0, np.sin(1), 0], atol=1e-7)


def test_rmsnorm_offset():
    x = np.array([[3.0, 4.0]], np.float32)
    y = run("rmsnorm", x, np.zeros(2, np.float32), eps=0.0, weight_offset=1.0)
    np.testing.assert_allclose(y, x / np.sqrt(12.5), rtol=1e-6)


# issue 16: Cohere's LayerNorm, over the hidden axis and over each head with its own weight
def test_layernorm_centres_then_scales_and_a_head_norm_reads_its_own_weight_row():
    x = np.array([[1.0, 3.0]], np.float32)  # mean 2, variance 1
    y = run("layernorm", x, np.array([2.0, 3.0], np.float32), eps=0.0)
    np.testing.assert_allclose(y, [[-2.0, 3.0]], rtol=1e-6)
    heads = np.array([[[[1.0, 3.0]], [[0.0, 4.0]]]], np.float32)  # (B=1, h=2, T=1, e=2)
    w = np.array([[1.0, 1.0], [5.0, 7.0]], np.float32)  # head 1's own weights
    y = run("head_layernorm", heads, w, eps=0.0)
    np.testing.assert_allclose(y[0, :, 0], [[-1.0, 1.0], [-5.0, 7.0]], rtol=1e-6)
