"""Op rows of the Mamba-1 mixer (Mamba, Falcon-Mamba, Jamba, Zamba): the selective scan from
a zero state and its one-token step from a carried state.

The rows follow mamba_ssm's kernel contract, channels first as transformers passes them
(`selective_scan_fn`, `selective_state_update`), with transformers' torch fallbacks
(`mamba_selective_scan`, `mamba_selective_state_update`) as the reference:

  dt = softplus(dt_raw + dt_bias)                      per (b, d, t)
  state_t = exp(dt_t A) state_{t-1} + dt_t B_t u_t     (b, d, n); B, C shared by the channels
  y_t = (state_t C_t + D u_t) silu(z_t)                (b, d)

A is the model's -exp(A_log), computed before the scan. `selective_scan_fn` takes no initial
state: transformers runs it for any call of several tokens, after a past too, where the scan
starts from zeros (its own TODO says so); only one new token after a past steps from the
carried state. `selective_state_update` keeps that dispatch when a graph made at one token runs
at more (an export serves both): several tokens start from zeros.

FLOPs per token and channel (`selective_flops`; n the state size): the matmul part is the state
read by C, 2n (the fallback's bmm, as FlopCounterMode counts it); the rest is dt's bias and
softplus (3), exp(dt A), dt B, its product with u, the decay's product and the sum (6n), the D
skip (2) and the gate silu(z) and its product (5). The state is read and written once, not once
a token: the row's bytes are its inputs and outputs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir.opspec import OpSpec, register
from graphllm.ops.common import f32
from graphllm.ops.mamba import state_scan_row

# inputs on s, outputs on t (attrs axes t), so that the tokens pass reads the prefix relation:
# u, dt, A, B, C, D, z, dt_bias [, the carried state] -> y, the final state
SCAN1_SIG = "b d s, b d s, d n, b n s, b n s, d, b d s, d -> b d t, b d n"
SCAN1_STATE_SIG = "b d s, b d s, d n, b n s, b n s, d, b d s, d, b d n -> b d t, b d n"


def _softplus(x: np.ndarray) -> np.ndarray:
    # torch's softplus: x itself above threshold 20, log1p(exp(x)) below
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def _scan(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    u, dt, rate, b_, c_, d, z, dt_bias = (f32(v) for v in xs[:8])
    bsz, ch, t = u.shape
    state = np.zeros((bsz, ch, rate.shape[-1]), np.float32)
    if len(xs) > 8 and t == 1:  # transformers' dispatch: the step only for one token
        state = f32(xs[8])
    dt = _softplus(dt + dt_bias[:, None])  # (b, d, t)
    y = np.empty_like(u)
    for i in range(t):
        step = dt[:, :, i, None]  # (b, d, 1)
        state = np.exp(step * rate) * state + (step * b_[:, None, :, i]) * u[:, :, i, None]
        y[:, :, i] = np.einsum("bdn,bn->bd", state, c_[:, :, i])
    y = (y + u * d[:, None]) * (z / (1 + np.exp(-z)))
    return y.astype(np.float32), state.astype(np.float32)


def selective_flops(s: dict[str, float], a: dict[str, Any]) -> tuple[float, float]:
    """(matmul, other) FLOPs of one Mamba-1 scan node (module docstring)."""
    tokens = s["b"] * s["t"] * s["d"]
    return 2 * tokens * s["n"], tokens * (6 * s["n"] + 10)


def _row(name: str, sig: str, doc: str, **fields: Any) -> OpSpec:
    """A Mamba-1 scan row (its fp32 state splits with its channels)."""
    return state_scan_row(name, sig, doc, _scan, selective_flops, **fields)


register(
    _row(
        "selective_scan",
        SCAN1_SIG,
        "Mamba-1's selective scan from a zero state (mamba_ssm's selective_scan_fn: u, dt "
        "before its bias and softplus, A, B, C, D, the gate z, dt_bias; channels first): y "
        "and the final state (b, d, n). 2n + 6n + 10 FLOPs per token and channel, 2n of them "
        "the state read by C (module docstring).",
    ),
    _row(
        "selective_state_update",
        SCAN1_STATE_SIG,
        "selective_scan's step for one new token from the layer's carried state (input 8; "
        "mamba_ssm's selective_state_update). Run at several tokens (an export made at one) it "
        "starts from zeros, as transformers' selective_scan_fn does after a past.",
        state_inputs=(8,),
    ),
)
