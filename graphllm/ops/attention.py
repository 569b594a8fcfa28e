"""Op rows of attention: RoPE, the KV-cache concat, GQA's repeat, scores, scale, mask, softmax and the weighted sum of values."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir import Dim, Node
from graphllm.ir.opspec import (
    CONTRACTION,
    ELEMENTWISE,
    MOVEMENT,
    REDUCTION,
    OpSpec,
    register,
)
from graphllm.ops.common import f32, qk, rope_flops, weighted_values


def _rope(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, pos = f32(xs[0]), xs[1]  # x: (B, heads, T, head_dim); pos: (B, T)
    inv_freq = np.asarray(a["inv_freq"], dtype=np.float32)
    long = a.get("long_inv_freq")
    if long is not None and pos.size and _largest_position(pos, a) + 1 > a["long_from"]:
        inv_freq = np.asarray(long, dtype=np.float32)
    freqs = pos[..., None].astype(np.float32) * inv_freq  # (B, T, rot/2)
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None]  # (B, 1, T, rot)
    scale = np.float32(a.get("attention_scaling", 1.0))
    cos, sin = np.cos(emb) * scale, np.sin(emb) * scale
    rot = 2 * inv_freq.shape[0]  # partial rotary: the channels past rot pass through
    xr, rest = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    return np.concatenate([xr * cos + rotated * sin, rest], axis=-1)


def _largest_position(pos: np.ndarray, a: dict[str, Any]) -> int:
    """The call's largest position id. On a block of the tokens (a context- or sequence-parallel
    rank: `shard`), the whole call's, which ends the token axis: its origin plus its length (the
    partitioned runs' positions are the call's own, P.. P+T-1)."""
    shard = a.get("shard", {}).get("t")
    if shard is not None:
        return int(a.get("origin", {}).get("t", 0)) + int(shard[1]) - 1
    return int(pos.max())


def _mask(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]  # (B, H, T, S); queries are the last T of the S key positions
    t, s = x.shape[-2], x.shape[-1]
    shard = a.get("shard", {})  # on a token shard: (first position held, whole axis) per axis
    t0, t_all = shard.get("t", (0, t))
    s0, s_all = shard.get("s", (0, s))
    # absolute positions where the runtime gives the axes' origins (a chunk is absolute, and a
    # rolled cache's first key is P - P_w); else counted from the first key held, which is
    # enough for causal and window relations (they depend on t - s alone)
    origin = a.get("origin", {})
    k_origin = origin.get("s", 0)
    t_origin = origin.get("t", k_origin + s_all - t_all)
    lo, hi = _mask_relation(a, np.arange(t0, t0 + t) + t_origin)
    k = np.arange(s0, s0 + s)[None, :] + k_origin
    allowed = (k >= lo[:, None]) & (k <= hi[:, None])
    return np.where(allowed, x, np.float32(-np.inf))


def _mask_relation(a: dict[str, Any], t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Allowed key positions of query position t: causal s <= t; window W: s > t - W; chunk C:
    s in t's own chunk of absolute positions, s // C == t // C."""
    hi = t.copy() if a.get("causal", True) else np.full_like(t, np.iinfo(np.int64).max // 2)
    lo = t - a["window"] + 1 if a.get("window") else np.zeros_like(t)
    if a.get("chunk"):
        lo = np.maximum(lo, t // a["chunk"] * a["chunk"])
        hi = np.minimum(hi, (t // a["chunk"] + 1) * a["chunk"] - 1)
    return lo, hi


def _softmax(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = f32(xs[0])
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _kv_concat(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.concatenate([f32(xs[0]), f32(xs[1])], axis=2)  # (B, kv_heads, P+T, hd)


def _repeat_check(node: Node, env: dict[str, Dim]) -> str | None:
    g, h = env["g"].size, node.attrs["axes"]["h"].size
    return None if g and h and h % g == 0 else f"{h} heads are not a multiple of {g} kv heads"


register(
    OpSpec(
        "rope",
        "b h t e, b t -> b h t e",
        ELEMENTWISE,
        _rope,
        "Rotate pairs of features by the angle of the position's own index: x cos + rot(x) sin; "
        "with fewer frequencies than pairs (partial rotary) only the leading channels turn. "
        "longrope picks its long frequencies when the call's largest position id reaches "
        "long_from (a choice made from the position ids, never from token values). "
        "3 FLOPs per rotated element (two multiplies, one add); the channels past the rotated "
        "width (partial rotary) pass through for free, and the cos/sin tables are not counted.",
        flops_attrs_fn=rope_flops,
        linear=((0,),),
        # longrope on a token shard reads the whole call's last position from its axis origin
        positional=True,
    ),
    OpSpec(
        "kv_concat",
        "b g p e, b g t e -> b g s e",
        MOVEMENT,
        _kv_concat,
        "Append the new keys/values behind the cached ones; each key position comes from "
        "exactly one source position (absolute positions are kept).",
        same_position=(("s", "p", "t"),),
        check=None,
        in_place=(0,),
    ),
    OpSpec(
        "repeat_kv",
        "b g s e -> b h s e",
        MOVEMENT,
        lambda xs, a: np.repeat(xs[0], a["axes"]["h"].size // xs[0].shape[1], axis=1),
        "Copy each KV head to the query heads of its group (GQA/MQA).",
        check=_repeat_check,
        carries=(("h", "g"),),
        backward_redoes=True,
    ),
    OpSpec(
        "scores",
        "b h t e, b h s e -> b h t s",
        CONTRACTION,
        qk,
        "Q K^T: every query position against every key position.",
        matmul=True,
    ),
    OpSpec(
        "mul_const",
        "... -> ...",
        ELEMENTWISE,
        lambda xs, a: f32(xs[0]) * np.float32(a["value"]),
        "Multiply by a constant (attention scale 1/sqrt(d_h), gemma's embedding scale).",
        flops_per_elem=1,
        linear=((0,),),
    ),
    OpSpec(
        "mask",
        "b h t s -> b h t s",
        ELEMENTWISE,
        _mask,
        "Set disallowed (query, key) pairs to -inf: causal s <= t, window t - W < s, chunk "
        "s // C == t // C (absolute positions). 1 FLOP/element (a select).",
        flops_per_elem=1,
        relation=_mask_relation,
    ),
    OpSpec(
        "softmax",
        "... s -> ... s",
        REDUCTION,
        _softmax,
        "Softmax over the last axis, in fp32. 5 FLOPs/element: max, subtract, exp, sum, divide.",
        reduce=("s",),
        flops_per_elem=5,
        backward_reads="output",
        backward_stats=1,  # the log-sum-exp of each row
    ),
    OpSpec(
        "pv",
        "b h t s, b h s e -> b h t e",
        CONTRACTION,
        weighted_values,
        "Attention probabilities times V: a weighted sum over key positions.",
        matmul=True,
    ),
)


# -- Gemma 2's logit soft-capping ----------------------------------------------------
def _softcap(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    cap = np.float32(a["cap"])
    return np.tanh(f32(xs[0]) / cap) * cap


register(
    OpSpec(
        "softcap",
        "... -> ...",
        ELEMENTWISE,
        _softcap,
        "cap * tanh(x / cap): squashes logits into (-cap, cap) (Gemma 2's attention scores "
        "before the mask, and its final logits). 3 FLOPs/element: divide, tanh, multiply.",
        flops_per_elem=3,
        backward_reads="inputs",
    ),
)


# -- Llama 4's L2 QK-norm and attention temperature ----------------------------------
def _l2norm(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = f32(xs[0])
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(a["eps"]))


def temperature(positions: np.ndarray, floor_scale: int, attn_scale: float) -> np.ndarray:
    """Llama 4's per-query factor at absolute position indices `positions`, in fp32 as
    transformers computes it: log(floor((i + 1) / floor_scale) + 1) * attn_scale + 1."""
    i = positions.astype(np.float32)
    f = np.floor((i + np.float32(1.0)) / np.float32(floor_scale))
    return np.log1p(f) * np.float32(attn_scale) + np.float32(1.0)


def _attn_temperature(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = f32(xs[0])  # (B, H, T, E)
    t = x.shape[2]
    t0 = a.get("shard", {}).get("t", (0, t))[0]
    pos = np.arange(t0, t0 + t) + a.get("origin", {}).get("t", 0)
    return x * temperature(pos, a["floor_scale"], a["attn_scale"])[:, None]


register(
    OpSpec(
        "l2norm",
        "... e -> ... e",
        REDUCTION,
        _l2norm,
        "x / sqrt(mean(x^2) + eps), no weight, in fp32 (Llama 4's QK-norm, after RoPE). "
        "3 FLOPs/element: square, sum, scale by the reciprocal root.",
        reduce=("e",),
        flops_per_elem=3,
        backward_reads="inputs",
    ),
    OpSpec(
        "attn_temperature",
        "b h t e -> b h t e",
        ELEMENTWISE,
        _attn_temperature,
        "Scale each query by log(floor((i + 1) / floor_scale) + 1) * attn_scale + 1, i its "
        "absolute position index (Llama 4's NoPE layers). 1 FLOP/element (a multiply); the "
        "per-position factor is not counted, as RoPE's cos/sin are not.",
        flops_per_elem=1,
        linear=((0,),),
        positional=True,
    ),
)


# -- gpt-oss's attention sinks -------------------------------------------------------
def _softmax_sink(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, sink = f32(xs[0]), f32(xs[1])  # x: (B, H, T, S); sink: (H,), or (B, H, T, 1) a query's
    s = np.broadcast_to(sink if sink.ndim == 4 else sink[None, :, None, None], (*x.shape[:-1], 1))
    m = np.maximum(np.max(x, axis=-1, keepdims=True), s)
    e = np.exp(x - m)
    return e / (np.sum(e, axis=-1, keepdims=True) + np.exp(s - m))


register(
    OpSpec(
        "softmax_sink",
        "b h t s, h -> b h t s",
        REDUCTION,
        _softmax_sink,
        "Softmax over the key axis with the head's learned sink logit in the denominator, "
        "which takes probability mass and has no value (gpt-oss), in fp32. 5 FLOPs per "
        "element of the row and its sink: max, subtract, exp, sum, divide.",
        reduce=("s",),
        flops_fn=lambda s: 5 * s["b"] * s["h"] * s["t"] * (s["s"] + 1),
        backward_reads="output",
        backward_stats=1,
    ),
    OpSpec(
        "softmax_token_sink",
        "b h t s, b h t o -> b h t s",
        REDUCTION,
        _softmax_sink,
        "Softmax over the key axis with a sink logit each query computes (o: one entry) in the "
        "denominator, which takes probability mass and has no value (Inkling 2), in fp32. 5 "
        "FLOPs per element of the row and its sink, as softmax_sink.",
        reduce=("s", "o"),
        flops_fn=lambda s: 5 * s["b"] * s["h"] * s["t"] * (s["s"] + 1),
        backward_reads="output",
        backward_stats=1,
    ),
)
