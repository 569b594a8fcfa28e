"""Op rows of a diagonal linear recurrence over the tokens (RecurrentGemma's RG-LRU scan):

  h_t = a_t h_{t-1} + x_t        per (b, channel), in fp32; y_t = h_t in x's dtype

The gates that make a_t and x_t (the input and recurrence gates, a_t = exp(-8 r_t softplus(c)),
the sqrt(1 - a_t^2) normalisation, a_t zeroed at a document's first position) are the model's
own elementwise code, traced as ordinary ops; only the loop over the tokens is a row, as a
fused kernel (Griffin's linear scan) runs it. transformers' torch reference is
`RecurrentGemmaRglru._rnn_scan`, which loops over the tokens in Python and starts from the
layer's carried state (zeros at a first step).

FLOPs: 2 a token and channel (the decay's product and the sum), none of them a matmul (torch's
loop runs them elementwise, and FlopCounterMode counts none). The state is read and written
once, not once a token: the row's bytes are its inputs and outputs.

`one_token_state`: RecurrentGemma's conv reads the layer's carried inputs (its last K-1, kept on
the module) for one new token only; a call of several tokens runs its prefill branch, a conv from
zeros, after a past too. The row is that dispatch, so that one graph (and one export) holds for
both: the carried state where the step has one token, zeros otherwise.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir.opspec import MOVEMENT, OpSpec, register
from graphllm.ops.common import f32
from graphllm.ops.mamba import state_scan_row

# inputs on s, outputs on t (attrs axes t), so that the tokens pass reads the prefix relation:
# x, a [, the carried state] -> y, the final state
LRU_SIG = "b s d, b s d -> b t d, b d"
LRU_STATE_SIG = "b s d, b s d, b d -> b t d, b d"


def _scan(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x, decay = f32(xs[0]), f32(xs[1])
    bsz, t, d = x.shape
    state = f32(xs[2]).copy() if len(xs) > 2 else np.zeros((bsz, d), np.float32)
    y = np.empty_like(x)
    for i in range(t):  # transformers' loop: the state in fp32, each token's y cast from it
        state = decay[:, i] * state + x[:, i]
        y[:, i] = state
    return y.astype(np.float32), state.astype(np.float32)


def lru_flops(s: dict[str, float], a: dict[str, Any]) -> tuple[float, float]:
    """(matmul, other) FLOPs of one linear recurrence node (module docstring)."""
    return 0.0, 2 * s["b"] * s["t"] * s["d"]


def _one_token_state(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    state, x = f32(xs[0]), xs[1]  # state (B, C, W); x (B, C, T), read for its length
    return state if x.shape[2] == 1 else np.zeros_like(state)


register(
    OpSpec(
        "one_token_state",
        "b c w, b c t -> b c w",
        MOVEMENT,
        _one_token_state,
        "The carried state (input 0) where the new tokens (input 1, read for its length) are "
        "one, zeros otherwise: transformers' dispatch of RecurrentGemma's conv, which reads its "
        "state for a one-token step only (module docstring).",
    ),
    state_scan_row(
        "linear_recurrence",
        LRU_SIG,
        "A diagonal linear recurrence over the tokens from a zero state (the RG-LRU's scan): "
        "h_t = a_t h_{t-1} + x_t per channel in fp32, y_t = h_t; returns y and the final "
        "state (b, d). 2 FLOPs per token and channel, none a matmul.",
        _scan,
        lru_flops,
    ),
    state_scan_row(
        "linear_recurrence_state",
        LRU_STATE_SIG,
        "linear_recurrence from the layer's carried state (input 2): a cached step of any "
        "length, as transformers' RG-LRU runs it (one token or several).",
        _scan,
        lru_flops,
        state_inputs=(2,),
    ),
)
