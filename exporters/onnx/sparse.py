"""Decomposed ONNX lowerings of the selected-keys rows (graphllm.ops.sparse).

`topk_select` is ONNX's TopK over the keys with K = min(k, S) computed from the scores' shape
(one export serves any length: below k keys every key is selected), its indices scattered as
ones into zeros; onnxruntime's TopK puts the lower index first among equal scores, as the
numpy reference does. `mask_nohead` and `mask_selected` are the mask row's `allowed_keys` (the
relation by cache index, and the attention mask), the latter anded with the selection.
"""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from graphllm.exporters.onnx.decomposed import allowed_keys
from graphllm.exporters.onnx.lowering import NP_TYPES, Lowering, lowers
from graphllm.ir import Node


def _lowest(c: Lowering) -> str:
    return c.const(np.finfo(NP_TYPES[c.dtype]).min, c.dtype, "lowest")


@lowers("kv_concat_nohead")
def _kv_concat_nohead(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Concat", [i[0], i[1]], n, o, axis=1)  # (B, P+T, d)


@lowers("mask_nohead")
def _mask_nohead(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    ok = c.op("Squeeze", [allowed_keys(c, n.attrs), c.const([1])], n.name)  # (B, T, S)
    c.final("Where", [ok, i[0], _lowest(c)], n, o)


@lowers("mask_selected")
def _mask_selected(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    chosen = c.op("Unsqueeze", [i[1], c.const([1])], n.name)  # (B, 1, T, S)
    ok = c.op("And", [allowed_keys(c, n.attrs), chosen], n.name)
    c.final("Where", [ok, i[0], _lowest(c)], n, o)


@lowers("topk_select")
def _topk_select(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    keys = c.op("Shape", [i[0]], s, start=-1)  # (1,)
    k = c.op("Min", [keys, c.const([int(n.attrs["topk"])], hint="topk")], s)
    _, chosen = c.op("TopK", [i[0], k], s, n_out=2, axis=-1, largest=1, sorted=1)
    zero = numpy_helper.from_array(np.zeros(1, np.float32))
    one = numpy_helper.from_array(np.ones(1, np.float32))
    none = c.op("ConstantOfShape", [c.op("Shape", [i[0]], s)], s, value=zero)
    ones = c.op("ConstantOfShape", [c.op("Shape", [chosen], s)], s, value=one)
    picked = c.op("ScatterElements", [none, chosen, ones], s, axis=-1)
    c.final("Cast", [picked], n, o, to=9)  # BOOL
