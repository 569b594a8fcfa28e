"""Lightning attention's rows (graphllm.ops.lightning) against transformers' own
MiniMaxLightningAttention: its block loop from a zero state (T below, at and past a block, not a
multiple of it) and its token loop after a carried state, read off the layer's forward (q, k, v
after its activation, the loop's output where the layer's norm reads it, the state it returns);
the rows' matmul FLOPs against FlopCounterMode at each T, their bytes, and the prefix relation
the tokens pass finds in them."""

import numpy as np
import pytest

from graphllm.build.dims import B, T
from graphllm.ir import STATE, Dim, Graph, Ref, TensorType
from graphllm.ops import OPS, node_flops
from graphllm.ops.lightning import block_flops
from graphllm.passes import run
from graphllm.passes.tokens import mixing_verdict

H, D, HIDDEN, BLOCK = 2, 8, 16, 4


@pytest.fixture(scope="module")
def layer():
    """A MiniMax lightning attention layer (the second of two: its own decay rate) with
    blocks of 4 positions, random weights."""
    pytest.importorskip("transformers")
    import torch
    from transformers import MiniMaxConfig
    from transformers.models.minimax.modeling_minimax import MiniMaxLightningAttention

    cfg = MiniMaxConfig(
        hidden_size=HIDDEN,
        num_attention_heads=H,
        head_dim=D,
        num_hidden_layers=3,
        block_size=BLOCK,
        layer_types=["full_attention", "linear_attention", "linear_attention"],
    )
    torch.manual_seed(0)
    m = MiniMaxLightningAttention(cfg, layer_idx=1).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.3)
    return m


