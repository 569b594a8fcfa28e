"""Op rows that hybrid layers share: the causal depthwise convolution over the token
axis with its carried state, and the zeroing of padded positions before a recurrence.

Channels stay last, as the projections write them: a conv's input is (B, S, C), its weight the
checkpoint's (C, 1, K) (nn.Conv1d with groups=C), its state the last K-1 inputs (B, K-1, C).

Positions: the conv's output axis `t` (the new tokens) differs from the input's `s` (the K-1 past
inputs and the new ones, or the new ones alone after a zero start), so the unchanged mixing rule
finds that the conv mixes (it contracts a position axis), and its `relation` (t-K+1 <= s <= t)
gives the tokens pass each position's window.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir import Dim, Node
from graphllm.ir.opspec import CONTRACTION, ELEMENTWISE, MOVEMENT, OpSpec, register
from graphllm.ops.common import f32


def _window(a: dict[str, Any], t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Output position t reads inputs t-K+1 .. t (absolute positions)."""
    return t - a["kernel"] + 1, t.copy()


def prefix(a: dict[str, Any], t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A recurrence's relation: output position t reads every input position s <= t (and,
    through a carried state, every position before the first new one: OpSpec.state_inputs)."""
    return np.zeros_like(t), t.copy()


def _conv(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, w = f32(xs[0]), f32(xs[1])[:, 0, :]  # x: (B, S, C); w: (C, K)
    k = w.shape[-1]
    if not a.get("with_state"):  # no past: the state starts at zero, K-1 zero inputs
        x = np.concatenate([np.zeros((x.shape[0], k - 1, x.shape[2]), np.float32), x], axis=1)
    t = x.shape[1] - k + 1
    out = np.zeros((x.shape[0], t, x.shape[2]), np.float32)
    for j in range(k):  # out[t] = sum_j w[:, j] x[t + j], the window ending at t
        out += x[:, j : j + t] * w[:, j]
    if len(xs) > 2:
        out += f32(xs[2])
    return out


def _conv_check(node: Node, env: dict[str, Dim]) -> str | None:
    if env["o"].size != 1:
        return "the conv weight is (channels, 1, kernel): one input channel per group"
    if env["k"].size != node.attrs.get("kernel"):
        return f"attrs kernel={node.attrs.get('kernel')} but the weight's kernel is {env['k']}"
    return None


def _conv_flops(bias: bool) -> Any:
    # 2 per tap (a multiply and an add) per output element, plus the bias add
    return lambda s: (2 * s["k"] + (1 if bias else 0)) * s["b"] * s["t"] * s["c"]


def _state_concat(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.concatenate([f32(xs[0]), f32(xs[1])], axis=1)  # (B, K-1 + T, C)


def _conv_state(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = f32(xs[0])  # (B, S, C): the last W inputs, zeros before the first one
    w = a["axes"]["w"].size
    if x.shape[1] < w:
        pad = np.zeros((x.shape[0], w - x.shape[1], x.shape[2]), np.float32)
        x = np.concatenate([pad, x], axis=1)
    return x[:, x.shape[1] - w :]


def _zero_padding(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, mask = f32(xs[0]), xs[1]  # x: (B, T, C); mask: (B, S), the new tokens its last T
    t = x.shape[1]
    # on a token shard, (its first position, the whole axis): its own block of the new tokens
    t0, t_all = a.get("shard", {}).get("t", (0, t))
    start = mask.shape[1] - t_all + t0
    return x * mask[:, start : start + t, None].astype(np.float32)


def _conv_row(name: str, sig: str, doc: str, *, bias: bool) -> OpSpec:
    """A causal convolution row, with or without its per-channel bias: one impl, one window."""
    return OpSpec(
        name,
        sig,
        CONTRACTION,
        _conv,
        doc,
        relation=_window,
        check=_conv_check,
        flops_fn=_conv_flops(bias=bias),
        backward_reads="inputs",
    )


register(
    _conv_row(
        "causal_conv1d",
        "b s c, c o k -> b t c",
        "Depthwise causal convolution over the token axis: out[t, c] = sum_j w[c, j] "
        "x[t-K+1+j, c], each channel its own K taps (nn.Conv1d, groups=C, no bias). The input "
        "is the K-1 past inputs (the conv state) then the new ones (with_state), or the new "
        "ones after K-1 zeros. 2K FLOPs per output element.",
        bias=False,
    ),
    _conv_row(
        "causal_conv1d_bias",
        "b s c, c o k, c -> b t c",
        "causal_conv1d plus a per-channel bias (Mamba2's conv1d): 2K + 1 FLOPs per output element.",
        bias=True,
    ),
    OpSpec(
        "state_concat",
        "b w c, b t c -> b s c",
        MOVEMENT,
        _state_concat,
        "The conv state (the last K-1 inputs) then the new inputs, along the token axis; each "
        "position comes from exactly one source position.",
        same_position=(("s", "w", "t"),),
    ),
    OpSpec(
        "conv_state",
        "b s c -> b w c",
        MOVEMENT,
        _conv_state,
        "The last W = K-1 positions of the conv's input, the state the next step starts from "
        "(zeros before the first input when fewer have been seen).",
        same_position=(("w", "s"),),
    ),
    OpSpec(
        "zero_padding",
        "b t c, b s -> b t c",
        ELEMENTWISE,
        _zero_padding,
        "x times the attention mask at its own positions (the mask's last T entries): padded "
        "positions enter a recurrence as zeros, as transformers' apply_mask_to_padding_states "
        "does. 1 FLOP/element (a multiply).",
        same_position=(("t", "s"),),
        flops_per_elem=1,
        linear=((0,),),
    ),
)
