"""Graph -> an ONNX model that onnxruntime runs: the decomposed lowering, weights and metadata.

One model serves prefill and decode. Inputs: `input_ids` (batch, sequence_length) int64,
`attention_mask` (batch, total_sequence_length) int64, `position_ids` (batch, sequence_length)
int64, `past_key_values.{i}.key|value` (batch, kv_heads, past_sequence_length, head_dim) (length 0
for a prefill). Outputs: `logits` (batch, sequence_length, vocab) and `present.{i}.key|value`
(batch, kv_heads, total_sequence_length, head_dim). Every batch and length is dynamic.

The lowering mirrors the IR node for node: each op-table row has one lowering here, keyed by the
op's name, that emits standard ONNX ops. The ONNX node that produces an IR node's value carries the
IR node's name (`model.layers.3.self_attn.q_proj`); helper nodes are named `<that name>/<OpType>`,
so Netron shows the model's hierarchy. Weights are initializers named like the checkpoint tensors
(stacked experts with `*`), in one `.onnx` file, or, past protobuf's 2 GB, in a `.onnx.data` file
beside it, written tensor by tensor.

Where the lowering departs from the numpy reference, on purpose:
- `mask` reads the `attention_mask` input as well as the scores: a key is allowed when the causal
  and window relations of the op's attrs allow it (by cache index, queries being the last
  sequence_length of total_sequence_length, as in the IR) *and* its mask bit is 1 (left padding).
  Disallowed scores become the dtype's lowest finite value rather than -inf, so the softmax of a
  padding query (no allowed key) is finite and 0 * its values cannot turn into NaN downstream;
  rows with an allowed key get exactly 0 probability on the others either way.
- `moe_dispatch`/`moe_combine` route for real (TopK ids -> slots by a running count per expert ->
  ScatterND into per-expert rows, GatherND back), with room for every token in every expert, as
  the numpy reference does.
- The KV cache is the plain concatenation of past and new keys: a sliding-window layer keeps every
  key in `present` and masks the old ones (transformers' sliding caches drop them; the logits agree
  because the window is relative to the query).
- In fp16, norms and softmaxes compute in fp32 and cast back, as transformers does.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from graphllm.builder import build_graph
from graphllm.errors import ConfigError, GraphllmError, WeightsError
from graphllm.files import write_atomic
from graphllm.ir import Dim, Graph, Node, Ref, TensorType
from graphllm.model_config import ModelConfig, RopeConfig
from graphllm.weights import SafetensorsFolder
from graphllm.workload import Workload

OPSET = 23
EXPORT_DTYPES = ("fp32", "fp16")
# the IR's symbolic dims -> ONNX dim names (onnxruntime-genai's spelling)
DIM_NAMES = {
    "B": "batch",
    "T": "sequence_length",
    "P": "past_sequence_length",
    "S": "total_sequence_length",
    "C": "expert_slots",
}
ONNX_TYPES = {"fp32": TensorProto.FLOAT, "fp16": TensorProto.FLOAT16, "int64": TensorProto.INT64}
NP_TYPES = {"fp32": np.float32, "fp16": np.float16, "int64": np.int64}
# protobuf cannot serialise a message of 2 GiB; leave room for the graph itself
PROTO_LIMIT = 2**31 - 2**26
ALIGN = 4096  # external tensors start on page boundaries, so onnxruntime can map them
_CHUNK = 1 << 22  # random weights are drawn this many values at a time
_INT64_MAX = np.iinfo(np.int64).max


# -- what a lowering produces besides nodes --------------------------------------------------
@dataclass(frozen=True)
class Initializer:
    """A weight of the exported model: a checkpoint tensor as it is (`make` None), or one made
    from some (transposed, packed, offset)."""

    name: str
    sources: tuple[str, ...]  # param names, at least one
    shape: tuple[int, ...]
    make: Callable[..., np.ndarray] | None = None


@dataclass(frozen=True)
class Region:
    """IR nodes that one fused lowering replaces together, in any order; the region is emitted
    where its last node in graph order is. Only `outputs` may be read outside the region."""

    nodes: tuple[str, ...]
    outputs: tuple[Ref, ...]
    emit: Callable[[Lowering, dict[Ref, str]], None]


class LoweringError(GraphllmError):
    """A model that an op set cannot express (said in one line)."""


# -- the lowering context -------------------------------------------------------------------
class Lowering:
    """ONNX nodes and constants for one Graph; what each op lowering writes into."""

    def __init__(self, graph: Graph, dtype: str) -> None:
        self.graph = graph
        self.dtype = dtype  # activations and KV cache
        self.nodes: list[onnx.NodeProto] = []
        self.constants: list[TensorProto] = []
        self._const_names: dict[tuple, str] = {}
        self._node_names: set[str] = set()
        self._shared: dict[Any, Any] = {}
        self.initializers: dict[str, Initializer] = {}  # weights made from params, or computed

    # emitting
    def _unique(self, name: str) -> str:
        out, i = name, 1
        while out in self._node_names:
            i += 1
            out = f"{name}_{i}"
        self._node_names.add(out)
        return out

    def op(self, op_type: str, inputs: list[str], scope: str, n_out: int = 1, **attrs: Any) -> Any:
        """A helper node `<scope>/<op_type>`; returns its output name (or names, n_out > 1)."""
        name = self._unique(f"{scope}/{op_type}")
        outs = [name if i == 0 else f"{name}:{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **attrs))
        return outs[0] if n_out == 1 else outs

    def final(self, op_type: str, inputs: list[str], node: Node, outs: list[str], **attrs) -> None:
        """The node that produces the IR node's value(s): it carries the IR node's name."""
        self.nodes.append(
            helper.make_node(op_type, inputs, outs, name=self._unique(node.name), **attrs)
        )

    def named(self, op_type: str, inputs: list[str], outs: list[str], name: str, **attrs) -> None:
        """A node that a fused region emits, named after the region's scope."""
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=self._unique(name), **attrs))

    def const(self, value: Any, dtype: str = "int64", hint: str = "const") -> str:
        """A small constant initializer, shared between all users of the same value."""
        arr = np.asarray(value, dtype=NP_TYPES.get(dtype, dtype))
        key = (arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self._const_names:
            name = f"const.{hint}.{len(self._const_names)}"
            self.constants.append(numpy_helper.from_array(arr, name))
            self._const_names[key] = name
        return self._const_names[key]

    def cast(self, x: str, src: str, dst: str, scope: str) -> str:
        return x if src == dst else self.op("Cast", [x], scope, to=ONNX_TYPES[dst])

    def shared(self, key: Any, make: Callable[[], Any]) -> Any:
        """Values several nodes use (rotary tables, masks, MoE slots) are computed once."""
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    def dim(self, tensor: str, axis: int, scope: str) -> str:
        """Size of one axis of a tensor, as a 1-element int64 vector."""
        return self.shared(
            ("dim", tensor, axis),
            lambda: self.op("Shape", [tensor], scope, start=axis, end=axis + 1),
        )

    def scalar(self, vec: str, scope: str) -> str:
        return self.shared(("scalar", vec), lambda: self.op("Squeeze", [vec], scope))

    # weights the lowering stores otherwise than the checkpoint does
    def initializer(
        self,
        name: str,
        sources: tuple[str, ...],
        shape: tuple[int, ...],
        make: Callable[..., np.ndarray],
    ) -> str:
        """A weight initializer made by `make` from the named params."""
        if name not in self.initializers:
            self.initializers[name] = Initializer(name, sources, tuple(shape), make)
        return name

    def param_shape(self, param: str) -> tuple[int, ...]:
        return _shape(self.graph[param])

    def transposed(self, param: str) -> str:
        """A weight (out, in), or stacked experts (E, out, in), stored as (in, out)."""
        shape = self.param_shape(param)
        perm = (*range(len(shape) - 2), len(shape) - 1, len(shape) - 2)
        t_shape = tuple(shape[i] for i in perm)
        return self.initializer(f"{param}.T", (param,), t_shape, lambda w: w.transpose(perm))


Lower = Callable[[Lowering, Node, list[str], list[str]], None]
DECOMPOSED: dict[str, Lower] = {}


def lowers(*ops: str) -> Callable[[Lower], Lower]:
    """Register a function as the decomposed lowering of the named op-table rows."""

    def deco(fn: Lower) -> Lower:
        for op in ops:
            DECOMPOSED[op] = fn
        return fn

    return deco


def _size(node: Node, letter: str) -> int:
    return int(node.attrs["axes"][letter].size)


# -- one lowering per op row -----------------------------------------------------------------
@lowers("embedding")
def _embedding(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Gather", [i[1], i[0]], n, o, axis=0)  # (B, T, d): row of each token id


@lowers("linear", "linear_bias")
def _linear(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    wt = c.op("Transpose", [i[1]], n.name, perm=[1, 0])  # (in, out)
    if n.op == "linear":
        c.final("MatMul", [i[0], wt], n, o)
        return
    c.final("Add", [c.op("MatMul", [i[0], wt], n.name), i[2]], n, o)


@lowers("expert_linear")
def _expert_linear(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    wt = c.op("Transpose", [i[1]], n.name, perm=[0, 2, 1])  # (E, in, out)
    c.final("MatMul", [i[0], wt], n, o)  # (E, slots, out)


@lowers("rmsnorm")
def _rmsnorm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    x = c.cast(i[0], c.dtype, "fp32", s)
    var = c.op("ReduceMean", [c.op("Mul", [x, x], s), c.const([-1])], s, keepdims=1)
    den = c.op("Sqrt", [c.op("Add", [var, c.const(n.attrs["eps"], "fp32", "eps")], s)], s)
    w = c.cast(i[1], c.dtype, "fp32", s)
    if n.attrs.get("weight_offset", 0.0):
        w = c.op("Add", [w, c.const(n.attrs["weight_offset"], "fp32", "offset")], s)
    y = c.op("Div", [x, den], s)
    if c.dtype == "fp32":
        c.final("Mul", [y, w], n, o)
    else:
        c.final("Cast", [c.op("Mul", [y, w], s)], n, o, to=ONNX_TYPES[c.dtype])


@lowers("split", "split3")
def _split(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Split", [i[0], c.const(list(n.attrs["sizes"]))], n, o, axis=-1)


@lowers("split_heads")
def _split_heads(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    shape = c.const([0, 0, _size(n, "h"), _size(n, "e")])
    x = c.op("Reshape", [i[0], shape], n.name)  # (B, T, heads, hd)
    c.final("Transpose", [x], n, o, perm=[0, 2, 1, 3])  # (B, heads, T, hd)


@lowers("merge_heads")
def _merge_heads(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    x = c.op("Transpose", [i[0]], n.name, perm=[0, 2, 1, 3])  # (B, T, heads, hd)
    c.final("Reshape", [x, c.const([0, 0, _size(n, "(h e)")])], n, o)  # (B, T, heads*hd)


@lowers("last_position")
def _last_position(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Slice", [i[0], c.const([-1]), c.const([_INT64_MAX]), c.const([1])], n, o)


def rotary_tables(
    c: Lowering, pos: str, n: Node, full: bool = True, head_axis: bool = True
) -> tuple[str, str]:
    """cos and sin of the position ids' angles, built once per distinct frequency set and form.

    Each angle is position x inv_freq (scaled by the node's attention_scaling): (B, T, hd/2), or
    with `full` repeated to (B, T, hd) as rotate-half RoPE reads it, and with `head_axis` given a
    head axis, (B, 1, T, ·), to broadcast over the heads."""
    inv = np.asarray(n.attrs["inv_freq"], dtype=np.float32)
    scale = float(n.attrs.get("attention_scaling", 1.0))

    def make() -> tuple[str, str]:
        s = "model.rotary_emb"
        p = c.op("Unsqueeze", [c.op("Cast", [pos], s, to=TensorProto.FLOAT), c.const([-1])], s)
        angles = c.op("Mul", [p, c.const(inv, "fp32", "inv_freq")], s)  # (B, T, hd/2)
        if full:
            angles = c.op("Concat", [angles, angles], s, axis=-1)  # (B, T, hd)
        if head_axis:
            angles = c.op("Unsqueeze", [angles, c.const([1])], s)  # (B, 1, T, ·)
        out = []
        for fn in ("Cos", "Sin"):
            t = c.op(fn, [angles], s)
            if scale != 1.0:
                t = c.op("Mul", [t, c.const(scale, "fp32", "attention_scaling")], s)
            out.append(c.cast(t, "fp32", c.dtype, s))
        return out[0], out[1]

    return c.shared(("rope", pos, inv.tobytes(), scale, full, head_axis), make)


@lowers("rope")
def _rope(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    cos, sin = rotary_tables(c, i[1], n)
    s = n.name
    x1, x2 = c.op("Split", [i[0]], s, n_out=2, axis=-1, num_outputs=2)
    rotated = c.op("Concat", [c.op("Neg", [x2], s), x1], s, axis=-1)  # (-x2, x1)
    c.final("Add", [c.op("Mul", [i[0], cos], s), c.op("Mul", [rotated, sin], s)], n, o)


@lowers("kv_concat")
def _kv_concat(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Concat", [i[0], i[1]], n, o, axis=2)  # (B, kv_heads, P+T, hd)


@lowers("repeat_kv")
def _repeat_kv(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    src = c.graph.type_of(n.inputs[0]).dims
    g, e, h = int(src[1].size), int(src[3].size), _size(n, "h")  # type: ignore[arg-type]
    x = c.op("Unsqueeze", [i[0], c.const([2])], n.name)  # (B, g, 1, S, hd)
    x = c.op("Expand", [x, c.const([1, 1, h // g, 1, 1])], n.name)  # (B, g, h/g, S, hd)
    c.final("Reshape", [x, c.const([0, h, -1, e])], n, o)  # (B, h, S, hd)


@lowers("scores")
def _scores(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    kt = c.op("Transpose", [i[1]], n.name, perm=[0, 1, 3, 2])  # (B, h, hd, S)
    c.final("MatMul", [i[0], kt], n, o)  # (B, h, T, S)


@lowers("pv")
def _pv(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("MatMul", [i[0], i[1]], n, o)  # (B, h, T, hd)


@lowers("mul_const")
def _mul_const(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Mul", [i[0], c.const(n.attrs["value"], c.dtype, "scale")], n, o)


def _allowed(c: Lowering, attrs: dict[str, Any]) -> str:
    """(B, 1, T, S) bool: causal / window relation by cache index, and the attention mask."""
    causal, window = attrs.get("causal", True), attrs.get("window")

    def make() -> str:
        s = "model.attention_mask"
        n_key = c.scalar(c.dim("attention_mask", 1, s), s)  # S
        n_new = c.scalar(c.dim("input_ids", 1, s), s)  # T
        one = c.const(1, hint="one")
        k = c.op("Range", [c.const(0, hint="zero"), n_key, one], s)  # (S,) key index
        q = c.op("Range", [c.op("Sub", [n_key, n_new], s), n_key, one], s)  # (T,) query index
        q = c.op("Unsqueeze", [q, c.const([1])], s)  # (T, 1)
        ok = c.op("Cast", [c.op("Unsqueeze", ["attention_mask", c.const([1, 2])], s)], s, to=9)
        if causal:
            ok = c.op("And", [ok, c.op("LessOrEqual", [k, q], s)], s)
        if window:
            lo = c.op("Sub", [q, c.const(window, hint="window")], s)
            ok = c.op("And", [ok, c.op("Greater", [k, lo], s)], s)
        return ok  # (B, 1, 1, S) & (T, S) -> (B, 1, T, S)

    return c.shared(("mask", causal, window), make)


@lowers("mask")
def _mask(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    lowest = c.const(np.finfo(NP_TYPES[c.dtype]).min, c.dtype, "lowest")
    c.final("Where", [_allowed(c, n.attrs), i[0], lowest], n, o)


@lowers("softmax")
def _softmax(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    if c.dtype == "fp32":
        c.final("Softmax", [i[0]], n, o, axis=-1)
        return
    y = c.op("Softmax", [c.cast(i[0], c.dtype, "fp32", n.name)], n.name, axis=-1)
    c.final("Cast", [y], n, o, to=ONNX_TYPES[c.dtype])


@lowers("silu")
def _silu(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Mul", [i[0], c.op("Sigmoid", [i[0]], n.name)], n, o)


@lowers("gelu_tanh")
def _gelu_tanh(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Gelu", [i[0]], n, o, approximate="tanh")


@lowers("sigmoid")
def _sigmoid(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Sigmoid", [i[0]], n, o)


@lowers("mul", "gate_mul")
def _mul(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Mul", [i[0], i[1]], n, o)


@lowers("add")
def _add(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Add", [i[0], i[1]], n, o)


@lowers("topk")
def _topk(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("TopK", [i[0], c.const([n.attrs["k"]])], n, o, axis=-1, largest=1, sorted=1)


@lowers("normalize")
def _normalize(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    total = c.op("ReduceSum", [i[0], c.const([-1])], n.name, keepdims=1)
    c.final("Div", [i[0], total], n, o)


def _expert_slots(c: Lowering, chosen: str, n_experts: int, scope: str) -> str:
    """(N, 2) [expert, slot] of each (token, choice) pair, pairs in (b, t, k) order: a token's
    slot in an expert counts the pairs before it that chose that expert."""

    def make() -> str:
        s = scope
        flat = c.op("Reshape", [chosen, c.const([-1, 1])], s)  # (N, 1) expert ids
        onehot = c.op("Equal", [flat, c.const(np.arange(n_experts), hint="experts")], s)
        count = c.op("CumSum", [c.op("Cast", [onehot], s, to=7), c.const(0)], s)  # (N, E)
        mine = c.op("GatherElements", [count, flat], s, axis=1)  # (N, 1): inclusive count
        slot = c.op("Sub", [mine, c.const(1, hint="one")], s)
        return c.op("Concat", [flat, slot], s, axis=1)  # (N, 2)

    return c.shared(("slots", chosen), make)


@lowers("moe_dispatch")
def _moe_dispatch(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, x, chosen = n.name, i[0], i[1]
    n_exp, k = _size(n, "x"), int(c.graph.type_of(n.inputs[1]).dims[-1].size)  # type: ignore[arg-type]
    d = int(c.graph.type_of(n.inputs[0]).dims[-1].size)  # type: ignore[arg-type]
    where = _expert_slots(c, chosen, n_exp, s)  # (N, 2)
    rows = c.op("Reshape", [x, c.const([-1, d])], s)  # (B*T, d)
    n_pairs = c.scalar(c.dim(where, 0, s), s)
    pair = c.op("Range", [c.const(0, hint="zero"), n_pairs, c.const(1, hint="one")], s)
    token = c.op("Div", [pair, c.const(k, hint="k")], s)  # (N,) each pair's token
    picked = c.op("Gather", [rows, token], s, axis=0)  # (N, d)
    shape = c.op("Concat", [c.const([n_exp]), c.dim(rows, 0, s), c.const([d])], s, axis=0)
    zero = numpy_helper.from_array(np.zeros(1, NP_TYPES[c.dtype]))
    empty = c.op("ConstantOfShape", [shape], s, value=zero)  # (E, B*T, d): room for all
    c.final("ScatterND", [empty, where, picked], n, o)


@lowers("moe_combine")
def _moe_combine(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, y, w, chosen = n.name, i[0], i[1], i[2]
    n_exp, d = (int(x.size) for x in c.graph.type_of(n.inputs[0]).dims[::2])  # type: ignore[arg-type]
    where = _expert_slots(c, chosen, n_exp, s)
    picked = c.op("GatherND", [y, where], s)  # (N, d)
    shape = c.op("Concat", [c.op("Shape", [w], s), c.const([d])], s, axis=0)
    picked = c.op("Reshape", [picked, shape], s)  # (B, T, k, d)
    weighted = c.op("Mul", [picked, c.op("Unsqueeze", [w, c.const([-1])], s)], s)
    c.final("ReduceSum", [weighted, c.const([2])], n, o, keepdims=0)  # (B, T, d)


@dataclass(frozen=True)
class OpSet:
    """One ONNX lowering: a lowering per op row (the decomposed one where it has none) and the
    fused regions it finds first; `regions` raises LoweringError for a model it cannot express."""

    name: str
    rows: dict[str, Lower]
    regions: Callable[[Graph], list[Region]] = lambda graph: []
    domains: tuple[tuple[str, int], ...] = (("", OPSET),)

    def row(self, op: str) -> Lower | None:
        return self.rows.get(op, DECOMPOSED.get(op))


LOWERINGS: dict[str, OpSet] = {"decomposed": OpSet("decomposed", DECOMPOSED)}


# -- graph -> ModelProto ---------------------------------------------------------------------
def export_graph(
    config: ModelConfig,
    dtype: str = "fp32",
    logits: str = "all",
    mla: str = "naive",
    mtp: bool = False,
) -> Graph:
    """The graph an export lowers: past K/V inputs present (the lengths are symbolic anyway).
    `mla` and `mtp` as in build_graph (DeepSeek's attention form and multi-token prediction)."""
    wl = Workload(batch=1, seq_len=1, past_len=1, dtype=dtype, logits=logits)
    return build_graph(config, wl, mla=mla, mtp=mtp)


def _onnx_dims(t: TensorType) -> list[int | str]:
    return [int(d.size) if d.size is not None else DIM_NAMES.get(d.name, d.name) for d in t.dims]


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, ONNX_TYPES[t.dtype], _onnx_dims(t))


def _shape(node: Node) -> tuple[int, ...]:
    return tuple(int(d.size) for d in node.out.dims)  # type: ignore[arg-type]


def lower(
    graph: Graph, ops: str = "decomposed", weights_as_inputs: bool = False
) -> tuple[onnx.ModelProto, list[Initializer]]:
    """The graph as a ModelProto without weight data, and the weight initializers it reads
    (graph inputs with `weights_as_inputs`), in the order the params are read."""
    opset = LOWERINGS[ops]
    dtype = graph.meta.get("act_dtype", "fp32")
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"ONNX export runs in {' or '.join(EXPORT_DTYPES)}, not {dtype}")
    out_of: dict[Ref, str] = {ref: name for name, ref in graph.outputs.items()}
    names: dict[Ref, str] = {}
    for n in graph.nodes():
        for k in range(len(n.outputs)):
            ref = Ref(n.name, k)
            names[ref] = out_of.get(ref, n.name if k == 0 else f"{n.name}:{k}")
    try:
        regions = _placed(graph, opset.regions(graph))
    except LoweringError as e:
        raise LoweringError(f"the {ops} lowering cannot express {graph.name}: {e}") from None
    c = Lowering(graph, dtype)
    inputs, value_info = [], []
    for n in graph.nodes():
        if n.op == "input":
            odd = [d.name for d in n.out.dims if d.size is None and d.name not in DIM_NAMES]
            if odd:  # e.g. a rolled window cache (P_w): build the graph with export_graph
                raise GraphllmError(f"{n.name}: dims {', '.join(odd)} are not ONNX I/O dims")
            inputs.append(_value_info(n.name, n.out))
            if n.name == "input_ids":
                mask = TensorType((n.out.dims[0], Dim("S", "key_token")), "int64")
                inputs.append(_value_info("attention_mask", mask))
            continue
        if n.op == "param":
            continue
        if n.name in regions:
            region = regions[n.name]
            if region is not None:  # the region's last node: emit it here
                region.emit(c, names)
            continue
        lower_fn = opset.row(n.op)
        if lower_fn is None:
            raise GraphllmError(f"{n.name}: op {n.op!r} has no {ops} ONNX lowering")
        outs = [names[Ref(n.name, k)] for k in range(len(n.outputs))]
        lower_fn(c, n, [names[r] for r in n.inputs], outs)
        value_info += [
            _value_info(name, t) for name, t in zip(outs, n.outputs) if name not in graph.outputs
        ]
    plan = _plan(graph, c)
    if weights_as_inputs:
        for init in plan:
            shape = list(init.shape)
            inputs.append(helper.make_tensor_value_info(init.name, ONNX_TYPES[dtype], shape))
    order = ["logits", *(k for k in graph.outputs if k != "logits")]
    outputs = [_value_info(k, graph.type_of(graph.outputs[k])) for k in order]
    g = helper.make_graph(
        c.nodes, graph.name, inputs, outputs, initializer=c.constants, value_info=value_info
    )
    model = helper.make_model(
        g,
        opset_imports=[helper.make_opsetid(d, v) for d, v in opset.domains],
        producer_name="graphllm",
        producer_version=_version(),
        doc_string=__doc__.split("\n\n")[1],  # the I/O paragraph of this module's docstring
    )
    model.ir_version = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    return model, plan


def _placed(graph: Graph, regions: list[Region]) -> dict[str, Region | None]:
    """Node name -> its region where that is its last node, None for its other nodes; checks
    that nothing outside a region reads a value it keeps to itself, or reads an output of the
    region before the region is emitted."""
    at = {n.name: i for i, n in enumerate(graph.nodes())}
    out: dict[str, Region | None] = {}
    for r in regions:
        inside = set(r.nodes)
        last_node = max(r.nodes, key=at.__getitem__)
        last = at[last_node]
        for name in r.nodes:
            if name in out:
                raise GraphllmError(f"{name}: in two fused regions")
            for user in graph.users(name):
                if user.name in inside:
                    continue
                read = [ref for ref in user.inputs if ref.node == name]
                if any(ref not in r.outputs for ref in read) or at[user.name] < last:
                    raise LoweringError(f"{user.name} reads {name}, inside a fused region")
            out[name] = None
        out[last_node] = r
    return out


def _plan(graph: Graph, c: Lowering) -> list[Initializer]:
    """Every initializer the nodes read: made ones, then params read as they are, in graph
    order (the order weights are read in, so a made one waits for few sources)."""
    read = {i for node in c.nodes for i in node.input}
    plan = [init for init in c.initializers.values() if init.name in read]
    plan += [
        Initializer(p.name, (p.name,), _shape(p))
        for p in graph.params()
        if p.name in read and p.name not in c.initializers
    ]
    at = {p.name: i for i, p in enumerate(graph.params())}
    return sorted(plan, key=lambda init: max((at[s] for s in init.sources), default=-1))


def _version() -> str:
    from graphllm import __version__

    return __version__


# -- metadata ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportedModel:
    """What a `.onnx` file written by graphllm says about itself (its metadata_props)."""

    config: ModelConfig
    workload: Workload
    lowering: str
    weights: str
    build: dict[str, Any] = field(default_factory=dict)  # build_graph's mla= and mtp=


def _metadata(config: ModelConfig, wl: Workload, ops: str, weights: str) -> dict[str, str]:
    return {
        "graphllm.version": _version(),
        "graphllm.lowering": ops,
        "graphllm.config": json.dumps(asdict(config)),
        "graphllm.workload": json.dumps(asdict(wl)),
        "graphllm.weights": weights,
    }


def _config_from_json(d: dict[str, Any]) -> ModelConfig:
    d = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    return ModelConfig(**(d | {"rope": RopeConfig(**d["rope"])}))


def read_metadata(path: str | Path) -> ExportedModel:
    """The config, workload defaults, lowering and weights note of a graphllm `.onnx` file."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # protobuf's DecodeError, OSError, ...
        raise GraphllmError(f"{path}: not a readable ONNX model ({e})") from None
    return metadata_from_props({p.key: p.value for p in model.metadata_props}, path)


def metadata_from_props(props: dict[str, str], path: str | Path) -> ExportedModel:
    """`read_metadata` from the properties themselves (as an onnxruntime session holds them,
    without reading the file again)."""
    if "graphllm.config" not in props:
        raise GraphllmError(f"{path}: no graphllm metadata (was it exported by graphllm?)")
    try:
        config = _config_from_json(json.loads(props["graphllm.config"]))
        workload = Workload(**json.loads(props["graphllm.workload"]))
        build = json.loads(props.get("graphllm.graph", "{}"))
        lowering, weights = props["graphllm.lowering"], props["graphllm.weights"]
    except (ValueError, TypeError, KeyError) as e:
        raise GraphllmError(f"{path}: unreadable graphllm metadata ({e})") from None
    return ExportedModel(config, workload, lowering, weights, build)


# -- weights ----------------------------------------------------------------------------------
def random_tensors(graph: Graph, seed: int, dtype: str, scale: float = 0.02) -> Iterator[tuple]:
    """(param node, array) one at a time: the values of `weights.random_weights(graph, seed)`,
    drawn a chunk at a time straight into the target dtype (no float64 copy of a whole tensor)."""
    rng = np.random.default_rng(seed)
    offset = graph.meta["config"].norm_weight_offset if "config" in graph.meta else 0.0
    for n in graph.params():
        shape = _shape(n)
        out = np.empty(shape, NP_TYPES[dtype])
        flat = out.reshape(-1)
        norm = len(shape) == 1 and n.attrs["kind"] == "norms"
        for start in range(0, flat.size, _CHUNK):
            z = rng.standard_normal(min(_CHUNK, flat.size - start))
            v = (1.0 - offset) + 0.1 * z if norm else scale * z
            flat[start : start + z.size] = v.astype(np.float32)
        yield n, out


def checkpoint_tensors(graph: Graph, folder: str | Path, dtype: str) -> Iterator[tuple]:
    """(param node, array) one at a time, read from a safetensors folder by the graph's names."""
    ckpt = SafetensorsFolder(folder)
    for n in graph.params():  # every name first: a missing tensor fails before any is read
        for name in _checkpoint_names(n):
            if name not in ckpt:
                raise WeightsError(f"checkpoint {ckpt.folder} has no tensor {name}")
    for n in graph.params():
        shape = _shape(n)
        out = np.empty(shape, NP_TYPES[dtype])
        names = _checkpoint_names(n)
        want = shape[1:] if n.attrs.get("stacked") == "expert" else shape
        for e, name in enumerate(names):
            arr = ckpt.read(name)
            if arr.shape != want:
                raise WeightsError(f"{name}: checkpoint shape {arr.shape}, graph expects {want}")
            if n.attrs.get("stacked") == "expert":
                out[e] = arr
            else:
                out[...] = arr
            del arr
        yield n, out


def _checkpoint_names(n: Node) -> list[str]:
    if n.attrs.get("stacked") == "expert":
        return [n.name.replace("*", str(e)) for e in range(int(n.out.dims[0].size))]  # type: ignore[arg-type]
    return [n.name]


# -- writing ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExportResult:
    """What `export_onnx` wrote."""

    path: Path
    data_path: Path | None  # the external data file, when there is one
    nodes: int  # ONNX nodes
    params: int  # weight values
    weight_bytes: int  # bytes of the initializers written (weights as the lowering stores them)
    weights: str  # where the weights came from
    lowering: str = "decomposed"  # the op set written


def export_onnx(
    config: ModelConfig,
    path: str | Path,
    *,
    dtype: str = "fp32",
    workload: Workload | None = None,
    weights: str | Path | None = None,
    seed: int = 0,
    no_weights: bool = False,
    external_data: bool | None = None,
    check: bool = True,
    ops: str = "auto",
    device: str = "cpu",
    mla: str = "naive",
    mtp: bool = False,
) -> ExportResult:
    """Write `config` as an ONNX model: weights from a checkpoint folder, seeded random ones, or
    (`no_weights`) none at all, the weights then being graph inputs.

    `ops` is the lowering (`decomposed`, `standard`, `ort`), or `auto`: the default for `device`
    and the model's family (`DEFAULT_LOWERINGS`). `workload` is recorded as the model's defaults
    for later analysis (its dtype is `dtype`). `external_data` None chooses by size: past
    protobuf's 2 GB limit the weights go to `<path>.data`. The file (and its data file) is
    written whole or not at all; with `check`, `onnx.checker.check_model(full_check=True)` runs
    on it before it is moved into place. `mla` and `mtp` pick DeepSeek's attention form and
    add its multi-token-prediction modules (inputs `mtp.{k}.input_ids`, outputs `mtp.{k}.logits`
    and their block's cache), as build_graph does.
    """
    if dtype not in EXPORT_DTYPES:
        raise ConfigError(f"ONNX export runs in {' or '.join(EXPORT_DTYPES)}, not {dtype}")
    if no_weights and weights is not None:
        raise ConfigError("give a weights folder or no_weights, not both")
    wl = Workload.with_dtype(workload, dtype=dtype)
    graph = export_graph(config, dtype, wl.logits, mla, mtp)
    if ops == "auto":
        ops = default_lowering(config, device, dtype, graph)
    elif ops not in LOWERINGS:
        raise ConfigError(f"unknown ONNX op set {ops!r}; known: auto, {', '.join(LOWERINGS)}")
    model, plan = lower(graph, ops, weights_as_inputs=no_weights)
    if no_weights:
        source = "none: the weights are graph inputs"
    elif weights is not None:
        source = f"checkpoint {Path(weights).resolve().name}"
    else:
        source = f"random, seed {seed}"
    for k, v in _metadata(config, wl, ops, source).items():
        model.metadata_props.add(key=k, value=v)
    if config.is_mla:  # how the graph was built, beside the config it was built from
        model.metadata_props.add(key="graphllm.graph", value=json.dumps({"mla": mla, "mtp": mtp}))
    numel = sum(int(np.prod(_shape(n))) for n in graph.params())
    written = [] if no_weights else plan
    itemsize = np.dtype(NP_TYPES[dtype]).itemsize
    nbytes = sum(int(np.prod(init.shape)) for init in written) * itemsize
    if no_weights:
        params: Iterator[tuple] = iter(())
    elif weights is not None:
        params = checkpoint_tensors(graph, weights, dtype)
    else:
        params = random_tensors(graph, seed, dtype)
    tensors = planned(written, params, dtype)
    external = nbytes > PROTO_LIMIT if external_data is None else external_data
    path = Path(path)
    data_path = path.with_name(path.name + ".data") if external and written else None

    def write(tmp: Path) -> None:
        if data_path is None:
            for name, arr in tensors:
                model.graph.initializer.append(numpy_helper.from_array(arr, name))
            onnx.save_model(model, tmp)
            model.graph.ClearField("initializer")  # free the weights before the check reads them
            if check:
                _check(tmp)
            return
        _write_external(model, tmp, data_path, tensors, nbytes, check)

    write_atomic(path, write)
    return ExportResult(path, data_path, len(model.graph.node), numel, nbytes, source, ops)


def planned(plan: list[Initializer], params: Iterator[tuple], dtype: str) -> Iterator[tuple]:
    """(name, array) of each initializer in `plan`, from (param node, array) read one at a time,
    each as soon as its sources have been read. A param is held only until the last initializer
    made from it is written."""
    want = NP_TYPES[dtype]
    left: dict[str, int] = {}
    for init in plan:
        for src in init.sources:
            left[src] = left.get(src, 0) + 1
    pending = list(plan)
    held: dict[str, np.ndarray] = {}
    for node, arr in params:
        if not left.get(node.name):
            continue
        held[node.name] = arr
        ready = [init for init in pending if all(s in held for s in init.sources)]
        for init in ready:
            pending.remove(init)
            args = [held[s] for s in init.sources]
            out = np.ascontiguousarray(args[0] if init.make is None else init.make(*args), want)
            del args
            for src in init.sources:  # free the sources before the copy is written
                left[src] -= 1
                if not left[src]:
                    del held[src]
            yield init.name, out
            del out
    if pending:  # a source the graph does not hold: a bug in a lowering
        raise GraphllmError(f"initializer {pending[0].name}: sources {pending[0].sources} not read")


def _write_external(
    model: onnx.ModelProto,
    tmp: Path,
    data_path: Path,
    tensors: Iterator[tuple],
    nbytes: int,
    check: bool,
) -> None:
    """Weights to `data_path` one tensor at a time (page-aligned), the graph to `tmp`."""
    free = shutil.disk_usage(data_path.parent).free
    if free < nbytes:
        raise GraphllmError(
            f"{data_path.parent} has {free / 1e9:.1f} GB free; the weights need {nbytes / 1e9:.1f} GB"
        )
    fd, data_tmp = tempfile.mkstemp(prefix=f".{data_path.name}.", dir=data_path.parent)
    _readable(Path(data_tmp))
    placed = False
    try:
        with os.fdopen(fd, "wb") as f:
            for name, arr in tensors:
                f.write(b"\0" * (-f.tell() % ALIGN))
                offset = f.tell()
                f.write(memoryview(np.ascontiguousarray(arr)).cast("B"))
                t = TensorProto(name=name, dims=arr.shape, data_type=_dtype_of(arr))
                t.data_location = TensorProto.EXTERNAL
                for k, v in (
                    ("location", data_path.name),
                    ("offset", offset),
                    ("length", arr.nbytes),
                ):
                    t.external_data.add(key=k, value=str(v))
                model.graph.initializer.append(t)
                del arr
        os.replace(data_tmp, data_path)
        placed = True
        onnx.save_model(model, tmp)
        if check:
            _check(tmp)
    except BaseException:
        Path(data_tmp).unlink(missing_ok=True)
        if placed:
            data_path.unlink(missing_ok=True)
        raise


def _readable(path: Path) -> None:
    """The permissions of a new file (temporary files are created private)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def _dtype_of(arr: np.ndarray) -> int:
    return {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16}[
        arr.dtype
    ]


def _check(path: Path) -> None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphllmError(f"the exported model fails onnx.checker: {first}") from e


# the standard and ort lowerings register themselves in LOWERINGS
from graphllm.exporters import onnx_fused  # noqa: E402


def default_lowering(
    config: ModelConfig, device: str = "cpu", dtype: str = "fp32", graph: Graph | None = None
) -> str:
    """The fastest exact lowering of `config` on `device` (onnx_fused.DEFAULT_LOWERINGS)."""
    return onnx_fused.default_lowering(config, device, dtype, graph)


from graphllm.exporters import onnx_mla  # noqa: E402,F401  (registers DeepSeek's lowerings)
