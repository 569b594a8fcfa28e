"""issue 19: the rows hybrid layers share (graphllm.ops.recurrent): the causal depthwise conv with
its carried state, against torch's conv1d as transformers calls it; its FLOPs; the tokens pass's
window of K positions found from its signature; the zeroing of padded positions."""

import numpy as np
import pytest

from graphllm.build.dims import B, P, S, T
from graphllm.ir import STATE, Dim, Graph, TensorType
from graphllm.ops import OPS, node_flops
from graphllm.passes import run
from graphllm.passes.tokens import mixing_verdict

K, CH = 4, 6
C = Dim("c", "hidden", CH)
TAPS = (Dim("one", "hidden", 1), Dim("K", "hidden", K))


def _conv_graph(t: int, p: int, bias: bool = False) -> Graph:
    """x (B, T, C) through a causal conv of K taps after a past conv state when p > 0."""
    b = {"B": 2, "T": t, "P": p, "S": p + t, "S_conv": K - 1 + t}
    g = Graph("conv", b)
    x = g.input("x", TensorType((B, T, C), "fp32"))
    w = g.param("w", TensorType((C, *TAPS), "fp32"))
    ins = [x]
    if p:
        w_past = Dim("conv_w", "key_token", K - 1, positions=(f"P-{K - 1}", "P"))
        past = g.input("past", TensorType((B, w_past, C), "fp32"))
        s_conv = Dim("S_conv", "key_token", positions=(f"P-{K - 1}", "P+T"))
        ins = [g.add("state_concat", "cat", (past, x), {"axes": {"s": s_conv}})]
    w_now = Dim("conv_w", "key_token", K - 1, positions=(f"P+T-{K - 1}", "P+T"))
    st = g.add("conv_state", "state", (ins[0],), {"axes": {"w": w_now}})
    g.set_output("present.0.conv_state", st, STATE)
    args = (ins[0], w) + ((g.param("bias", TensorType((C,), "fp32")),) if bias else ())
    attrs = {"axes": {"t": T}, "kernel": K, "with_state": p > 0}
    y = g.add("causal_conv1d_bias" if bias else "causal_conv1d", "conv", args, attrs)
    g.set_output("logits", y)
    return g


def _run(g: Graph, feeds: dict) -> dict:
    from graphllm.runtime.interpret import Interpreter

    return Interpreter(g, {k: v for k, v in feeds.items() if k in ("w", "bias")}).run(feeds)


def test_conv_equals_torch_conv1d_with_and_without_a_carried_state():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 7, CH)).astype(np.float32)
    w = rng.standard_normal((CH, 1, K)).astype(np.float32)
    bias = rng.standard_normal(CH).astype(np.float32)
    # transformers' causal_conv1d_fn: pad K-1 on both sides, keep the first T outputs
    xt = torch.from_numpy(x).transpose(1, 2)
    ref = F.conv1d(xt, torch.from_numpy(w), torch.from_numpy(bias), padding=K - 1, groups=CH)
    ref = ref[:, :, :7].transpose(1, 2).numpy()
    out = _run(_conv_graph(7, 0, bias=True), {"x": x, "w": w, "bias": bias})
    np.testing.assert_allclose(out["logits"], ref, atol=1e-5)
    # the state: the last K-1 inputs
    np.testing.assert_array_equal(out["present.0.conv_state"], x[:, -(K - 1) :])
    # a prompt of 5 then 2 more tokens from its state equals the 7 at once
    first = _run(_conv_graph(5, 0, bias=True), {"x": x[:, :5], "w": w, "bias": bias})
    feeds = {"x": x[:, 5:], "w": w, "bias": bias, "past": first["present.0.conv_state"]}
    second = _run(_conv_graph(2, 5, bias=True), feeds)
    np.testing.assert_allclose(second["logits"], ref[:, 5:], atol=1e-5)
    np.testing.assert_array_equal(second["present.0.conv_state"], x[:, -(K - 1) :])


def test_a_prompt_shorter_than_the_kernel_keeps_zeros_in_its_state():
    x = np.ones((2, 1, CH), np.float32)
    out = _run(_conv_graph(1, 0), {"x": x, "w": np.ones((CH, 1, K), np.float32)})
    assert out["present.0.conv_state"].shape == (2, K - 1, CH)
    np.testing.assert_array_equal(out["present.0.conv_state"][:, : K - 2], 0)
    np.testing.assert_array_equal(out["present.0.conv_state"][:, -1], 1)
    np.testing.assert_array_equal(out["logits"], 1)  # one tap sees the input, the rest zeros


def test_conv_flops_count_2k_per_output_and_the_bias():
    g = _conv_graph(7, 0)
    assert node_flops(g, g["conv"]) == (0.0, 2 * K * 2 * 7 * CH)
    g = _conv_graph(7, 0, bias=True)
    assert node_flops(g, g["conv"]) == (0.0, (2 * K + 1) * 2 * 7 * CH)
    g = _conv_graph(1, 9)  # a decode step: T outputs, whatever the past
    assert node_flops(g, g["conv"]) == (0.0, 2 * K * 2 * 1 * CH)


def test_the_unchanged_mixing_rule_finds_the_conv_and_its_window():
    g = _conv_graph(9, 0)
    v = mixing_verdict(g, g["conv"])
    assert v.mixes and "contracts position axis s" in v.reason
    assert not mixing_verdict(g, g["state"]).mixes  # a copy of positions
    tokens = run(g, ["tokens"])["tokens"]
    for t in range(9):  # position t reads t-K+1 .. t
        assert tokens.depends_on(t) == list(range(max(0, t - K + 1), t + 1))


def test_after_a_past_the_window_reaches_into_the_carried_state():
    g = _conv_graph(3, 5)
    tokens = run(g, ["tokens"])["tokens"]
    assert tokens.depends_on(0) == [2, 3, 4, 5]  # position 5 reads 2..5: three from the state
    assert tokens.depends_on(2) == [4, 5, 6, 7]
    g = _conv_graph(2, 1)  # a past shorter than K-1: the state's first entries precede 0
    assert run(g, ["tokens"])["tokens"].depends_on(0) == [0, 1]


def test_zero_padding_zeroes_padded_positions_of_the_new_tokens():
    g = Graph("pad", {"B": 2, "T": 3, "P": 2, "S": 5})
    x = g.input("x", TensorType((B, T, C), "fp32"))
    m = g.input("attention_mask", TensorType((B, S), "int64"))
    y = g.add("zero_padding", "y", (x, m))
    g.set_output("logits", y)
    assert not mixing_verdict(g, y).mixes
    xs = np.ones((2, 3, CH), np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [0, 0, 0, 1, 1]])
    out = _run(g, {"x": xs, "attention_mask": mask})["logits"]
    np.testing.assert_array_equal(out[0], 1)
    np.testing.assert_array_equal(out[1, 0], 0)
    np.testing.assert_array_equal(out[1, 1:], 1)
    assert node_flops(g, y) == (0.0, 2 * 3 * CH)
    assert run(g, ["tokens"])["tokens"].depends_on(1) == [3]
    assert P.role == "key_token"  # the mask's past entries are key positions, not outputs


def test_the_shared_rows_are_registered_with_their_relations():
    assert OPS["causal_conv1d"].relation is not None
    assert OPS["causal_conv1d_bias"].relation is not None
    assert OPS["state_concat"].same_position == (("s", "w", "t"),)
