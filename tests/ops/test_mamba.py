"""issue 19: the Mamba2 rows' numpy references against transformers' nemotron_h torch path
(mamba2_chunk_scan, mamba2_selective_state_update, NemotronHRMSNormGated) on tiny inputs, and
the chunked form's einsum FLOPs against FlopCounterMode."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from transformers.models.nemotron_h import modeling_nemotron_h as nh

from graphllm.ops import OPS
from graphllm.ops.mamba import scan_flops

B, H, P, G, N, CHUNK = 2, 4, 3, 2, 5, 4


def _inputs(t: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    f = np.float32
    return [
        rng.standard_normal((B, t, H, P)).astype(f),  # x
        rng.standard_normal((B, t, H)).astype(f),  # dt before its bias and softplus
        rng.standard_normal(H).astype(f),  # A_log
        rng.standard_normal((B, t, G, N)).astype(f),  # B
        rng.standard_normal((B, t, G, N)).astype(f),  # C
        rng.standard_normal(H).astype(f),  # D
        # some heads' dt near time_step_min, so that the chunked form's clamp bites
        np.array([-7.5, -6.0, -2.0, 0.5], f),  # dt_bias
    ]


def _theirs_chunked(xs, state0, t_min=0.001):
    x, dt, a_log, b_, c_, d, dt_bias = map(torch.from_numpy, xs)
    return nh.mamba2_chunk_scan(
        x, dt, -torch.exp(a_log), b_, c_, CHUNK, D=d, dt_bias=dt_bias, dt_softplus=True,
        initial_states=None if state0 is None else torch.from_numpy(state0),
        dt_limit=(t_min, float("inf")), return_final_states=True,
    )  # fmt: skip


# one token after a past runs the recurrent step instead (the test below)
@pytest.mark.parametrize(
    ("t", "past"), [(1, False), (3, False), (4, False), (11, False), (3, True), (11, True)]
)
def test_chunked_form_equals_transformers(t, past):
    xs = _inputs(t)
    state0 = np.random.default_rng(1).standard_normal((B, H, P, N)).astype(np.float32)
    attrs = {"chunk_size": CHUNK, "dt_min": 0.001, "form": "chunked"}
    y, final = OPS["ssm_scan_past" if past else "ssm_scan"].impl(
        xs + ([state0] if past else []), attrs
    )
    ty, tfinal = _theirs_chunked(xs, state0 if past else None)
    np.testing.assert_allclose(y, ty.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(final, tfinal.numpy(), atol=1e-5, rtol=0)


def test_the_clamp_matters():
    xs = _inputs(11)
    attrs = {"chunk_size": CHUNK, "dt_min": 0.001, "form": "chunked"}
    y, _ = OPS["ssm_scan"].impl(xs, attrs)
    y0, _ = OPS["ssm_scan"].impl(xs, attrs | {"dt_min": 0.0})
    assert not np.allclose(y, y0, atol=1e-4)
    ty, _ = _theirs_chunked(xs, None, t_min=0.0)
    np.testing.assert_allclose(y0, ty.numpy(), atol=1e-5, rtol=0)


def test_recurrent_step_equals_transformers():
    xs = _inputs(1)
    state0 = np.random.default_rng(2).standard_normal((B, H, P, N)).astype(np.float32)
    attrs = {"chunk_size": CHUNK, "dt_min": 0.001, "form": "recurrent"}
    y, new = OPS["ssm_scan_past"].impl([*xs, state0], attrs)
    x, dt, a_log, b_, c_, d, dt_bias = map(torch.from_numpy, xs)
    state = torch.from_numpy(state0.copy())
    ty = nh.mamba2_selective_state_update(
        state, x[:, 0], dt[:, 0, :, None].expand(-1, -1, P),
        (-torch.exp(a_log))[:, None, None].expand(-1, P, N), b_[:, 0], c_[:, 0],
        d[:, None].expand(-1, P), z=None, dt_bias=dt_bias[:, None].expand(-1, P),
        dt_softplus=True,
    )  # fmt: skip
    np.testing.assert_allclose(y[:, 0], ty.numpy(), atol=1e-5, rtol=0)
    np.testing.assert_allclose(new, state.numpy(), atol=1e-5, rtol=0)


def test_gated_rmsnorm_equals_transformers():
    rng = np.random.default_rng(3)
    y, z = (rng.standard_normal((B, 5, 12)).astype(np.float32) for _ in range(2))
    w = rng.standard_normal(12).astype(np.float32)
    norm = nh.NemotronHRMSNormGated(12, group_size=4, eps=1e-5)
    norm.weight.data = torch.from_numpy(w)
    with torch.no_grad():
        theirs = norm(torch.from_numpy(y), torch.from_numpy(z)).numpy()
    ours = OPS["gated_group_rmsnorm"].impl([y, z, w], {"group_size": 4, "eps": 1e-5})
    np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize("t", [8, 12])
def test_chunked_matmul_flops_equal_flop_counter(t):
    """The five einsums of mamba2_chunk_scan, counted by FlopCounterMode on the meta device, at
    T a multiple of the chunk (transformers pads T up to one) and not."""
    shapes = [(B, t, H, P), (B, t, H), (H,), (B, t, G, N), (B, t, G, N), (H,), (H,)]
    x, dt, a_log, b_, c_, d, dt_bias = (torch.empty(s, device="meta") for s in shapes)
    with FlopCounterMode(display=False) as fc:
        nh.mamba2_chunk_scan(
            x, dt, -torch.exp(a_log), b_, c_, CHUNK, D=d, dt_bias=dt_bias, dt_softplus=True,
            dt_limit=(0.001, float("inf")), return_final_states=True,
        )  # fmt: skip
    sizes = {"b": B, "t": t, "h": H, "p": P, "n": N, "g": G}
    mm, _ = scan_flops(sizes, {"form": "chunked", "chunk_size": CHUNK})
    assert mm == fc.get_total_flops()


def test_recurrent_matmul_flops_equal_flop_counter():
    st = torch.empty((B, H, P, N), device="meta")
    x, d = torch.empty((B, H, P), device="meta"), torch.empty((H, P), device="meta")
    dt = torch.empty((B, H, P), device="meta")
    a = torch.empty((H, P, N), device="meta")
    bc = torch.empty((B, G, N), device="meta")
    with FlopCounterMode(display=False) as fc:
        nh.mamba2_selective_state_update(st, x, dt, a, bc, bc, d, dt_bias=d, dt_softplus=True)
    sizes = {"b": B, "t": 1, "h": H, "p": P, "n": N, "g": G}
    mm, _ = scan_flops(sizes, {"form": "recurrent", "chunk_size": CHUNK})
    assert mm == fc.get_total_flops()
