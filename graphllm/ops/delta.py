"""Op rows of Qwen3-Next's Gated DeltaNet: the gated delta rule in its two forms, its
decay, the L2 norm of q and k, the gated RMSNorm, and the channel views of its fused projections.

The delta rule, per value head h, with a state S (k x v) carried from step to step:
  S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T,   o_t = S_t^T q_t / sqrt(d_k)
(q and k of a key head serve h/g consecutive value heads). `gated_delta_chunked` computes it as
transformers' torch_chunk_gated_delta_rule does for a prefill (chunks of `chunk` positions: the
UT transform by a unit-lower-triangular solve inside each chunk, then a scan over chunks), and
`gated_delta_step` as torch_recurrent_gated_delta_rule does for a decode step (token by token).
The `kda_*` rows are the same three forms with a decay per key channel (Kimi Delta Attention:
g_t a vector of d_k, exp(g_t) scaling each row of S), as transformers' chunk_kimi_delta_attention
and recurrent_kimi_delta_attention compute it; one reference serves both decays.
Both output position t reads every input position s <= t, and the carried state every earlier
one: the `prefix` relation with the state as a `state_inputs` input.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphllm.ir import Dim, Node
from graphllm.ir.opspec import CONTRACTION, ELEMENTWISE, MOVEMENT, REDUCTION, OpSpec, register
from graphllm.ops.common import f32
from graphllm.ops.recurrent import prefix

DELTA_SIG = "b s g k, b s g k, b s h v, b s h, b s h -> b t h v, b h k v"
DELTA_STATE_SIG = "b s g k, b s g k, b s h v, b s h, b s h, b h k v -> b t h v, b h k v"
# KDA (Kimi Delta Attention): the same rule with a decay per key channel, g (B, T, H, d_k)
KDA_SIG = "b s g k, b s g k, b s h v, b s h k, b s h -> b t h v, b h k v"
KDA_STATE_SIG = "b s g k, b s g k, b s h v, b s h k, b s h, b h k v -> b t h v, b h k v"


def _heads_first(xs: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """q, k (repeated to the value heads, as repeat_interleave does), v, g, beta as (B, H, T, ...),
    q scaled by 1/sqrt(d_k), g with a channel axis (of size 1 where the decay is a head's, d_k
    where it is a channel's: KDA); the state (B, H, d_k, d_v), zeros without a past."""
    q, k, v, g, beta = (f32(x) for x in xs[:5])
    b, _, n_k, d_k = k.shape
    n_v, d_v = v.shape[2], v.shape[3]
    q, k = (np.repeat(x, n_v // n_k, axis=2) for x in (q, k))
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    g = g[..., None] if g.ndim == 3 else g
    g, beta = g.transpose(0, 2, 1, 3), beta.transpose(0, 2, 1)
    q = q * np.float32(d_k**-0.5)
    state = f32(xs[5]) if len(xs) > 5 else np.zeros((b, n_v, d_k, d_v), np.float32)
    return q, k, v, g, beta, state


def _step(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    q, k, v, g, beta, state = _heads_first(xs)
    out = np.zeros_like(v)
    for i in range(v.shape[2]):
        state = state * np.exp(g[:, :, i])[..., None]  # a head's decay, or each key channel's
        kv_mem = (state * k[:, :, i, :, None]).sum(-2)  # (B, H, d_v)
        delta = (v[:, :, i] - kv_mem) * beta[:, :, i, None]
        state = state + k[:, :, i, :, None] * delta[:, :, None, :]
        out[:, :, i] = (state * q[:, :, i, :, None]).sum(-2)
    return out.transpose(0, 2, 1, 3), state


def _unit_lower_solve(lower: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """X with (I + strictly_lower(lower)) X = rhs, by forward substitution over the rows (what
    torch.linalg.solve_triangular(unitriangular=True) computes)."""
    x = np.zeros_like(rhs)
    for i in range(rhs.shape[-2]):
        x[..., i, :] = rhs[..., i, :] - (lower[..., i, None, :i] @ x[..., :i, :])[..., 0, :]
    return x


def _decayed_pairs(a: np.ndarray, b: np.ndarray, cum: np.ndarray, diag: bool) -> np.ndarray:
    """sum_e a_ie b_je exp(cum_ie - cum_je) for j < i (j <= i with `diag`), 0 above: (..., C, C).
    A head's decay (a channel axis of 1) factors out of the sum, a channel's (KDA) does not."""
    c = cum.shape[-2]
    keep = np.tril(np.ones((c, c), bool), 0 if diag else -1)
    diff = np.where(keep[..., None], cum[..., :, None, :] - cum[..., None, :, :], -np.inf)
    with np.errstate(over="ignore"):
        pair = np.exp(diff)  # (..., C, C, channels)
    if cum.shape[-1] == 1:
        return (a @ b.swapaxes(-1, -2)) * pair[..., 0]
    return np.einsum("...ie,...je,...ije->...ij", a, b, pair)


def _chunked(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    q, k, v, g, beta, state = _heads_first(xs)
    b, h, t, d_v = v.shape
    c = a["chunk"]
    pad = (c - t % c) % c  # transformers pads T up to a multiple of the chunk
    q, k, v, g = (np.pad(x, ((0, 0), (0, 0), (0, pad), (0, 0))) for x in (q, k, v, g))
    beta = np.pad(beta, ((0, 0), (0, 0), (0, pad)))
    n = (t + pad) // c
    v_beta, k_beta = v * beta[..., None], k * beta[..., None]
    q, k, k_beta, v_beta, g = (x.reshape(b, h, n, c, -1) for x in (q, k, k_beta, v_beta, g))
    cum = g.cumsum(-2)  # (B, H, n, C, channels)
    out = np.zeros((b, h, n, c, d_v), np.float32)
    for i in range(n):
        ci = cum[:, :, i]
        ut = _decayed_pairs(k_beta[:, :, i], k[:, :, i], ci, diag=False)
        intra = _decayed_pairs(q[:, :, i], k[:, :, i], ci, diag=True)
        new_values = _unit_lower_solve(ut, v_beta[:, :, i])
        k_cumdecay = _unit_lower_solve(ut, k_beta[:, :, i] * np.exp(ci))
        v_new = new_values - k_cumdecay @ state
        out[:, :, i] = (q[:, :, i] * np.exp(ci)) @ state + intra @ v_new
        k_rest = k[:, :, i] * np.exp(ci[..., -1:, :] - ci)
        state = state * np.exp(ci[..., -1, :])[..., None] + k_rest.swapaxes(-1, -2) @ v_new
    out = out.reshape(b, h, n * c, d_v)[:, :, :t]
    return out.transpose(0, 2, 1, 3), state


def _padded(s: dict[str, float], a: dict[str, Any]) -> float:
    return math.ceil(s["t"] / a["chunk"]) * a["chunk"]


def chunked_matmul_flops(s: dict[str, float], a: dict[str, Any]) -> float:
    """The chunked form's matrix multiplies, as FlopCounterMode counts transformers' (T padded
    to Tp, a multiple of the chunk C; H value heads): per chunk K_beta K^T and Q K^T (2 C^2 d_k
    each), then in the scan K_cumdecay S and Q S (2 C d_k d_v each), A V_new (2 C^2 d_v) and
    K^T V_new (2 C d_k d_v)."""
    tp, c, dk, dv = _padded(s, a), a["chunk"], s["k"], s["v"]
    return s["b"] * s["h"] * tp * (4 * c * dk + 2 * c * dv + 6 * dk * dv)


def chunked_other_flops(s: dict[str, float], a: dict[str, Any]) -> float:
    """The chunked form's elementwise work, which FlopCounterMode does not count: the two
    unit-triangular solves by forward substitution ((C - 1)(d_k + d_v) per position: i
    multiply-adds per row i and column), beta on K and V (d_k + d_v), the decays (cumsum, the
    pairwise differences, exps and the two products: 4C + 3 per position, d_k for the decayed
    K_beta, 2 d_k for Q and K), the scan's subtraction and sum (2 d_v), and the state's decay
    and update per chunk (2 d_k d_v)."""
    tp, c, dk, dv = _padded(s, a), a["chunk"], s["k"], s["v"]
    per_position = (c - 1) * (dk + dv) + (dk + dv) + (4 * c + 3) + 3 * dk + 2 * dv
    return s["b"] * s["h"] * (tp * per_position + (tp // c) * 2 * dk * dv)


def step_flops(s: dict[str, float], a: dict[str, Any]) -> float:
    """The recurrent form per token and value head: decay the state (d_k d_v), read it with k
    (2 d_k d_v), the delta (2 d_v), write k delta^T (2 d_k d_v), read it with q (2 d_k d_v),
    and exp(g) (1); none of it is a matrix multiply."""
    return s["b"] * s["t"] * s["h"] * (7 * s["k"] * s["v"] + 2 * s["v"] + 1)


def kda_matmul_flops(s: dict[str, float], a: dict[str, Any]) -> float:
    """KDA's chunked form's matrix multiplies, as FlopCounterMode counts transformers'
    chunk_kimi_delta_attention (T padded to Tp; H heads): per chunk the inverted UT matrix
    applied to V_beta and to the decayed K_beta (2 C d_v and 2 C d_k a position), then in the
    scan (Q e^g) S, K_cumdecay S and K^T V_new (2 d_k d_v each) and A V_new (2 C d_v). A
    channel's decay cannot leave the pair products Q K^T and K_beta K^T, so they are
    elementwise there (kda_other_flops)."""
    tp, c, dk, dv = _padded(s, a), a["chunk"], s["k"], s["v"]
    return s["b"] * s["h"] * tp * (2 * c * dk + 4 * c * dv + 6 * dk * dv)


def kda_other_flops(s: dict[str, float], a: dict[str, Any]) -> float:
    """KDA's chunked form's elementwise work, as the fallback does it: a position's pair
    decays against its chunk (a subtraction and an exp per pair and channel, 2 C d_k) and its
    two decayed pair products (K_beta K^T and Q K^T: two multiplies and an add per pair and
    channel, 6 C d_k), beta on K and V (d_k + d_v), the cumsum of g (d_k), e^g on K_beta and
    on Q (4 d_k), K's decay to the chunk's end (3 d_k), the scan's subtraction and sum
    (2 d_v); per chunk the UT matrix's inversion by row updates (sum over rows i < C of 2 i^2)
    and the state's decay and update (2 d_k d_v, d_k for e^g at the end)."""
    tp, c, dk, dv = _padded(s, a), a["chunk"], s["k"], s["v"]
    per_position = 8 * c * dk + 8 * dk + 3 * dv
    per_chunk = (c - 1) * c * (2 * c - 1) / 3 + 2 * dk * dv + dk
    return s["b"] * s["h"] * (tp * per_position + (tp // c) * per_chunk)


def kda_step_flops(s: dict[str, float], a: dict[str, Any]) -> float:
    """KDA's recurrent form per token and head: the gated delta rule's step (step_flops) with
    exp(g) per key channel (d_k) in place of one per head."""
    return s["b"] * s["t"] * s["h"] * (7 * s["k"] * s["v"] + 2 * s["v"] + s["k"])


def _delta_check(node: Node, env: dict[str, Dim]) -> str | None:
    g, h = env["g"].size, env["h"].size
    if not (g and h and h % g == 0):
        return f"{h} value heads are not a multiple of {g} key heads"
    return None


def _l2normalize(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = f32(xs[0])
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + np.float32(a["eps"]))


def _softplus(x: np.ndarray) -> np.ndarray:
    """torch's softplus (beta 1, threshold 20): x itself past 20."""
    with np.errstate(over="ignore"):
        return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _delta_decay(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, a_log, dt_bias = f32(xs[0]), f32(xs[1]), f32(xs[2])
    return -np.exp(a_log) * _softplus(x + dt_bias)


def _gated_rmsnorm(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, z, w = f32(xs[0]), f32(xs[1]), f32(xs[2])
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + np.float32(a["eps"])) * w * (z / (1 + np.exp(-z)))


def _to_heads(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]
    return x.reshape(*x.shape[:-1], a["axes"]["h"].size, -1)  # (B, T, heads, e)


def _delta_row(name: str, sig: str, impl: Any, doc: str, **fields: Any) -> OpSpec:
    """A gated delta rule row: what its three forms (chunked, chunked after a state, step) share.

    Each output position reads every earlier one (prefix); the fp32 state splits with its value
    heads (h carries g); nothing in it is linear, so a partial sum cannot pass through it.
    """
    return OpSpec(
        name,
        sig,
        CONTRACTION,
        impl,
        doc,
        out_dtypes=("same", "fp32"),
        relation=prefix,
        check=_delta_check,
        carries=(("h", "g"),),
        linear=(),
        backward_reads="inputs",
        **fields,
    )


register(
    _delta_row(
        "gated_delta_chunked",
        DELTA_SIG,
        _chunked,
        "The gated delta rule in chunks of attrs['chunk'] positions, from a zero state (a "
        "prefill): q, k (key heads), v, the log decay g and beta (value heads) -> the output "
        "and the final state (B, H, d_k, d_v). FLOPs: the chunked form's matmuls, and its "
        "elementwise work (chunked_matmul_flops, chunked_other_flops).",
        matmul_flops_fn=chunked_matmul_flops,
        flops_attrs_fn=chunked_other_flops,
    ),
    _delta_row(
        "gated_delta_chunked_state",
        DELTA_STATE_SIG,
        _chunked,
        "gated_delta_chunked after a carried state (input 5): several new tokens after a past.",
        state_inputs=(5,),
        matmul_flops_fn=chunked_matmul_flops,
        flops_attrs_fn=chunked_other_flops,
    ),
    _delta_row(
        "gated_delta_step",
        DELTA_STATE_SIG,
        _step,
        "The gated delta rule token by token from a carried state (a decode step): decay the "
        "state, correct it by beta (v - S^T k) along k, read it with q. 7 d_k d_v + 2 d_v + 1 "
        "FLOPs per token and value head (step_flops), none a matmul.",
        state_inputs=(5,),
        flops_attrs_fn=step_flops,
    ),
    _delta_row(
        "kda_chunked",
        KDA_SIG,
        _chunked,
        "Kimi Delta Attention in chunks of attrs['chunk'] positions from a zero state: the "
        "gated delta rule with a decay g per key channel (B, T, H, d_k), as transformers' "
        "chunk_kimi_delta_attention (FLA's chunk_kda) computes it. FLOPs: kda_matmul_flops, "
        "kda_other_flops.",
        matmul_flops_fn=kda_matmul_flops,
        flops_attrs_fn=kda_other_flops,
    ),
    _delta_row(
        "kda_chunked_state",
        KDA_STATE_SIG,
        _chunked,
        "kda_chunked after a carried state (input 5): several new tokens after a past.",
        state_inputs=(5,),
        matmul_flops_fn=kda_matmul_flops,
        flops_attrs_fn=kda_other_flops,
    ),
    _delta_row(
        "kda_step",
        KDA_STATE_SIG,
        _step,
        "Kimi Delta Attention token by token from a carried state (transformers' "
        "recurrent_kimi_delta_attention, FLA's fused_recurrent_kda): each key channel's row of "
        "the state decays by its own exp(g). 7 d_k d_v + 2 d_v + d_k FLOPs per token and head "
        "(kda_step_flops), none a matmul.",
        state_inputs=(5,),
        flops_attrs_fn=kda_step_flops,
    ),
    OpSpec(
        "l2normalize",
        "... e -> ... e",
        REDUCTION,
        _l2normalize,
        "x / sqrt(sum(x^2) + eps), in fp32 (Gated DeltaNet's q and k, FLA's l2norm: a sum, "
        "where Llama 4's l2norm takes the mean). 3 FLOPs/element.",
        reduce=("e",),
        flops_per_elem=3,
        backward_reads="inputs",
    ),
    OpSpec(
        "delta_decay",
        "b t h, h, h -> b t h",
        ELEMENTWISE,
        _delta_decay,
        "The log decay g = -exp(A_log) * softplus(a + dt_bias), per value head. 5 FLOPs/element "
        "(add, exp, log1p, multiply, negate); exp(A_log) per head is not counted.",
        flops_per_elem=5,
        backward_reads="inputs",
    ),
    OpSpec(
        "gated_rmsnorm",
        "... e, ... e, e -> ... e",
        REDUCTION,
        _gated_rmsnorm,
        "RMSNorm of x times w, gated by silu(z), in fp32 (Gated DeltaNet's output norm, per "
        "head). 9 FLOPs/element: the norm's 4, silu's 4, the gate's multiply.",
        reduce=("e",),
        flops_per_elem=9,
        backward_reads="inputs",
    ),
    OpSpec(
        "to_heads",
        "b t (h e) -> b t h e",
        MOVEMENT,
        _to_heads,
        "View the channels as heads, tokens kept before heads.",
        view=True,
    ),
    OpSpec(
        "from_heads",
        "b t h e -> b t (h e)",
        MOVEMENT,
        lambda xs, a: xs[0].reshape(*xs[0].shape[:2], -1),
        "Join the heads back into one channel axis.",
        view=True,
    ),
)


# -- the fused projections' channels regrouped so that a split of the key-head groups carries --
def _blocked_check(node: Node, env: dict[str, Dim]) -> str | None:
    """The index keeps blocks: output block j of `groups` reads input block j only, so a block
    of the key-head groups (a TP rank's) is a block of both axes."""
    g, f, c = node.attrs["groups"], env["f"].size, node.attrs["axes"]["c"].size
    index = node.attrs["index"]
    if c and len(index) > c and len(index) % c == 0:
        return None  # a rank's block of the groups (graphllm.passes.parallel), checked whole
    if not (f and c) or f % g or c % g or len(index) != c:
        return f"{len(index)} channels of {f} do not fall into {g} groups"
    fi, ci = f // g, c // g
    for j in range(g):
        if any(not j * fi <= x < (j + 1) * fi for x in index[j * ci : (j + 1) * ci]):
            return f"output group {j} reads channels outside input group {j}"
    return None


def blocked_index(a: dict[str, Any], held: int) -> list[int]:
    """The channels of its `held` input channels that a rank's select_blocked reads, counted from
    the first it holds: attrs['index'] whole, or on a block of the groups (attrs['shard']['f']:
    its first channel, all of them) the block's own share of it."""
    index = list(a["index"])
    shard = a.get("shard", {}).get("f")
    if shard is None:
        return index
    f0, f_all = shard
    per_in, per_out = f_all // a["groups"], len(index) // a["groups"]
    first, count = f0 // per_in, held // per_in
    return [x - f0 for x in index[first * per_out : (first + count) * per_out]]


def _select_blocked(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return xs[0][..., np.asarray(blocked_index(a, xs[0].shape[-1]))]


register(
    OpSpec(
        "select_blocked",
        "b t f -> b t c",
        MOVEMENT,
        _select_blocked,
        "The channels attrs['index'] names, in that order, each of attrs['groups'] output blocks "
        "read from its own input block (a fused projection's per-head-group layout regrouped: "
        "a split of the groups carries through).",
        check=_blocked_check,
        carries=(("c", "f"),),
    ),
    OpSpec(
        "select_rows",
        "f o k -> c o k",
        MOVEMENT,
        lambda xs, a: xs[0][np.asarray(a["index"])],
        "The rows attrs['index'] names, in that order (a conv weight's channels regrouped as its "
        "input's are).",
    ),
    OpSpec(
        "ungroup_heads",
        "b t g (r e) -> b t h e",
        MOVEMENT,
        lambda xs, a: xs[0].reshape(*xs[0].shape[:2], a["axes"]["h"].size, -1),
        "View each key-head group's r value heads as heads of their own (h = g r, group-major).",
        view=True,
        carries=(("h", "g"),),
    ),
)
