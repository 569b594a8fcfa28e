"""RWKV-4's WKV rows (graphllm.ops.wkv) against transformers' own torch loop
(rwkv_linear_attention_cpu, from its default state and from a carried one), their FLOPs against
FlopCounterMode (no matmul) and the kernel's elementwise count, their bytes (the state read and
written once), the prefix relation the tokens pass finds in them, and their ONNX lowering on
onnxruntime."""

import numpy as np
import pytest

from graphllm.build.dims import B, T
from graphllm.exporters.onnx import lower
from graphllm.ir import STATE, Dim, Graph, Ref, TensorType
from graphllm.ops import OPS, node_flops
from graphllm.ops.wkv import wkv_flops
from graphllm.passes import run
from tests.support.recurrent_rows import assert_prefix_mixing

D = 6


def _inputs(t: int, seed: int = 0) -> list[np.ndarray]:
    """key, value (2, t, D), time_decay, time_first (D): keys spread wide, so the running
    maximum changes hands."""
    rng = np.random.default_rng(seed)
    f = np.float32
    return [
        (4 * rng.standard_normal((2, t, D))).astype(f),
        rng.standard_normal((2, t, D)).astype(f),
        rng.standard_normal(D).astype(f),
        rng.standard_normal(D).astype(f),
    ]


def _state(seed: int = 1) -> list[np.ndarray]:
    """num, den (den > 0, as a state is) and max (2, D)."""
    rng = np.random.default_rng(seed)
    num = rng.standard_normal((2, D)).astype(np.float32)
    den = np.abs(rng.standard_normal((2, D))).astype(np.float32) + 0.5
    return [num, den, rng.standard_normal((2, D)).astype(np.float32)]


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    from transformers.models.rwkv import modeling_rwkv

    return modeling_rwkv


def _theirs(hf, xs: list[np.ndarray], state: list[np.ndarray] | None):
    import torch

    k, v, decay, first = (torch.from_numpy(x.copy()) for x in xs)
    carried = [torch.from_numpy(s.copy()) for s in state] if state is not None else None
    out, final = hf.rwkv_linear_attention_cpu(decay, first, k, v, carried, return_state=True)
    return [out.numpy(), *(s.numpy() for s in final)]


@pytest.mark.parametrize("t", [1, 9])
@pytest.mark.parametrize("carried", [False, True])
def test_the_rows_equal_transformers_loop(hf, t, carried):
    xs, state = _inputs(t), _state() if carried else None
    op = "wkv4_scan_state" if carried else "wkv4_scan"
    got = OPS[op].impl([*xs, *state] if state else xs, {})
    for a, b in zip(got, _theirs(hf, xs, state), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_a_scan_in_two_parts_equals_one_over_all():
    """The state carries everything: 4 tokens, then 5 from the state the 4 leave, give the 9."""
    xs = _inputs(9)
    y, *state = OPS["wkv4_scan"].impl(xs, {})
    first = [xs[0][:, :4], xs[1][:, :4], *xs[2:]]
    y1, *mid = OPS["wkv4_scan"].impl(first, {})
    rest = [xs[0][:, 4:], xs[1][:, 4:], *xs[2:], *mid]
    y2, *end = OPS["wkv4_scan_state"].impl(rest, {})
    np.testing.assert_allclose(np.concatenate([y1, y2], 1), y, rtol=1e-5, atol=1e-6)
    for a, b in zip(end, state, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _graph(t: int, p: int) -> Graph:
    g = Graph("wkv", {"B": 2, "T": t, "P": p, "S": p + t})
    d = Dim("d", "hidden", D)

    def inp(name: str, *dims: Dim) -> Ref:
        return g.input(name, TensorType(dims, "fp32"))

    ins = [inp("key", B, T, d), inp("value", B, T, d), inp("time_decay", d), inp("time_first", d)]
    if p:
        ins += [inp(f"past_key_values.0.state.{j}", B, d) for j in (2, 3, 4)]
    node = g.add("wkv4_scan_state" if p else "wkv4_scan", "wkv", tuple(ins), {"axes": {"t": T}})
    g.set_output("logits", node)
    for j in (1, 2, 3):
        g.set_output(f"present.0.state.{j + 1}", Ref(node.name, j), STATE)
    return g


def test_the_rows_mix_their_prefix_and_the_state_stands_for_the_past():
    assert_prefix_mixing(_graph, "wkv")


@pytest.mark.parametrize(("t", "p"), [(7, 0), (1, 4), (5, 4)])
def test_flops_and_bytes_are_a_fused_kernels(hf, t, p):
    """No matmul (FlopCounterMode counts none of transformers' loop, nor does the kernel run
    one); 23 elementwise FLOPs a token and channel and -exp(time_decay) once; the state read
    and written once, not once a token."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    g = _graph(t, p)
    matmul, other = node_flops(g, g["wkv"])
    with torch.device("meta"), FlopCounterMode(display=False) as fc:
        xs = [torch.empty(x.shape) for x in _inputs(t)]
        state = [torch.empty((2, D)) for _ in range(3)] if p else None
        hf.rwkv_linear_attention_cpu(xs[2], xs[3], xs[0], xs[1], state, return_state=True)
    assert matmul == fc.get_total_flops() == 0
    assert other == 2 * t * D * 23 + 2 * D == wkv_flops({"b": 2, "t": t, "d": D}, {})
    run(g, ["cost"])
    cost = g["wkv"].meta["cost"]
    tokens, state = 4 * 2 * t * D, 4 * 3 * 2 * D  # fp32 key (value, output); num, den, max
    assert cost.bytes_read == 2 * tokens + 4 * 2 * D + (state if p else 0)
    assert cost.bytes_written == tokens + state


@pytest.mark.parametrize("p", [0, 4])
def test_the_onnx_scan_equals_the_rows(p):
    """The decomposed lowering (a Scan over the tokens) on onnxruntime: the default state
    (num = den = 0, max = -1e38) where no state comes in, the carried one where it does."""
    ort = pytest.importorskip("onnxruntime")
    t = 7
    g = _graph(t, p)
    model, _ = lower(g, "decomposed")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = _inputs(t, seed=5)
    names = ["key", "value", "time_decay", "time_first"]
    feeds = dict(zip(names, xs))
    if p:
        feeds |= {f"past_key_values.0.state.{j}": s for j, s in zip((2, 3, 4), _state(6))}
    outs = ["logits", *(f"present.0.state.{j}" for j in (2, 3, 4))]
    got = session.run(outs, feeds)
    op = "wkv4_scan_state" if p else "wkv4_scan"
    want = OPS[op].impl([feeds[i.name] for i in g.nodes("input")], {})
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
