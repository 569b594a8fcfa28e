"""Mamba-1 (Mamba, Falcon-Mamba, Zamba): the selective_scan rows (graphllm.ops.mamba1) against
transformers' torch fallbacks, their FLOPs against FlopCounterMode, their prefix relation, and
traced models against transformers' forward (prefill, several tokens after a past, one token
after a past) and on onnxruntime; a published config's parameter count."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")
from graphllm.build.dims import B, T
from graphllm.cli.main import main
from graphllm.ir import STATE, Dim, Graph, Ref, TensorType
from graphllm.models.workload import Workload
from graphllm.ops import OPS, node_flops
from graphllm.ops.mamba1 import selective_flops
from graphllm.passes import run
from graphllm.trace import traced_graph
from tests.support.recurrent_rows import assert_prefix_mixing
from tests.support.traced import P, assert_recurrent_equal, check_traced, onnx_against_transformers

D, N = 6, 4
_IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
MAMBA = dict(
    model_type="mamba", vocab_size=96, hidden_size=32, state_size=8, num_hidden_layers=2, **_IDS
)
# B, C and dt RMS-normed (weightless) before the scan
FALCON_MAMBA = dict(MAMBA, model_type="falcon_mamba")
# a scan a head (two heads), the heads' states stacked in one cache tensor; two hybrid layers
# (the shared attention block that transformers ties needs two)
ZAMBA = dict(
    model_type="zamba",
    vocab_size=96,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    attention_head_dim=16,
    mamba_d_state=8,
    layers_block_type=["linear_attention", "hybrid"] * 2,
    max_position_embeddings=512,
    **_IDS,
)
MODELS = {"mamba": MAMBA, "falcon_mamba": FALCON_MAMBA, "zamba": ZAMBA}


def _inputs(t: int, seed: int = 0) -> list[np.ndarray]:
    """u, dt, A, B, C, D, z, dt_bias, channels first as transformers passes them."""
    rng = np.random.default_rng(seed)
    f = np.float32
    return [
        rng.standard_normal((2, D, t)).astype(f),
        rng.standard_normal((2, D, t)).astype(f),
        -np.exp(rng.standard_normal((D, N))).astype(f),
        rng.standard_normal((2, N, t)).astype(f),
        rng.standard_normal((2, N, t)).astype(f),
        rng.standard_normal(D).astype(f),
        rng.standard_normal((2, D, t)).astype(f),
        rng.standard_normal(D).astype(f),
    ]


def _theirs_scan(xs: list[np.ndarray]):
    import torch
    from transformers.models.mamba import modeling_mamba as mm

    u, dt, a, b_, c_, d, z, bias = map(torch.as_tensor, xs)
    return mm.mamba_selective_scan(
        u, dt, a, b_, c_, D=d, z=z, delta_bias=bias, delta_softplus=True, return_last_state=True
    )


@pytest.mark.parametrize("t", [1, 7])
def test_the_scan_equals_transformers(t):
    xs = _inputs(t)
    y, state = OPS["selective_scan"].impl(xs, {})
    ty, tstate = _theirs_scan(xs)
    np.testing.assert_allclose(y, ty.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(state, tstate.numpy(), atol=1e-5, rtol=0)


def test_the_step_from_a_state_equals_transformers():
    import torch
    from transformers.models.mamba import modeling_mamba as mm

    xs = _inputs(1, seed=1)
    state0 = np.random.default_rng(2).standard_normal((2, D, N)).astype(np.float32)
    y, new = OPS["selective_state_update"].impl([*xs, state0], {})
    u, dt, a, b_, c_, d, z, bias = map(torch.from_numpy, xs)
    state = torch.from_numpy(state0.copy())
    ty = mm.mamba_selective_state_update(
        state, u[..., 0], dt[..., 0], a, b_[..., 0], c_[..., 0], d,
        z=z[..., 0], dt_bias=bias, dt_softplus=True,
    )  # fmt: skip
    np.testing.assert_allclose(y[..., 0], ty.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(new, state.numpy(), atol=1e-5, rtol=0)  # updated in place there
    # several tokens start from zeros, as transformers' selective_scan_fn does after a past
    xs = _inputs(3, seed=1)
    for a_, b in zip(OPS["selective_state_update"].impl([*xs, state0], {}), _theirs_scan(xs)):
        np.testing.assert_allclose(a_, b.numpy(), atol=1e-5, rtol=0)


def _scan_graph(t: int, p: int) -> Graph:
    g = Graph("mamba1", {"B": 2, "T": t, "P": p, "S": p + t})
    d, n = Dim("d", "hidden", D), Dim("n", "hidden", N)

    def inp(name: str, *dims: Dim) -> Ref:
        return g.input(name, TensorType(dims, "fp32"))

    ins = [inp("u", B, d, T), inp("dt", B, d, T), inp("A", d, n), inp("B", B, n, T)]
    ins += [inp("C", B, n, T), inp("D", d), inp("z", B, d, T), inp("dt_bias", d)]
    op = "selective_state_update" if p else "selective_scan"
    if p:
        ins.append(inp("past_key_values.0.recurrent_state", B, d, n))
    node = g.add(op, "scan", tuple(ins), {"axes": {"t": T}})
    g.set_output("logits", node)
    g.set_output("present.0.recurrent_state", Ref(node.name, 1), STATE)
    return g


def test_the_scan_mixes_its_prefix_and_the_state_stands_for_the_past():
    assert_prefix_mixing(_scan_graph, "scan")


@pytest.mark.parametrize(("t", "p"), [(7, 0), (1, 4)])
def test_its_flops_and_bytes_are_the_kernels(t, p):
    """The matmul part is FlopCounterMode's count of transformers' fallback (the state read by
    C a token); the rest 6n + 10 a token and channel; the state read and written once."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    g = _scan_graph(t, p)
    matmul, other = node_flops(g, g["scan"])
    with torch.device("meta"), FlopCounterMode(display=False) as fc:
        _theirs_scan([torch.empty(x.shape) for x in _inputs(t)])
    assert matmul == fc.get_total_flops() == 2 * 2 * t * D * N
    assert other == 2 * t * D * (6 * N + 10)
    assert (matmul, other) == selective_flops({"b": 2, "t": t, "d": D, "n": N}, {})
    run(g, ["cost"])
    cost = g["scan"].meta["cost"]
    tokens = 4 * 2 * t * (4 * D + 2 * N)  # u, dt, z, B, C in; y out: fp32
    state = 4 * 2 * D * N
    assert cost.bytes_read == tokens - 4 * 2 * t * D + 4 * (D * N + 2 * D) + (state if p else 0)
    assert cost.bytes_written == 4 * 2 * t * D + state


