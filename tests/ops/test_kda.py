"""Kimi Delta Attention's rows (graphllm.ops.delta, `kda_*`) against transformers' own torch
fallbacks (chunk_kimi_delta_attention over more than one chunk, from zeros and after a carried
state; recurrent_kimi_delta_attention), the chunked form's matmul FLOPs against
FlopCounterMode, and the prefix relation the tokens pass finds in them."""

import numpy as np
import pytest

from graphllm.build.dims import B, T
from graphllm.ir import STATE, Dim, Graph, Ref, TensorType
from graphllm.ops import OPS, node_flops
from graphllm.ops.delta import kda_other_flops
from graphllm.passes import run
from graphllm.passes.tokens import mixing_verdict

H, DK, DV = 3, 8, 6


def _inputs(t: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((2, t, H, DK)).astype(np.float32) for _ in range(2))
    q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) for x in (q, k))
    v = rng.standard_normal((2, t, H, DV)).astype(np.float32)
    g = (-0.3 * np.abs(rng.standard_normal((2, t, H, DK)))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((2, t, H))))).astype(np.float32)
    return [q, k, v, g, beta]


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    from transformers.models.kimi_linear import modeling_kimi_linear

    return modeling_kimi_linear


def _torch(xs):
    import torch

    return [torch.from_numpy(x) for x in xs]


def _fallback(fn):
    """transformers' torch function under its kernel-hub wrapper."""
    return getattr(fn, "__wrapped__", fn)


@pytest.mark.parametrize("past", [False, True])
def test_chunked_form_equals_transformers_over_two_chunks(hf, past):
    import torch

    xs = _inputs(70)  # 64 + 6: the second chunk padded, as transformers pads it
    init = np.random.default_rng(3).standard_normal((2, H, DK, DV)).astype(np.float32)
    state0 = torch.from_numpy(init) if past else None
    ref, ref_state = _fallback(hf.chunk_kimi_delta_attention)(
        *_torch(xs), chunk_size=64, initial_state=state0, output_final_state=True
    )
    op = "kda_chunked_state" if past else "kda_chunked"
    out, state = OPS[op].impl([*xs, init] if past else xs, {"chunk": 64})
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-5)
    np.testing.assert_allclose(state, ref_state.numpy(), atol=1e-5)


def test_recurrent_step_after_a_state_equals_transformers_and_the_chunked_form(hf):
    import torch

    xs = _inputs(3, seed=1)
    init = np.random.default_rng(2).standard_normal((2, H, DK, DV)).astype(np.float32)
    ref, ref_state = _fallback(hf.recurrent_kimi_delta_attention)(
        *_torch(xs), initial_state=torch.from_numpy(init), output_final_state=True
    )
    out, state = OPS["kda_step"].impl([*xs, init], {})
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-5)
    np.testing.assert_allclose(state, ref_state.numpy(), atol=1e-5)
    out2, state2 = OPS["kda_chunked_state"].impl([*xs, init], {"chunk": 2})
    np.testing.assert_allclose(out2, out, atol=1e-5)
    np.testing.assert_allclose(state2, state, atol=1e-5)


def _kda_graph(t: int, p: int, op: str, chunk: int = 4) -> Graph:
    g = Graph("kda", {"B": 2, "T": t, "P": p, "S": p + t})
    hd = Dim("h", "head", H)
    dk, dv = Dim("dk", "head_dim", DK), Dim("dv", "head_dim", DV)
    q = g.input("q", TensorType((B, T, hd, dk), "fp32"))
    k = g.input("k", TensorType((B, T, hd, dk), "fp32"))
    v = g.input("v", TensorType((B, T, hd, dv), "fp32"))
    decay = g.input("g", TensorType((B, T, hd, dk), "fp32"))
    beta = g.input("beta", TensorType((B, T, hd), "fp32"))
    ins = [q, k, v, decay, beta]
    if p:
        ins.append(g.input("state", TensorType((B, hd, dk, dv), "fp32")))
    n = g.add(op, "kda", tuple(ins), {"axes": {"t": T}, "chunk": chunk})
    g.set_output("logits", n)
    g.set_output("present.0.recurrent_state", Ref(n.name, 1), STATE)
    return g


