"""Decomposed ONNX lowerings of the rows hybrid layers share (graphllm.ops.recurrent).

- `causal_conv1d(_bias)` is one Conv with group = channels on the channels-first sequence: the
  carried K-1 inputs then the new ones (no padding), or the new ones padded with K-1 zeros on the
  left. A native Conv rather than K shifted multiply-adds: one node, and onnxruntime's depthwise
  kernel; the two Transposes around it are the IR's channels-last layout.
- `state_concat` is a Concat on the token axis; `conv_state` pads K-1 zeros in front and slices
  the last K-1 positions (a prompt shorter than K-1 keeps zeros before its first input).
- `zero_padding` multiplies by the attention mask's last T entries (the new tokens).
"""

from __future__ import annotations

from graphllm.exporters.onnx.lowering import INT64_MAX, ONNX_TYPES, Lowering, axis_size, lowers
from graphllm.ir import Node


@lowers("causal_conv1d", "causal_conv1d_bias")
def _causal_conv1d(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, k = n.name, n.attrs["kernel"]
    channels = c.graph.type_of(n.inputs[0]).dims[2].size
    x = c.op("Transpose", [i[0]], s, perm=[0, 2, 1])  # (B, C, S)
    pads = [0, 0] if n.attrs.get("with_state") else [k - 1, 0]
    y = c.op("Conv", [x, *i[1:]], s, group=channels, kernel_shape=[k], pads=pads)  # (B, C, T)
    c.final("Transpose", [y], n, o, perm=[0, 2, 1])  # (B, T, C)


@lowers("state_concat")
def _state_concat(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Concat", [i[0], i[1]], n, o, axis=1)  # (B, K-1 + T, C)


@lowers("conv_state")
def _conv_state(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, w = n.name, axis_size(n, "w")
    padded = c.op("Pad", [i[0], c.const([0, w, 0, 0, 0, 0])], s)  # (B, W + S, C)
    ends = c.const([INT64_MAX])
    c.final("Slice", [padded, c.const([-w]), ends, c.const([1])], n, o)  # (B, W, C)


@lowers("zero_padding")
def _zero_padding(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    t = c.dim(i[0], 1, s)  # (1,) the new tokens
    start = c.op("Neg", [t], s)
    bits = c.op("Slice", [i[1], start, c.const([INT64_MAX]), c.const([1])], s)  # (B, T)
    bits = c.op("Cast", [c.op("Unsqueeze", [bits, c.const([2])], s)], s, to=ONNX_TYPES[c.dtype])
    c.final("Mul", [i[0], bits], n, o)
