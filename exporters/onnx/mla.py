"""Decomposed ONNX lowerings of the op rows DeepSeek-V2/V3 add (graphllm.ops.mla).

Each registers itself with `graphllm.exporters.onnx.lowers`, like the lowerings in that module,
and emits standard ONNX ops only:
- `rope_pairs` rotates the even/odd feature pairs with cos/sin tables (B, 1, T, e/2) computed once
  per position input and frequency set (scope `model.rotary_emb`), and writes the pairs back in
  place ('complex') or first members then second ones ('interleave');
- `latent_heads`, `split_heads_weight` are Reshape/Transpose/Split views (the latter of a weight);
- `absorb_q`, `absorb_o`, `scores_mqa`, `pv_mqa` are MatMuls, the shared latent head (size 1)
  broadcast over the query heads;
- `group_limit` ranks the groups with ReduceMax or the sum of a TopK of 2, keeps the TopK groups
  (lower index first on ties, as the numpy reference's stable argsort) and fills the rest;
  `gather_k` is GatherElements.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from graphllm.exporters.onnx.decomposed import rotary_tables
from graphllm.exporters.onnx.lowering import (
    DECOMPOSED,
    INT64_MAX,
    NP_TYPES,
    Lowering,
    axis_size,
    lowers,
)
from graphllm.ir import Node


def _dims(c: Lowering, n: Node, k: int = 0) -> tuple[int | None, ...]:
    """Sizes of input k of n (None for symbolic dims)."""
    return tuple(d.size for d in c.graph.type_of(n.inputs[k]).dims)  # type: ignore[misc]


@lowers("rope_pairs")
def _rope_pairs(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    cos, sin = rotary_tables(c, i[1], n, full=False)  # (B, 1, T, e/2)
    s, x = n.name, i[0]
    end, two = c.const([INT64_MAX]), c.const([2])
    x1 = c.op("Slice", [x, c.const([0]), end, c.const([-1]), two], s)  # x_2i
    x2 = c.op("Slice", [x, c.const([1]), end, c.const([-1]), two], s)  # x_2i+1
    r1 = c.op("Sub", [c.op("Mul", [x1, cos], s), c.op("Mul", [x2, sin], s)], s)
    r2 = c.op("Add", [c.op("Mul", [x2, cos], s), c.op("Mul", [x1, sin], s)], s)
    if n.attrs["layout"] == "interleave":
        c.final("Concat", [r1, r2], n, o, axis=-1)  # first members, then second ones
        return
    if n.attrs["layout"] != "complex":
        raise ValueError(f"{n.name}: unknown rope_pairs layout {n.attrs['layout']!r}")
    e = int(_dims(c, n)[-1])  # type: ignore[arg-type]
    pairs = [c.op("Unsqueeze", [r, c.const([-1])], s) for r in (r1, r2)]
    both = c.op("Concat", pairs, s, axis=-1)  # (B, h, T, e/2, 2)
    c.final("Reshape", [both, c.const([0, 0, 0, e])], n, o)  # each pair back in place


@lowers("concat")
def _concat(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Concat", [i[0], i[1]], n, o, axis=-1)


@lowers("latent_heads")
def _latent_heads(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    h, e = axis_size(n, "h"), axis_size(n, "e")
    x = c.op("Reshape", [i[0], c.const([0, -1, h, e])], n.name)  # (B, S, heads, e)
    c.final("Transpose", [x], n, o, perm=[0, 2, 1, 3])  # (B, heads, S, e)


@lowers("split_heads_weight")
def _split_heads_weight(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    (h, nope, r), (_, v, _) = ([int(d.size) for d in t.dims] for t in n.outputs)  # type: ignore[arg-type]
    w = c.op("Reshape", [i[0], c.const([h, nope + v, r])], n.name)  # (heads, nope + v, rank)
    c.final("Split", [w, c.const([nope, v])], n, o, axis=1)


# the broadcast of the shared latent head (size 1) over the query heads is MatMul's own: the
# rows lower as the ones they generalise
lowers("absorb_q", "pv_mqa")(DECOMPOSED["pv"])  # (B, h, T, e) @ (h, e, f) or (B, 1, S, e)
lowers("absorb_o")(DECOMPOSED["expert_linear"])  # (B, h, T, e) @ (h, f, e)^T, batched over heads
lowers("scores_mqa")(DECOMPOSED["scores"])  # (B, h, T, e) @ (B, 1, S, e)^T
lowers("bias_add")(DECOMPOSED["add"])


@lowers("group_limit")
def _group_limit(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, x = n.name, i[0]
    dims = _dims(c, n)
    g, e = int(n.attrs["n_group"]), int(dims[-1])  # type: ignore[arg-type]
    lead = [0] * (len(dims) - 1)
    groups = c.op("Reshape", [x, c.const([*lead, g, e // g])], s)  # (..., G, E/G)
    if n.attrs["score"] == "max":
        score = c.op("ReduceMax", [groups, c.const([-1])], s, keepdims=0)
    elif n.attrs["score"] == "top2":
        best2 = c.op("TopK", [groups, c.const([2])], s, n_out=2, axis=-1, largest=1, sorted=1)
        score = c.op("ReduceSum", [best2[0], c.const([-1])], s, keepdims=0)
    else:
        raise ValueError(f"{n.name}: unknown group score {n.attrs['score']!r}")
    k = c.const([int(n.attrs["topk_group"])])
    _, best = c.op("TopK", [score, k], s, n_out=2, axis=-1, largest=1, sorted=1)  # (..., kg)
    hit = c.op("Equal", [c.op("Unsqueeze", [best, c.const([-1])], s), c.const(np.arange(g))], s)
    hits = c.op("ReduceMax", [c.op("Cast", [hit], s, to=TensorProto.INT64), c.const([-2])], s)
    keep = c.op("Greater", [hits, c.const(0, hint="zero")], s)  # (..., 1, G)
    keep = c.op("Transpose", [keep], s, perm=[*range(len(dims) - 1), len(dims), len(dims) - 1])
    fill = c.const(np.asarray(n.attrs["fill"], NP_TYPES[c.dtype]), c.dtype, "fill")
    kept = c.op("Where", [keep, groups, fill], s)  # (..., G, E/G)
    c.final("Reshape", [kept, c.const([*lead, e])], n, o)


@lowers("gather_k")
def _gather_k(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("GatherElements", [i[0], i[1]], n, o, axis=-1)
