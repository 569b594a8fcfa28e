"""Op rows of the Mamba2 mixer (Nemotron-H): the selective state-space scan in its two
forms, the gated RMSNorm over groups, relu^2, and the head views of the mixer's channels.

The scan follows transformers' nemotron_h torch path (`mamba2_chunk_scan`,
`mamba2_selective_state_update`), which is also mamba_ssm's kernel contract:

  dt = softplus(dt_raw + dt_bias)                     per (b, t, h)
  A  = -exp(A_log)                                     per head
  state_t = exp(dt_t A) state_{t-1} + dt_t x_t B_t^T   (b, h, p, n); B, C shared by the heads
  y_t = state_t C_t + D x_t                            of each of g groups

Prefill (and any call of more than one token, or without a past) runs the chunked SSD form:
dt clamped below at `dt_min` (the mixer's time_step_limit), T padded up to a multiple of the
chunk L, the intra-chunk (diagonal) blocks as a masked C B^T "attention" over each chunk, the
chunk states, the inter-chunk recurrence as one matrix of chunk-to-chunk decays, and the states'
contribution to each position. A one-token call after a past runs the recurrent step, which
does not clamp dt (transformers' selective_state_update is called without dt_limit).

FLOPs (`flops_attrs_fn`, the node's `form`; c = ceil(T / L) chunks, T_p = c L):
- chunked, matmul part (the five einsums of mamba2_chunk_scan, 2 per multiply-add, as torch's
  FlopCounterMode counts them): 2 b c L^2 h n (C B^T) + 2 b c L^2 h p (the diagonal blocks'
  values) + 2 b c L h p n (chunk states) + 2 b (c+1)^2 h p n (chunk-to-chunk decay) +
  2 b c L h n p (state to output);
- chunked, the rest: 4 b T h (dt: bias, softplus as exp and log1p, clamp) + b T_p h p (x dt) +
  2 b T_p h (A dt, its cumsum) + 3 b h c L^2 (the segment sums: cumsum, exp, the mask product
  G L) + 3 b T_p h (decay to the chunk end: subtract, exp; the decay out: exp) + b T_p h n
  (B times its decay) + 2 b h (c+1)^2 (the chunk decays' segment sum and exp) + 2 b T_p h p
  (Y_off's scale, Y_diag + Y_off) + 2 b T_p h p (the D skip);
- recurrent, matmul part: 2 b h p n (the state times C, a bmm);
- recurrent, the rest: 3 b h (dt) + 2 b h p n (exp(dt A)) + 3 b h p n (dt B x, the decay's
  product, the sum) + 2 b h p (the D skip).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphllm.ir import Dim, Node
from graphllm.ir.opspec import CONTRACTION, ELEMENTWISE, MOVEMENT, REDUCTION, OpSpec, register
from graphllm.ops.common import f32
from graphllm.ops.recurrent import prefix

FORMS = ("chunked", "recurrent")
# inputs on s, outputs on t (the new tokens: attrs axes t), so that the tokens pass reads the
# prefix relation: x, dt, A_log, B, C, D, dt_bias [, the carried state] -> y, the final state
SCAN_SIG = "b s h p, b s h, h, b s g n, b s g n, h, h -> b t h p, b h p n"
SCAN_STATE_SIG = "b s h p, b s h, h, b s g n, b s g n, h, h, b h p n -> b t h p, b h p n"


def _softplus(x: np.ndarray) -> np.ndarray:
    # torch's softplus: x itself above threshold 20, log1p(exp(x)) below
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20)))).astype(np.float32)


def _segsum(x: np.ndarray) -> np.ndarray:
    """transformers' segment_sum: (..., L) -> (..., L, L), out[i, j] = sum x[j+1..i] for
    j <= i, -inf above the diagonal."""
    n = x.shape[-1]
    xx = np.broadcast_to(x[..., None], (*x.shape, n)).copy()  # xx[..., i, j] = x[..., i]
    xx = np.where(np.tril(np.ones((n, n), bool), -1), xx, 0)
    cs = np.cumsum(xx, axis=-2)
    return np.where(np.tril(np.ones((n, n), bool), 0), cs, -np.inf).astype(np.float32)


def rate(a_in: np.ndarray, attrs: dict[str, Any]) -> np.ndarray:
    """A per head: -exp(A_log), or the input itself where attrs a_is_rate says the model
    computed A before the scan (a traced model hands its scan A)."""
    a_in = a_in.astype(np.float32)
    return a_in if attrs.get("a_is_rate") else -np.exp(a_in)


def _chunked(x, dt, a, b_, c_, d, dt_bias, state0, chunk: int, dt_min: float):
    """mamba2_chunk_scan in numpy: x (b, t, h, p), dt (b, t, h), A (h), B and C (b, t, g, n),
    state0 (b, h, p, n) or None -> y (b, t, h, p), the final state (b, h, p, n)."""
    bsz, t, h, p = x.shape
    g = b_.shape[2]
    dt = np.maximum(_softplus(dt + dt_bias), np.float32(dt_min))
    rep = h // g
    bb, cc = np.repeat(b_, rep, axis=2), np.repeat(c_, rep, axis=2)  # (b, t, h, n)
    pad = (chunk - t % chunk) % chunk

    def padded(z: np.ndarray) -> np.ndarray:
        return np.concatenate([z, np.zeros((bsz, pad, *z.shape[2:]), np.float32)], axis=1)

    d_res = d[:, None] * padded(x)
    xs = padded(x * dt[..., None])
    av = padded(a * dt)
    nc = (t + pad) // chunk

    def chunks(z: np.ndarray) -> np.ndarray:
        return z.reshape(bsz, nc, chunk, *z.shape[2:])

    xs, bb, cc = chunks(xs), chunks(padded(bb)), chunks(padded(cc))  # (b, c, l, h, .)
    av = chunks(av).transpose(0, 3, 1, 2)  # (b, h, c, l)
    a_cum = np.cumsum(av, axis=-1)
    lmat = np.exp(_segsum(av))  # (b, h, c, l, s)
    gmat = np.einsum("bclhn,bcshn->bclsh", cc, bb)
    m = gmat * lmat.transpose(0, 2, 3, 4, 1)
    y_diag = np.einsum("bclsh,bcshp->bclhp", m, xs)
    decay = np.exp(a_cum[..., -1:] - a_cum)  # (b, h, c, l)
    b_decay = bb * decay.transpose(0, 2, 3, 1)[..., None]
    states = np.einsum("bclhn,bclhp->bchpn", b_decay, xs)
    prev = np.zeros_like(states[:, :1]) if state0 is None else state0[:, None]
    states = np.concatenate([prev, states], axis=1)
    last = np.concatenate([np.zeros_like(a_cum[..., :1, -1]), a_cum[..., -1]], axis=-1)
    decay_chunk = np.exp(_segsum(last)).transpose(0, 3, 2, 1)  # (b, z, c, h)
    new = np.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final = new[:, :-1], new[:, -1]
    c_states = np.einsum("bclhn,bchpn->bclhp", cc, states)
    y_off = c_states * np.exp(a_cum).transpose(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).reshape(bsz, -1, h, p) + d_res
    return y[:, :t].astype(np.float32), final.astype(np.float32)


def _step(x, dt, a, b_, c_, d, dt_bias, state):
    """mamba2_selective_state_update for one token: x (b, 1, h, p) -> y, the new state."""
    h = x.shape[2]
    xt, dtt = x[:, 0], _softplus(dt[:, 0] + dt_bias)  # (b, h, p), (b, h)
    rep = h // b_.shape[2]
    bt, ct = np.repeat(b_[:, 0], rep, axis=1), np.repeat(c_[:, 0], rep, axis=1)  # (b, h, n)
    da = np.exp(dtt * a)[..., None, None]
    new = state * da + (dtt[..., None, None] * bt[:, :, None, :]) * xt[..., None]
    y = np.einsum("bhpn,bhn->bhp", new, ct) + xt * d[:, None]
    return y[:, None].astype(np.float32), new.astype(np.float32)


def _scan(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x, dt, a_in, b_, c_, d, dt_bias = (f32(v) for v in xs[:7])
    state0 = f32(xs[7]) if len(xs) > 7 else None
    # transformers' dispatch: the recurrent step for one token after a past, else the chunks
    if state0 is not None and x.shape[1] == 1:
        return _step(x, dt, rate(a_in, a), b_, c_, d, dt_bias, state0)
    return _chunked(x, dt, rate(a_in, a), b_, c_, d, dt_bias, state0, a["chunk_size"], a["dt_min"])


def scan_flops(s: dict[str, float], a: dict[str, Any]) -> tuple[float, float]:
    """(matmul, other) FLOPs of one scan node in the form its attrs name (module docstring)."""
    b, t, h, p, n = s["b"], s.get("s", s.get("t")), s["h"], s["p"], s["n"]
    if a["form"] == "recurrent":
        return 2 * b * h * p * n, 3 * b * h + 7 * b * h * p * n + 2 * b * h * p
    ell = a["chunk_size"]
    c = math.ceil(t / ell)
    tp = c * ell
    mm = (
        2 * b * c * ell * ell * h * n
        + 2 * b * c * ell * ell * h * p
        + 2 * b * c * ell * h * p * n
        + 2 * b * (c + 1) ** 2 * h * p * n
        + 2 * b * c * ell * h * n * p
    )
    other = (
        4 * b * t * h
        + b * tp * h * p
        + 2 * b * tp * h
        + 3 * b * h * c * ell * ell
        + 3 * b * tp * h
        + b * tp * h * n
        + 2 * b * h * (c + 1) ** 2
        + 4 * b * tp * h * p
    )
    return mm, other


def _scan_check(node: Node, env: dict[str, Dim]) -> str | None:
    if node.attrs.get("form") not in FORMS:
        return f"attrs form must be one of {', '.join(FORMS)}"
    if env["h"].size % env["g"].size:  # type: ignore[operator]
        return f"{env['h'].size} heads are not a multiple of the {env['g'].size} groups"
    return None


def _gated_rmsnorm(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    y, z, w = f32(xs[0]), f32(xs[1]), f32(xs[2])
    h = y * (z / (1 + np.exp(-z)))  # x * silu(z), then normed per group: Mamba2's order
    gs = a["group_size"]
    hg = h.reshape(*h.shape[:-1], -1, gs)
    var = np.mean(hg * hg, axis=-1, keepdims=True)
    return (hg / np.sqrt(var + np.float32(a["eps"]))).reshape(h.shape) * w


def _gated_check(node: Node, env: dict[str, Dim]) -> str | None:
    gs = node.attrs.get("group_size")
    if not isinstance(gs, int) or gs < 1 or env["f"].size % gs:  # type: ignore[operator]
        return f"group_size {gs} does not divide the {env['f'].size} channels"
    return None


def state_scan_row(
    name: str,
    sig: str,
    doc: str,
    reference: Any,
    flops: Any,
    **fields: Any,
) -> OpSpec:
    """A selective scan row (Mamba-1's or Mamba2's): output t reads every input s <= t
    (prefix); it returns y and its fp32 state; nothing in it is linear, so a partial sum cannot
    pass through it. `flops(sizes, attrs)`: its (matmul, other) FLOPs."""
    return OpSpec(
        name,
        sig,
        CONTRACTION,
        reference,
        doc,
        relation=prefix,
        matmul_flops_fn=lambda s, a: flops(s, a)[0],
        flops_attrs_fn=lambda s, a: flops(s, a)[1],
        out_dtypes=("same", "fp32"),
        linear=(),
        backward_reads="inputs",
        **fields,
    )


def _scan_row(name: str, sig: str, doc: str, **fields: Any) -> OpSpec:
    """A Mamba2 scan row: what the scan from a zero state and from a carried one share (its
    state splits with its heads: h carries g)."""
    return state_scan_row(
        name, sig, doc, _scan, scan_flops, check=_scan_check, carries=(("h", "g"),), **fields
    )


register(
    OpSpec(
        "relu2",
        "... -> ...",
        ELEMENTWISE,
        lambda xs, a: np.square(np.maximum(f32(xs[0]), 0)),
        "relu(x)^2 (Nemotron's relu2). 2 FLOPs/element: the max, the square.",
        flops_per_elem=2,
        backward_reads="inputs",
    ),
    _scan_row(
        "ssm_scan",
        SCAN_SIG,
        "Mamba2's selective scan from a zero state (inputs x, dt, A_log, B, C, D, dt_bias; A "
        "itself where attrs a_is_rate): y and the final state (module docstring: the chunked and recurrent forms, FLOPs). "
        "Output t reads every input s <= t: the prefix relation.",
    ),
    _scan_row(
        "ssm_scan_past",
        SCAN_STATE_SIG,
        "ssm_scan from the layer's carried state (input 7): the recurrent step for one token, "
        "the chunked form for several.",
        state_inputs=(7,),
    ),
    OpSpec(
        "gated_group_rmsnorm",
        "b t f, b t f, f -> b t f",
        REDUCTION,
        _gated_rmsnorm,
        "Mamba2's MambaRMSNormGated: h = y * silu(z), each group of group_size channels "
        "normalised, times the weight (the gate before the norm, where gated_rmsnorm, "
        "Qwen3-Next's, norms first). "
        "9 FLOPs/element: silu 4, the gate product, then an RMSNorm's 4.",
        flops_per_elem=9,
        check=_gated_check,
        backward_reads="inputs",
    ),
)


# -- the fused in_proj's weight rows regrouped per group of heads (head-parallel TP) --------------
register(
    OpSpec(
        "weight_rows",
        "f ... -> c ...",
        MOVEMENT,
        lambda xs, a: xs[0][np.asarray(a["index"])],
        "A weight's rows attrs['index'] names, in that order (Mamba2's in_proj laid out per group "
        "of heads, z | x | B | C | dt of each of attrs['groups'], so that a block of groups is a "
        "block of rows a TP rank holds; its bias and the conv's weight and bias likewise). A "
        "view: an engine permutes the rows once at load, and a read of it is a read of the "
        "weight.",
        view=True,
    ),
)