def _run(layer, t: int, state0: np.ndarray | None = None):
    """transformers' layer on random hidden states: (q, k, v heads first, the rate, the loop's
    output heads first, the final state), the loop's FLOPs (FlopCounterMode, less the
    projections')."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers.models.minimax.modeling_minimax import MiniMaxCache

    seen = {}
    hooks = [
        layer.act_fn.register_forward_hook(lambda m, a, out: seen.setdefault("qkv", out)),
        layer.norm.register_forward_pre_hook(lambda m, a: seen.setdefault("o", a[0])),
    ]
    cache = None
    if state0 is not None:
        cache = MiniMaxCache()
        cache.set_linear_cache(layer.layer_idx, torch.from_numpy(state0))
        cache.update(torch.zeros(2, 1, 1, 1), torch.zeros(2, 1, 1, 1), layer.layer_idx + 1)
    x = torch.from_numpy(np.random.default_rng(t).standard_normal((2, t, HIDDEN)).astype("f4"))
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            _, state = layer(x, None, None, cache=cache)
    finally:
        for h in hooks:
            h.remove()
    qkv = seen["qkv"].reshape(2, t, H, 3 * D).transpose(1, 2).numpy()
    q, k, v = qkv[..., :D], qkv[..., D : 2 * D], qkv[..., 2 * D :]
    out = seen["o"].reshape(2, t, H, D).transpose(1, 2).numpy()
    projections = 2 * 2 * t * HIDDEN * (3 * H * D + H * D + H * D)
    rate = layer.slope_rate.reshape(-1).numpy()
    return [q, k, v, rate], out, state.numpy(), counter.get_total_flops() - projections


def _graph(t: int, p: int) -> Graph:
    g = Graph("lightning", {"B": 2, "T": t, "P": p, "S": p + t})
    hd, dk = Dim("h", "head", H), Dim("d", "head_dim", D)
    ins = [g.input(x, TensorType((B, hd, T, dk), "fp32")) for x in "qkv"]
    ins.append(g.input("rate", TensorType((hd,), "fp32")))
    if p:
        ins.append(g.input("state", TensorType((B, hd, dk, dk), "fp32")))
    op = "lightning_attention_past" if p else "lightning_attention"
    n = g.add(op, "lightning", tuple(ins), {"axes": {"t": T}, "block": BLOCK})
    g.set_output("logits", n)
    g.set_output("present.0.linear_cache", Ref(n.name, 1), STATE)
    return g


@pytest.mark.parametrize("t", [3, 4, 5, 9])  # inside a block, one block, past it, 2 blocks + 1
def test_block_form_equals_transformers_and_its_flops(layer, t):
    xs, want, want_state, loop_flops = _run(layer, t)
    out, state = OPS["lightning_attention"].impl(xs, {"block": BLOCK})
    np.testing.assert_allclose(out, want, atol=1e-5)
    np.testing.assert_allclose(state, want_state, atol=1e-5)
    g = _graph(t, 0)
    matmul, other = node_flops(g, g["lightning"])
    assert matmul == loop_flops
    # the closed form, term by term: intra QK^T and (QK^T)V on each block's l^2 pairs, the
    # inter-block Q S and K^T V on every position
    full, rest = divmod(t, BLOCK)
    squares = full * BLOCK**2 + rest**2
    assert matmul == 2 * H * (2 * squares * 2 * D + 4 * t * D * D)
    blocks = full + (rest > 0)
    assert other == 2 * H * (squares + t * 3 * D + blocks * 2 * D * D)


@pytest.mark.parametrize("t", [1, 3, 6])
def test_token_form_after_a_state_equals_transformers_and_its_flops(layer, t):
    init = np.random.default_rng(7).standard_normal((2, H, D, D)).astype(np.float32)
    xs, want, want_state, loop_flops = _run(layer, t, init)
    out, state = OPS["lightning_attention_past"].impl([*xs, init], {"block": BLOCK})
    np.testing.assert_allclose(out, want, atol=1e-5)
    np.testing.assert_allclose(state, want_state, atol=1e-5)
    g = _graph(t, 5)
    assert node_flops(g, g["lightning"]) == (4 * 2 * H * t * D * D, 2 * 2 * H * t * D * D)
    assert node_flops(g, g["lightning"])[0] == loop_flops


def test_blocks_from_zeros_equal_tokens_from_a_zero_state(layer):
    xs, *_ = _run(layer, 10)
    blocks = OPS["lightning_attention"].impl(xs, {"block": 3})
    tokens = OPS["lightning_attention_past"].impl([*xs, np.zeros((2, H, D, D), "f4")], {})
    for a, b in zip(blocks, tokens, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


def test_the_block_count_holds_at_any_length():
    sizes = {"b": 1, "h": 1, "k": 1, "v": 1}
    # blocks of 2 over 5 positions: 2, 2 and 1
    assert block_flops(sizes | {"t": 5}, {"block": 2}) == (2 * 9 * 2 + 4 * 5, 9 + 15 + 3 * 2)


def test_the_rule_finds_the_recurrence_and_its_prefix():
    g = _graph(6, 0)
    assert mixing_verdict(g, g["lightning"]).mixes
    tokens = run(g, ["tokens"])["tokens"]
    for t in range(6):
        assert tokens.depends_on(t) == list(range(t + 1))


def test_the_carried_state_stands_for_every_past_position():
    tokens = run(_graph(2, 5), ["tokens"])["tokens"]
    assert tokens.depends_on(0) == list(range(6))  # the state's 0..4, and position 5 itself
    assert tokens.depends_on(1) == list(range(7))


@pytest.mark.parametrize(("t", "p"), [(6, 0), (1, 5), (3, 5)])
def test_the_state_is_read_and_written_once(t, p):
    """Bytes: q, k, v and the rate read, the output written, the state (B, H, d_k, d_v) read
    where it is carried and written once, whatever the blocks or tokens."""
    g = _graph(t, p)
    run(g, ["cost"])
    cost = g["lightning"].meta["cost"]
    state = 4 * 2 * H * D * D
    assert cost.bytes_read == 4 * (2 * H * t * 3 * D + H) + (state if p else 0)
    assert cost.bytes_written == 4 * 2 * H * t * D + state