def test_the_rule_finds_the_recurrence_and_its_prefix():
    g = _kda_graph(6, 0, "kda_chunked")
    assert mixing_verdict(g, g["kda"]).mixes
    tokens = run(g, ["tokens"])["tokens"]
    for t in range(6):
        assert tokens.depends_on(t) == list(range(t + 1))


@pytest.mark.parametrize("op", ["kda_step", "kda_chunked_state"])
def test_the_carried_state_stands_for_every_past_position(op):
    g = _kda_graph(2, 5, op)
    tokens = run(g, ["tokens"])["tokens"]
    assert tokens.depends_on(0) == list(range(6))  # the state's 0..4, and position 5 itself
    assert tokens.depends_on(1) == list(range(7))


@pytest.mark.parametrize("t", [16, 13])  # a multiple of the chunk, and one transformers pads
def test_chunked_matmul_flops_equal_flop_counter_mode(hf, t):
    from torch.utils.flop_counter import FlopCounterMode

    chunk = 8
    xs = _torch(_inputs(t))
    with FlopCounterMode(display=False) as counter:
        _fallback(hf.chunk_kimi_delta_attention)(*xs, chunk_size=chunk, output_final_state=True)
    g = _kda_graph(t, 0, "kda_chunked", chunk=chunk)
    matmul, other = node_flops(g, g["kda"])
    assert matmul == counter.get_total_flops()
    tp = -(-t // chunk) * chunk  # the closed form of the elementwise work, term by term
    per_position = 8 * chunk * DK + 8 * DK + 3 * DV
    per_chunk = (chunk - 1) * chunk * (2 * chunk - 1) / 3 + 2 * DK * DV + DK
    assert other == 2 * H * (tp * per_position + tp // chunk * per_chunk)
    sizes = {"b": 2, "h": H, "t": t, "k": DK, "v": DV}
    assert other == kda_other_flops(sizes, {"chunk": chunk})


def test_the_step_counts_its_multiply_and_sum_and_no_matmul(hf):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    xs = _torch(_inputs(1))
    state = torch.zeros(2, H, DK, DV)
    with FlopCounterMode(display=False) as counter:
        _fallback(hf.recurrent_kimi_delta_attention)(*xs, state, True)
    assert counter.get_total_flops() == 0
    g = _kda_graph(1, 5, "kda_step")
    assert node_flops(g, g["kda"]) == (0.0, 2 * H * (7 * DK * DV + 2 * DV + DK))


def test_the_decay_is_a_key_channels():
    g = Graph("bad", {"B": 1, "T": 2})
    hd, dk = Dim("h", "head", H), Dim("dk", "head_dim", DK)
    q = g.input("q", TensorType((B, T, hd, dk), "fp32"))
    wrong = g.input("g", TensorType((B, T, hd, Dim("x", "head_dim", DK + 1)), "fp32"))
    s = g.input("s", TensorType((B, T, hd), "fp32"))
    with pytest.raises(Exception, match="k="):
        g.add("kda_chunked", "d", (q, q, q, wrong, s), {"axes": {"t": T}, "chunk": 4})


@pytest.mark.parametrize(("op", "t", "p"), [("kda_chunked", 6, 0), ("kda_step", 1, 5)])
def test_the_state_is_read_and_written_once(op, t, p):
    """Bytes: q, k, v, the decay (d_k a head) and beta read, the output written, and the fp32
    state (B, H, d_k, d_v) read where it is carried and written once, whatever the chunking."""
    g = _kda_graph(t, p, op)
    run(g, ["cost"])
    cost = g["kda"].meta["cost"]
    state = 4 * 2 * H * DK * DV
    tokens = 4 * 2 * t * H * (3 * DK + DV + 1)
    assert cost.bytes_read == tokens + (state if p else 0)
    assert cost.bytes_written == 4 * 2 * t * H * DV + state
