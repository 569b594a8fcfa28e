"""The linear recurrence rows (graphllm.ops.lru, the RG-LRU's scan): their numpy reference
against transformers' `RecurrentGemmaRglru._rnn_scan`, their FLOPs against FlopCounterMode,
their bytes (the state read and written once), their prefix relation; `one_token_state`."""

from __future__ import annotations

import numpy as np
import pytest

from graphllm.build.dims import B, T
from graphllm.ir import STATE, Dim, Graph, Ref, TensorType
from graphllm.ops import OPS, node_flops
from graphllm.ops.lru import lru_flops
from graphllm.passes import run
from tests.support.recurrent_rows import assert_prefix_mixing

D = 6


def _inputs(t: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, the decay a in (0, 1), a carried state (B, D)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, t, D)).astype(np.float32)
    a = rng.uniform(0.5, 1.0, (2, t, D)).astype(np.float32)
    return x, a, rng.standard_normal((2, D)).astype(np.float32)


def _theirs(x: np.ndarray, a: np.ndarray, reset: np.ndarray, state: np.ndarray | None):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRglru

    h0 = None if state is None else torch.from_numpy(state)
    y, final = RecurrentGemmaRglru._rnn_scan(
        None, torch.from_numpy(x), torch.from_numpy(a), torch.from_numpy(reset), h0
    )
    return y.numpy(), final.numpy()


@pytest.mark.parametrize("t", [1, 7])
@pytest.mark.parametrize("carried", [False, True])
def test_the_scan_equals_transformers(t, carried):
    x, a, state = _inputs(t)
    reset = np.zeros((2, t, 1), bool)
    if not carried:  # a first step: transformers resets the decay at position 0
        reset[:, 0] = True
    decay = a * ~reset  # the model's own elementwise code, before the scan
    ins = [x, decay] + ([state] if carried else [])
    row = "linear_recurrence_state" if carried else "linear_recurrence"
    y, final = OPS[row].impl(ins, {})
    ty, tfinal = _theirs(x, a, reset, state if carried else None)
    np.testing.assert_allclose(y, ty, atol=1e-5, rtol=0)
    np.testing.assert_allclose(final, tfinal, atol=1e-5, rtol=0)


def _graph(t: int, p: int) -> Graph:
    g = Graph("lru", {"B": 2, "T": t, "P": p, "S": p + t})
    d = Dim("d", "hidden", D)
    ins = [g.input(n, TensorType((B, T, d), "fp32")) for n in ("x", "a")]
    if p:
        ins.append(g.input("past_key_values.0.recurrent_states", TensorType((B, d), "fp32")))
    op = "linear_recurrence_state" if p else "linear_recurrence"
    node = g.add(op, "scan", tuple(ins), {"axes": {"t": T}})
    g.set_output("logits", node)
    g.set_output("present.0.recurrent_states", Ref(node.name, 1), STATE)
    return g


def test_the_scan_mixes_its_prefix_and_the_state_stands_for_the_past():
    assert_prefix_mixing(_graph, "scan")


@pytest.mark.parametrize(("t", "p"), [(7, 0), (1, 4), (5, 4)])
def test_its_flops_and_bytes_are_a_fused_kernels(t, p):
    """No matmul (FlopCounterMode counts none of transformers' loop), a multiply and an add a
    token and channel; the state read and written once, not once a token."""
    pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    g = _graph(t, p)
    matmul, other = node_flops(g, g["scan"])
    x, a, state = _inputs(t)
    with FlopCounterMode(display=False) as fc:
        _theirs(x, a, np.zeros((2, t, 1), bool), state)
    assert matmul == fc.get_total_flops() == 0
    assert other == 2 * 2 * t * D
    assert (matmul, other) == lru_flops({"b": 2, "t": t, "d": D}, {})
    run(g, ["cost"])
    cost = g["scan"].meta["cost"]
    state_bytes = 4 * 2 * D
    assert cost.bytes_read == 2 * 4 * 2 * t * D + (state_bytes if p else 0)
    assert cost.bytes_written == 4 * 2 * t * D + state_bytes


def test_one_token_state_is_the_state_for_one_token_and_zeros_for_more():
    state = np.random.default_rng(0).standard_normal((2, D, 3)).astype(np.float32)
    one = OPS["one_token_state"].impl([state, np.zeros((2, D, 1), np.float32)], {})
    np.testing.assert_array_equal(one, state)
    several = OPS["one_token_state"].impl([state, np.zeros((2, D, 4), np.float32)], {})
    np.testing.assert_array_equal(several, np.zeros_like(state))