@pytest.mark.parametrize(("past", "new"), [(0, 5), (P, 5), (P, 1)])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_traced_mamba1_equals_transformers(kind, past, new):
    """Parameters, matmul FLOPs (FlopCounterMode), logits; one new token after a past steps
    from the carried state (selective_state_update), several start from zeros as transformers'
    selective_scan_fn does."""
    c = check_traced(MODELS[kind], past, new)
    assert_recurrent_equal(c, new)
    g, tokens = c.graph, c.results["tokens"].to_dict()
    rule = "selective_state_update" if past and new == 1 else "selective_scan"
    scans = [n for n in g.nodes() if n.op.startswith("selective_")]
    assert scans and {n.op for n in scans} == {rule}
    assert rule in tokens["mixing_ops"] and "causal_conv1d_bias" in tokens["mixing_ops"]
    states = [k for k in g.outputs if k.endswith("recurrent_state")]
    assert states and all(g.output_role(k) == "state" for k in states)
    # the cache as transformers holds it: each layer's conv inputs and SSM state
    held = sum(g.type_of(g.outputs[k]).numel(g.bindings) * 4 for k in g.outputs if "present" in k)
    assert c.results["memory"].state + c.results["memory"].kv_cache == held


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("new", [1, 5])
def test_traced_mamba1_export_equals_transformers(kind, new, tmp_path):
    """One export (made at one token after a past) on onnxruntime: `new` tokens after 4 cached
    ones, and all of them from an empty cache, against transformers' forward of the whole
    sequence. Several new tokens after a past are transformers' own cached step instead, which
    starts the scan from zeros: the coverage sweep checks that one."""
    decode, prefill = onnx_against_transformers(MODELS[kind], tmp_path, new)
    assert prefill < 1e-4, prefill
    if new == 1:
        assert decode < 1e-4, decode


# state-spaces/mamba-2.8b-hf's config.json, its fields that shape the model (the file as a public
# copy holds it: github.com/confucianfighter/mamba-2.8b-hf-breakdown,
# mamba_ssm/modules/mamba_2.8b.json, "transformers_version": "4.39.0.dev0")
MAMBA_2_8B = dict(
    model_type="mamba",
    hidden_size=2560,
    intermediate_size=5120,
    num_hidden_layers=64,
    state_size=16,
    conv_kernel=4,
    expand=2,
    time_step_rank=160,
    vocab_size=50280,
    use_bias=False,
    use_conv_bias=True,
    layer_norm_epsilon=1e-05,
    hidden_act="silu",
    pad_token_id=0,
    bos_token_id=0,
    eos_token_id=0,
)


def test_mamba_2_8b_parameters_equal_the_published_count():
    """Traced at full size on the meta device: 2,768,345,600 parameters, the count mamba_ssm
    prints for state-spaces/mamba-2.8b ("Number of parameters: 2768345600", AMD's ROCm blog on
    Mamba: github.com/ROCm/rocm-blogs, blogs/artificial-intelligence/mamba/README.md); the -hf
    checkpoint holds the same tensors, its LM head tied to the embedding."""
    g = traced_graph(MAMBA_2_8B, Workload(seq_len=8))  # bf16, the residual in fp32
    res = run(g, ["params", "memory"])
    assert res["params"].total == 2_768_345_600
    # a layer's cache: its conv's last 4 inputs (bf16) and its fp32 state, 5120 channels each
    assert res["memory"].state == 64 * 5120 * (4 * 2 + 16 * 4)


def test_a_layer_that_takes_other_dtypes_is_a_kind_of_its_own():
    """Mamba keeps its residual in fp32: layer 0 reads the embedding's bf16, every later layer
    the fp32 sum, which its code casts back to bf16 before the norm. Layer 1 cannot replay
    layer 0's recording (it has no cast): it is recorded itself, and the later ones replay it."""
    g = traced_graph(dict(MAMBA, num_hidden_layers=3), Workload(seq_len=8))
    norms = [g.type_of(n.inputs[0]).dtype for n in g.nodes() if n.op == "rmsnorm"]
    assert norms == ["bf16"] * 3 + ["fp32"]  # norm_f reads the residual itself
    assert g.meta["layer_kinds"] == {"backbone.layers.2": "backbone.layers.1"}


@pytest.mark.parametrize("view", ["model", "block"])
def test_diagrams_draw_a_mamba1_mixer_by_its_channels(tmp_path, view):
    """The block of a traced Mamba says what it is: a Mamba mixer (not Mamba2) of its channels
    and conv taps (the scan's output has no heads to name)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MAMBA))
    out = tmp_path / f"{view}.dot"
    r = CliRunner().invoke(main, ["render", "--config", str(path), "--view", view, "-o", str(out)])
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "Mamba\\n" in text and "Mamba2" not in text
    assert "64 channels, conv 4" in text and "ffn" not in text
