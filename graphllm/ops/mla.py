"""Op rows DeepSeek-V2/V3 add: latent attention (MLA) in its naive and absorbed forms and the grouped router."""

from __future__ import annotations

from collections.abc import Callable
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
from graphllm.ops.common import add_impl, f32, qk, rope_flops, size_one, weighted_values


def _einsum(sig: str) -> Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]:
    """An impl that is the row's own signature as an einsum (one-letter axes, no groups)."""
    subscripts = sig.replace(" ", "")
    return lambda xs, a: np.einsum(subscripts, *map(f32, xs))


def _concat_check(node: Node, env: dict[str, Dim]) -> str | None:
    ok = env["f1"].size + env["f2"].size == node.attrs["axes"]["f"].size  # type: ignore[operator]
    return None if ok else "the parts do not add up to the concatenated axis"


_one_check = size_one("the latent has a single (shared) head")


_ABSORB_Q = "b h t e, h e f -> b h t f"  # each head's query into latent space


_ABSORB_O = "b h t e, h f e -> b h t f"  # each head's latent output back out


def rope_pairs(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """Rotate adjacent pairs (x_2i, x_2i+1) by position * inv_freq_i.

    layout 'complex' writes each rotated pair back in place (DeepSeek-V2's complex product);
    'interleave' writes all first members, then all second ones (DeepSeek-V3's rope_interleave).
    """
    x, pos = f32(xs[0]), xs[1]  # x: (B, heads, T, e); pos: (B, T)
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
    return np.concatenate([f32(xs[0]), f32(xs[1])], axis=-1)


def latent_heads(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]  # (B, 1, S, heads * e): the expanded latent, one row per key position
    b, _, s, _ = x.shape
    return x.reshape(b, s, a["axes"]["h"].size, -1).transpose(0, 2, 1, 3)  # (B, heads, S, e)


def split_heads_weight(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """kv_b_proj's (heads * (nope + v), rank) weight as per-head key and value parts."""
    w = f32(xs[0])
    h = a["axes"]["h"].size
    w = w.reshape(h, -1, w.shape[-1])  # (heads, nope + v, rank)
    n = a["axes"]["n"].size
    return w[:, :n], w[:, n:]


def group_limit(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """Keep the experts of the `topk_group` best groups, set the others to `fill`.

    A group's score is its best expert's ('max', DeepSeek-V2) or its two best summed ('top2',
    DeepSeek-V3), as transformers' routers rank them.
    """
    x = f32(xs[0])
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
    return np.take_along_axis(f32(xs[0]), xs[1], axis=-1)


register(
    OpSpec(
        "rope_pairs",
        "b h t e, b t -> b h t e",
        ELEMENTWISE,
        rope_pairs,
        "RoPE on adjacent pairs (x_2i, x_2i+1), written back interleaved ('complex', "
        "DeepSeek-V2) or first members then second ('interleave', DeepSeek-V3). 3 FLOPs per "
        "rotated element, as rope.",
        flops_attrs_fn=rope_flops,
        linear=((0,),),
    ),
    OpSpec(
        "concat",
        "... f1, ... f2 -> ... f",
        MOVEMENT,
        concat,
        "Join two feature parts (MLA's no-RoPE and RoPE parts of a query or key; an MTP "
        "module's normed embedding and hidden state).",
        check=_concat_check,
    ),
    OpSpec(
        "latent_heads",
        "b o s (h e) -> b h s e",
        MOVEMENT,
        latent_heads,
        "View the latent's up-projection (one shared row per position) as per-head rows.",
        check=_one_check,
    ),
    OpSpec(
        "split_heads_weight",
        "(h f) r -> h n r, h v r",
        MOVEMENT,
        split_heads_weight,
        "kv_b_proj's weight as per-head key and value blocks (MLA's absorbed form).",
        out_dtypes=("same", "same"),
        view=True,
    ),
    OpSpec(
        "absorb_q",
        _ABSORB_Q,
        CONTRACTION,
        _einsum(_ABSORB_Q),
        "Each head's query times that head's key up-projection (query into latent space).",
        matmul=True,
    ),
    OpSpec(
        "absorb_o",
        _ABSORB_O,
        CONTRACTION,
        _einsum(_ABSORB_O),
        "Each head's latent output times that head's value up-projection.",
        matmul=True,
    ),
    OpSpec(
        "scores_mqa",
        "b h t e, b o s e -> b h t s",
        CONTRACTION,
        qk,
        "Q K^T against one key head shared by all query heads (absorbed MLA's latent keys).",
        check=_one_check,
        matmul=True,
    ),
    OpSpec(
        "pv_mqa",
        "b h t s, b o s e -> b h t e",
        CONTRACTION,
        weighted_values,
        "Attention probabilities times one value head shared by all query heads.",
        check=_one_check,
        matmul=True,
    ),
    OpSpec(
        "bias_add",
        "... x, x -> ... x",
        ELEMENTWISE,
        add_impl,
        "Add a per-expert bias (DeepSeek-V3's e_score_correction_bias). 1 FLOP/element.",
        flops_per_elem=1,
        linear=((0, 1),),
    ),
    OpSpec(
        "group_limit",
        "... x -> ... x",
        REDUCTION,
        group_limit,
        "Keep the experts of the topk_group best of n_group groups (ranked by their best score, "
        "or their two best summed), the rest set to `fill`. 2 FLOPs/element (score, select).",
        reduce=("x",),
        flops_per_elem=2,
        linear=(),
    ),
    OpSpec(
        "gather_k",
        "... x, ... k -> ... k",
        MOVEMENT,
        gather_k,
        "The scores at the chosen expert ids (the unbiased weights of the selected experts).",
    ),
)
