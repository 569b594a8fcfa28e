"""Op rows of selected-keys attention (DeepSeek Sparse Attention's lightning indexer): its key
cache, its causal mask (scores without heads), the top-k selection of keys for each query, and
the mask that keeps only them within the relation.

The selection is made at run time from the indexer's scores, so the keys a query reads are not a
function of positions: the mask's relation (causal, a window) stays the bound on what a query may
read, and `topk` says how many of those keys it reads at most, which is what an engine's sparse
kernel pays for (the cost pass counts min(k, allowed) keys a query as the engine's attention).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir.opspec import ELEMENTWISE, MOVEMENT, REDUCTION, OpSpec, register
from graphllm.ops.attention import _mask, _mask_relation
from graphllm.ops.common import f32


def top_keys(x: np.ndarray, k: int) -> np.ndarray:
    """True at the min(k, S) largest entries of each row of x (..., S); of equal scores the
    earlier key. torch's topk breaks such ties as its kernel happens to (its CPU kernel not by
    position), so a selection that cuts through a tie is the one thing a run may not share
    with it."""
    k = min(int(k), x.shape[-1])
    order = np.argsort(-np.asarray(x, dtype=np.float64), axis=-1, kind="stable")[..., :k]
    out = np.zeros(x.shape, dtype=bool)
    np.put_along_axis(out, order, True, axis=-1)
    return out


def _select(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return top_keys(xs[0], a["topk"])


def _mask_selected(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = _mask(xs[:1], a)  # (B, H, T, S) within the relation
    return np.where(xs[1][:, None], x, np.float32(-np.inf))


register(
    OpSpec(
        "kv_concat_nohead",
        "b p e, b t e -> b s e",
        MOVEMENT,
        lambda xs, a: np.concatenate([f32(xs[0]), f32(xs[1])], axis=1),
        "Append new keys without a heads axis (an indexer's, one key a position) behind the "
        "cached ones, as kv_concat does.",
        same_position=(("s", "p", "t"),),
        in_place=(0,),
    ),
    OpSpec(
        "mask_nohead",
        "b t s -> b t s",
        ELEMENTWISE,
        lambda xs, a: _mask([xs[0][:, None]], a)[:, 0],
        "The mask row on scores without a heads axis (an indexer's, summed over its heads): "
        "disallowed (query, key) pairs set to -inf. 1 FLOP/element (a select).",
        flops_per_elem=1,
        relation=_mask_relation,
    ),
    OpSpec(
        "topk_select",
        "... t s -> ... t s",
        REDUCTION,
        _select,
        "The keys each query selects: True at its min(k, S) highest scores (attrs['topk']), "
        "chosen at run time. 1 FLOP/element (a comparison).",
        reduce=("s",),
        flops_per_elem=1,
        out_dtypes=("bool",),
        linear=(),
    ),
    OpSpec(
        "mask_selected",
        "b h t s, b t s -> b h t s",
        ELEMENTWISE,
        _mask_selected,
        "The mask row's relation (causal, window) and, within it, only the keys the query "
        "selected (input 1, True where kept): at most attrs['topk'] keys a query, chosen at run "
        "time. 1 FLOP/element (a select).",
        flops_per_elem=1,
        relation=_mask_relation,
        linear=((0,),),
    ),
)
