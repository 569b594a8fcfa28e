"""Op rows of lightning attention (MiniMax-01's linear attention): causal linear attention with
a fixed decay per head, from a zero state in blocks and from a carried state token by token.

Per head, with the decay lambda = exp(-rate) (the layer's `slope_rate`, fixed) and a state S
(d_k x d_v) carried from step to step:

  S_t = lambda S_{t-1} + k_t v_t^T,    o_t = q_t S_t
      = sum_{s<=t} lambda^(t-s) (q_t . k_s) v_s + lambda^t q_t S_0

No scale on q, no normalisation: the layer norms o itself. q, k and v come heads first, (B, H,
T, d), as transformers' MiniMaxLightningAttention holds them.

Why not Mamba2's `ssm_scan` rows, which compute this recurrence with dt = 1, A = -rate, B = k,
C = q, x = v and D = 0: their dt is softplus(dt + dt_bias) clamped below, so a dt of one is an
input that only rounds to it, and their FLOPs are the SSD's five einsums, not the block loop
transformers runs; the gated delta rule's rows write beta (v - S^T k) rather than v.

The forms are transformers' own (the layer's forward picks by whether the cache holds a state):
- `lightning_attention`, from a zero state (a prefill): blocks of `block` positions (the last
  one shorter where T is no multiple of it). Per block of l positions and head: the intra-block
  scores Q K^T (2 l^2 d_k) masked by the decay lambda^(i-j) (l^2) and applied to V
  (2 l^2 d_v); the inter-block read (Q lambda^(i+1)) S (2 l d_k d_v, l d_k for the decay);
  the state's update S lambda^l + (K lambda^(l-1-j))^T V (2 l d_k d_v, l d_k for the decay,
  2 d_k d_v for the decay and the sum); the two parts' sum (l d_v).
- `lightning_attention_past`, from the layer's carried state: token by token for any number of
  new tokens. Per token and head: k_t v_t^T (2 d_k d_v, an outer product that torch runs as a
  matmul), the decayed sum (2 d_k d_v) and q_t S_t (2 d_k d_v).

The matmul FLOPs are what torch's FlopCounterMode counts of transformers' loops; the decay
tables the model keeps beside `slope_rate` (query_decay, key_decay, diagonal_decay) are powers
of lambda, which a kernel computes from the rate: the rows read the rate alone. The state is
read and written once, not once a block or a token: the rows' bytes are their inputs and
outputs, as a fused kernel's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir.opspec import CONTRACTION, OpSpec, register
from graphllm.ops.common import f32
from graphllm.ops.recurrent import prefix

# q, k, v, the rate per head [, the carried state] -> o, the final state; inputs on s, the output
# on t (attrs axes t), so that the tokens pass reads the prefix relation
LIGHTNING_SIG = "b h s k, b h s k, b h s v, h -> b h t v, b h k v"
LIGHTNING_STATE_SIG = "b h s k, b h s k, b h s v, h, b h k v -> b h t v, b h k v"


def _blocks(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' block loop from a zero state: the intra-block scores under the decay mask,
    the inter-block read of the state, the state's update at each block's end."""
    q, k, v, rate = (f32(x) for x in xs[:4])
    b, h, t, d_k = q.shape
    ell = int(a["block"])
    rate = rate[:, None, None]  # (h, 1, 1)
    state = np.zeros((b, h, d_k, v.shape[-1]), np.float32)
    out = np.empty((b, h, t, v.shape[-1]), np.float32)
    for start in range(0, t, ell):
        stop = min(start + ell, t)
        n = stop - start
        i = np.arange(1, n + 1, dtype=np.float32)[:, None]  # (n, 1)
        gap = i - i.T
        diag = np.where(gap >= 0, np.exp(-rate * np.maximum(gap, 0)), 0).astype(np.float32)
        qb, kb, vb = q[:, :, start:stop], k[:, :, start:stop], v[:, :, start:stop]
        intra = ((qb @ kb.swapaxes(-1, -2)) * diag) @ vb
        inter = (qb * np.exp(-rate * i)) @ state
        out[:, :, start:stop] = inter + intra
        written = (kb * np.exp(-rate * (n - i))).swapaxes(-1, -2) @ vb
        state = state * np.exp(-rate * n) + written
    return out, state


def _tokens(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' token loop from the carried state."""
    q, k, v, rate, state = (f32(x) for x in xs[:5])
    ratio = np.exp(-rate)[:, None, None]
    out = np.empty((*v.shape[:3], v.shape[-1]), np.float32)
    for t in range(q.shape[2]):
        state = ratio * state + k[:, :, t, :, None] * v[:, :, t, None, :]
        out[:, :, t] = np.einsum("bhk,bhkv->bhv", q[:, :, t], state)
    return out, state


def block_flops(s: dict[str, float], a: dict[str, Any]) -> tuple[float, float]:
    """(matmul, other) FLOPs of the block form at s["t"] positions (module docstring): full
    blocks of `block` positions and one shorter block of the rest."""
    t, ell, dk, dv = s["t"], a["block"], s["k"], s["v"]
    full, rest = divmod(int(t), int(ell))
    squares = full * ell * ell + rest * rest  # the sum of l^2 over the blocks
    blocks = full + (1 if rest else 0)
    heads = s["b"] * s["h"]
    matmul = heads * (2 * squares * (dk + dv) + 4 * t * dk * dv)
    other = heads * (squares + t * (2 * dk + dv) + blocks * 2 * dk * dv)
    return matmul, other


def token_flops(s: dict[str, float], a: dict[str, Any]) -> tuple[float, float]:
    """(matmul, other) FLOPs of the token form (module docstring)."""
    per_token = s["b"] * s["h"] * s["t"] * s["k"] * s["v"]
    return 4 * per_token, 2 * per_token


def _row(name: str, sig: str, impl: Any, flops: Any, doc: str, **fields: Any) -> OpSpec:
    """A lightning attention row: output t reads every input s <= t (prefix); its state splits
    with its heads; nothing in it is linear, so a partial sum cannot pass through it."""
    return OpSpec(
        name,
        sig,
        CONTRACTION,
        impl,
        doc,
        relation=prefix,
        matmul_flops_fn=lambda s, a: flops(s, a)[0],
        flops_attrs_fn=lambda s, a: flops(s, a)[1],
        out_dtypes=("same", "same"),
        linear=(),
        backward_reads="inputs",
        **fields,
    )


register(
    _row(
        "lightning_attention",
        LIGHTNING_SIG,
        _blocks,
        block_flops,
        "Lightning attention from a zero state (a prefill): q, k, v (b, h, t, d) heads first "
        "and the decay rate per head -> o and the final state (b, h, d_k, d_v); o_t = "
        "sum_{s<=t} exp(-rate)^(t-s) (q_t . k_s) v_s, computed in blocks of attrs['block'] "
        "positions as transformers' MiniMax layer does (FLOPs: block_flops).",
    ),
    _row(
        "lightning_attention_past",
        LIGHTNING_STATE_SIG,
        _tokens,
        token_flops,
        "lightning_attention from the layer's carried state (input 4), token by token for any "
        "number of new tokens as transformers runs it: 4 d_k d_v matmul FLOPs per token and "
        "head (k v^T, q S), 2 d_k d_v elementwise (the decayed sum).",
        state_inputs=(4,),
    ),
)
