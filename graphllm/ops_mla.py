"""numpy reference implementations of the ops DeepSeek-V2/V3 add: interleaved RoPE, feature
concat, the latent's per-head expansion, and the router's bias, group limit and gather.

The rows that declare them (signatures, FLOPs, categories) are in graphllm.ops, like every op's.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def rope_pairs(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """Rotate adjacent pairs (x_2i, x_2i+1) by position * inv_freq_i.

    layout 'complex' writes each rotated pair back in place (DeepSeek-V2's complex product);
    'interleave' writes all first members, then all second ones (DeepSeek-V3's rope_interleave).
    """
    x, pos = _f32(xs[0]), xs[1]  # x: (B, heads, T, e); pos: (B, T)
    inv_freq = np.asarray(a["inv_freq"], dtype=np.float32)
    freqs = (pos[..., None].astype(np.float32) * inv_freq)[:, None]  # (B, 1, T, e/2)
    scale = np.float32(a.get("attention_scaling", 1.0))
    cos, sin = np.cos(freqs) * scale, np.sin(freqs) * scale
    x1, x2 = x[..., 0::2], x[..., 1::2]
    r1, r2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    if a["layout"] == "complex":
        return np.stack([r1, r2], axis=-1).reshape(x.shape)
    return np.concatenate([r1, r2], axis=-1)


def concat(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.concatenate([_f32(xs[0]), _f32(xs[1])], axis=-1)


def latent_heads(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]  # (B, 1, S, heads * e): the expanded latent, one row per key position
    b, _, s, _ = x.shape
    return x.reshape(b, s, a["axes"]["h"].size, -1).transpose(0, 2, 1, 3)  # (B, heads, S, e)


def split_heads_weight(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """kv_b_proj's (heads * (nope + v), rank) weight as per-head key and value parts."""
    w = _f32(xs[0])
    h = a["axes"]["h"].size
    w = w.reshape(h, -1, w.shape[-1])  # (heads, nope + v, rank)
    n = a["axes"]["n"].size
    return w[:, :n], w[:, n:]


def group_limit(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """Keep the experts of the `topk_group` best groups, set the others to `fill`.

    A group's score is its best expert's ('max', DeepSeek-V2) or its two best summed ('top2',
    DeepSeek-V3), as transformers' routers rank them.
    """
    x = _f32(xs[0])
    lead, e = x.shape[:-1], x.shape[-1]
    groups = x.reshape(*lead, a["n_group"], e // a["n_group"])
    if a["score"] == "max":
        score = groups.max(axis=-1)
    else:
        score = np.sort(groups, axis=-1)[..., -2:].sum(axis=-1)
    best = np.argsort(-score, axis=-1, kind="stable")[..., : a["topk_group"]]
    keep = np.zeros(score.shape, dtype=bool)
    np.put_along_axis(keep, best, True, axis=-1)
    keep = np.repeat(keep, e // a["n_group"], axis=-1)
    return np.where(keep, x, np.float32(a["fill"]))


def gather_k(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """The values at the chosen indices (the unbiased scores of the selected experts)."""
    return np.take_along_axis(_f32(xs[0]), xs[1], axis=-1)
