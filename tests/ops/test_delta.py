"""issue 19: the gated delta rule's rows (graphllm.ops.delta) against transformers' own torch
implementations (torch_chunk_gated_delta_rule over more than one chunk, and
torch_recurrent_gated_delta_rule after a carried state); the chunked form's matmul FLOPs against
FlopCounterMode; and the tokens pass's prefix relation, the carried state reaching every past
position."""

import numpy as np
import pytest

from graphllm.build.dims import B, T
from graphllm.ir import STATE, Dim, Graph, Ref, TensorType
from graphllm.ops import OPS, node_flops
from graphllm.ops.delta import chunked_other_flops
from graphllm.passes import run
from graphllm.passes.tokens import mixing_verdict

G, H, DK, DV = 2, 4, 8, 6


def _inputs(t: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((2, t, G, DK)).astype(np.float32) for _ in range(2))
    q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-6) for x in (q, k))
    v = rng.standard_normal((2, t, H, DV)).astype(np.float32)
    g = (-0.3 * np.abs(rng.standard_normal((2, t, H)))).astype(np.float32)
    beta = (1 / (1 + np.exp(-rng.standard_normal((2, t, H))))).astype(np.float32)
    return [q, k, v, g, beta]


@pytest.fixture(scope="module")
def hf():
    pytest.importorskip("transformers")
    from transformers.models.qwen3_next import modeling_qwen3_next

    return modeling_qwen3_next


def _torch(xs):
    import torch

    return [torch.from_numpy(x) for x in xs]


def test_chunked_form_equals_transformers_over_two_chunks(hf):
    xs = _inputs(70)  # 64 + 6: the second chunk padded, as transformers pads it
    ref, ref_state = hf.torch_chunk_gated_delta_rule(
        *_torch(xs), chunk_size=64, output_final_state=True
    )
    out, state = OPS["gated_delta_chunked"].impl(xs, {"chunk": 64})
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-5)
    np.testing.assert_allclose(state, ref_state.numpy(), atol=1e-5)


def test_recurrent_step_after_a_state_equals_transformers_and_the_chunked_form(hf):
    import torch

    xs = _inputs(3, seed=1)
    init = np.random.default_rng(2).standard_normal((2, H, DK, DV)).astype(np.float32)
    ref, ref_state = hf.torch_recurrent_gated_delta_rule(
        *_torch(xs), initial_state=torch.from_numpy(init), output_final_state=True
    )
    out, state = OPS["gated_delta_step"].impl([*xs, init], {})
    np.testing.assert_allclose(out, ref.numpy(), atol=1e-5)
    np.testing.assert_allclose(state, ref_state.numpy(), atol=1e-5)
    out2, state2 = OPS["gated_delta_chunked_state"].impl([*xs, init], {"chunk": 2})
    np.testing.assert_allclose(out2, out, atol=1e-5)
    np.testing.assert_allclose(state2, state, atol=1e-5)


def _delta_graph(t: int, p: int, op: str, chunk: int = 4) -> Graph:
    g = Graph("delta", {"B": 2, "T": t, "P": p, "S": p + t})
    gd, hd = Dim("g", "kv_head", G), Dim("h", "head", H)
    dk, dv = Dim("dk", "head_dim", DK), Dim("dv", "head_dim", DV)
    q = g.input("q", TensorType((B, T, gd, dk), "fp32"))
    k = g.input("k", TensorType((B, T, gd, dk), "fp32"))
    v = g.input("v", TensorType((B, T, hd, dv), "fp32"))
    decay = g.input("g", TensorType((B, T, hd), "fp32"))
    beta = g.input("beta", TensorType((B, T, hd), "fp32"))
    ins = [q, k, v, decay, beta]
    if p:
        ins.append(g.input("state", TensorType((B, hd, dk, dv), "fp32")))
    n = g.add(op, "delta", tuple(ins), {"axes": {"t": T}, "chunk": chunk})
    g.set_output("logits", n)
    g.set_output("present.0.recurrent_state", Ref(n.name, 1), STATE)
    return g


def test_the_unchanged_rule_finds_the_recurrence_and_its_prefix():
    g = _delta_graph(6, 0, "gated_delta_chunked")
    assert mixing_verdict(g, g["delta"]).mixes
    tokens = run(g, ["tokens"])["tokens"]
    for t in range(6):
        assert tokens.depends_on(t) == list(range(t + 1))


@pytest.mark.parametrize("op", ["gated_delta_step", "gated_delta_chunked_state"])
def test_the_carried_state_stands_for_every_past_position(op):
    g = _delta_graph(2, 5, op)
    tokens = run(g, ["tokens"])["tokens"]
    assert tokens.depends_on(0) == list(range(6))  # the state's 0..4, and position 5 itself
    assert tokens.depends_on(1) == list(range(7))


def test_chunked_matmul_flops_equal_flop_counter_mode(hf):
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    t, chunk = 16, 8  # T a multiple of the chunk: transformers pads nothing
    with torch.device("meta"):
        xs = [torch.empty(x.shape) for x in _inputs(t)]
        with FlopCounterMode(display=False) as counter:
            hf.torch_chunk_gated_delta_rule(*xs, chunk_size=chunk, output_final_state=True)
    g = _delta_graph(t, 0, "gated_delta_chunked", chunk=chunk)
    matmul, other = node_flops(g, g["delta"])
    assert matmul == counter.get_total_flops()
    n = t // chunk  # the closed form of the elementwise work, term by term
    per_position = (chunk - 1) * (DK + DV) + (DK + DV) + 4 * chunk + 3 + 3 * DK + 2 * DV
    assert other == 2 * H * (t * per_position + n * 2 * DK * DV)
    sizes = {"b": 2, "h": H, "t": t, "k": DK, "v": DV}
    assert other == chunked_other_flops(sizes, {"chunk": chunk})


def test_the_step_counts_its_multiply_and_sum_and_no_matmul():
    g = _delta_graph(1, 5, "gated_delta_step")
    assert node_flops(g, g["delta"]) == (0.0, 2 * 1 * H * (7 * DK * DV + 2 * DV + 1))


def test_value_heads_must_be_a_multiple_of_key_heads():
    g = Graph("bad", {"B": 1, "T": 2})
    d = Dim("dk", "head_dim", DK)
    q = g.input("q", TensorType((B, T, Dim("g", "kv_head", 3), d), "fp32"))
    v = g.input("v", TensorType((B, T, Dim("h", "head", 4), d), "fp32"))
    s = g.input("s", TensorType((B, T, Dim("h", "head", 4)), "fp32"))
    with pytest.raises(Exception, match="not a multiple of 3 key heads"):
        g.add("gated_delta_chunked", "d", (q, q, v, s, s), {"axes": {"t": T}, "chunk": 4})
