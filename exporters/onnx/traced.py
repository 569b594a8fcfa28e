"""The decomposed ONNX lowering of the generic rows a traced model is made of (graphllm.ops.generic).

One function per aten op kind, keyed by the kind (a generic row's name is `aten.<kind>[<sig>]`).
Sizes stay symbolic: a size the trace fitted to the workload (B x (c + t*T + p*P),
graphllm.trace.symbolic) is computed in the model from its inputs' shapes (B and T from
input_ids, P from a past cache input), so one export runs prefill and decode at any length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from onnx import TensorProto, helper

from graphllm.errors import GraphllmError
from graphllm.exporters.onnx.lowering import FALLBACKS, ONNX_TYPES, Lowering, lowers
from graphllm.ir import Node
from graphllm.ops import OPS, SOURCE
from graphllm.ops.generic import PREFIX, optional_inputs
from graphllm.trace.symbolic import Expr

INT64_MAX = 2**63 - 1
Lower = Callable[[Lowering, Node, list[str], list[str]], None]
GENERIC: dict[str, Lower] = {}


def generic_lowering(op: str) -> Lower | None:
    """The lowering of a generic row `op`, by its aten kind; None for any other row."""
    if not op.startswith(PREFIX):
        return None
    return GENERIC.get(op[len(PREFIX) :].split("[", 1)[0])


def _kinds(*kinds: str) -> Callable[[Lower], Lower]:
    def deco(fn: Lower) -> Lower:
        for k in kinds:
            GENERIC[k] = fn
        return fn

    return deco


# -- sizes -----------------------------------------------------------------------------------
def size(c: Lowering, x: Any, scope: str) -> str:
    """A size (an int, or an Expr of the workload) as a 1-element int64 vector."""
    if not isinstance(x, Expr):
        return c.const([int(x)])
    return c.shared(("expr", x), lambda: _expr(c, x, scope))


def _expr(c: Lowering, e: Expr, scope: str) -> str:
    terms = [c.const([e.c])] if e.c else []
    for coef, name in ((e.t, "T"), (e.p, "P")):
        if coef:
            v = _workload_size(c, name, scope)
            terms.append(v if coef == 1 else c.op("Mul", [v, c.const([coef])], scope))
    out = terms[0] if terms else c.const([0])
    for t in terms[1:]:
        out = c.op("Add", [out, t], scope)
    if e.b:
        out = c.op("Mul", [out, _workload_size(c, "B", scope)], scope)
    return out


def _workload_size(c: Lowering, name: str, scope: str) -> str:
    """B, T or P from the first graph input that has that dim."""
    weights = {n.name for n in c.graph.params()}
    for n in c.graph.nodes():
        if OPS[n.op].category != SOURCE or n.name in weights:
            continue  # an op, or a weight: the workload's sizes come from the inputs
        for axis, d in enumerate(n.out.dims):
            if d.name == name:
                return c.dim(n.name, axis, scope)
    if name == "P":
        return c.const([0])
    raise GraphllmError(f"the traced graph has no input that holds {name}")


def shape_of(c: Lowering, dims: Any, scope: str) -> str:
    parts = [size(c, d, scope) for d in dims]
    return c.op("Concat", parts, scope, axis=0) if parts else c.const(np.zeros(0, np.int64))


def _out_sizes(c: Lowering, n: Node, k: int = 0) -> list[Any]:
    """The sizes of output k, as ints or Exprs (graph.meta['sizes']: dim name -> Expr)."""
    exprs = c.graph.meta.get("sizes", {})
    return [d.size if d.size is not None else exprs[d.name] for d in n.outputs[k].dims]


def _sym(n: Node) -> tuple:
    return n.attrs.get("sym_args", n.attrs["args"])


def _operands(c: Lowering, n: Node, i: list[str], count: int) -> list[str]:
    """The first `count` operands: tensor inputs in order where the args hold None, else the
    scalar argument as a constant of the operand tensors' dtype."""
    it = iter(i)
    dtype = _dtype(c, n)
    out = []
    for v in n.attrs["args"][:count]:
        out.append(
            next(it) if v is None else c.const(v, dtype if not isinstance(v, bool) else "bool")
        )
    return out


_INTS = ("int64", "int32", "bool")
_ARITHMETIC = ("Add", "Sub", "Mul", "Div", "Pow", "Max", "Min")


def _kept(c: Lowering, dt: str) -> str:
    """The export's type of a traced dtype: an integer one, and fp64 (Ergo's RoPE angles, which
    torch computes in it), as traced; any other float the export's float type."""
    return dt if dt in _INTS or dt == "fp64" else c.dtype


def _dtype(c: Lowering, n: Node) -> str:
    types = [c.graph.type_of(r).dtype for r in n.inputs]
    if "fp64" in types or any(t.dtype == "fp64" for t in n.outputs):
        return "fp64"
    floats = [t for t in types if t not in _INTS]
    if floats or (n.outputs and n.outputs[0].dtype not in _INTS):
        return c.dtype
    return types[0] if types else "int64"


# -- pointwise ---------------------------------------------------------------------------------
def _binary(onnx_op: str) -> Lower:
    def low(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
        if onnx_op in _ARITHMETIC and n.outputs[0].dtype not in _INTS:
            # integers in, a float out (position_ids / 16384, torch's true division): the
            # operands computed in the float type
            i = [
                c.cast(x, c.graph.type_of(r).dtype, _dtype(c, n), n.name)
                if c.graph.type_of(r).dtype in _INTS
                else x
                for x, r in zip(i, n.inputs)
            ]
        a, b = _operands(c, n, i, 2)
        alpha = n.attrs["kwargs"].get("alpha")
        if alpha not in (None, 1):
            b = c.op("Mul", [b, c.const(alpha, _dtype(c, n))], n.name)
        c.final(onnx_op, [a, b], n, o)

    return low


for _kind, _op in {
    "add": "Add",
    "sub": "Sub",
    "mul": "Mul",
    "div": "Div",
    "maximum": "Max",
    "minimum": "Min",
    "eq": "Equal",
    "gt": "Greater",
    "ge": "GreaterOrEqual",
    "lt": "Less",
    "le": "LessOrEqual",
    "logical_and": "And",
    "logical_or": "Or",
    "bitwise_and": "And",
    "bitwise_or": "Or",
    "pow": "Pow",
}.items():
    GENERIC[_kind] = _binary(_op)


@_kinds("ne")
def _ne(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Not", [c.op("Equal", _operands(c, n, i, 2), n.name)], n, o)


@_kinds("rsub")
def _rsub(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    a, b = _operands(c, n, i, 2)
    c.final("Sub", [b, a], n, o)


def _unary(onnx_op: str) -> Lower:
    return lambda c, n, i, o: c.final(onnx_op, [i[0]], n, o)


for _kind, _op in {
    "sqrt": "Sqrt",
    "exp": "Exp",
    "log": "Log",
    "neg": "Neg",
    "abs": "Abs",
    "tanh": "Tanh",
    "sigmoid": "Sigmoid",
    "relu": "Relu",
    "softplus": "Softplus",
    "erf": "Erf",
    "cos": "Cos",
    "sin": "Sin",
    "reciprocal": "Reciprocal",
    "floor": "Floor",
    "ceil": "Ceil",
    "sign": "Sign",
    "logical_not": "Not",
    "bitwise_not": "Not",
    "clone": "Identity",
    "alias": "Identity",
    "detach": "Identity",
    "lift_fresh": "Identity",
    "lift_fresh_copy": "Identity",
}.items():
    GENERIC[_kind] = _unary(_op)


@_kinds("rsqrt")
def _rsqrt(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Reciprocal", [c.op("Sqrt", [i[0]], n.name)], n, o)


@_kinds("log1p")
def _log1p(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Log", [c.op("Add", [i[0], c.const(1.0, c.dtype)], n.name)], n, o)


@_kinds("expm1")
def _expm1(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Sub", [c.op("Exp", [i[0]], n.name), c.const(1.0, c.dtype)], n, o)


@_kinds("log_sigmoid")
def _log_sigmoid(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    """log(sigmoid(x)) = -softplus(-x), which stays finite where sigmoid underflows."""
    softplus = c.op("Softplus", [c.op("Neg", [i[0]], n.name)], n.name)
    c.final("Neg", [softplus], n, o)


@_kinds("floor_divide")
def _floor_divide(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    """torch rounds the quotient down, ONNX's integer Div toward zero: the quotient floored in
    double (exact for integers below 2^53), cast back to the result's type."""
    a, b = (c.op("Cast", [x], n.name, to=TensorProto.DOUBLE) for x in _operands(c, n, i, 2))
    floor = c.op("Floor", [c.op("Div", [a, b], n.name)], n.name)
    dt = n.outputs[0].dtype
    c.final("Cast", [floor], n, o, to=ONNX_TYPES[_kept(c, dt)])


@_kinds("unfold")
def _unfold(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    """The windows of K along `dim` (step 1, as the trace takes it): a Gather of the rows
    start + 0..K-1 for each start, the window's axis then moved last, where torch puts it."""
    rank = c.graph.type_of(n.inputs[0]).rank
    dim, size = n.attrs["args"][1] % rank, n.attrs["args"][2]
    s = n.name
    length = c.op("Shape", [i[0]], s, start=dim, end=dim + 1)
    count = c.op("Squeeze", [c.op("Sub", [length, c.const([size - 1])], s)], s)
    starts = c.op("Range", [c.const(0), count, c.const(1)], s)
    rows = c.op("Unsqueeze", [starts, c.const([1])], s)
    index = c.op("Add", [rows, c.const(np.arange(size)[None, :])], s)  # (windows, K)
    if dim == rank - 1:
        c.final("Gather", [i[0], index], n, o, axis=dim)
        return
    gathered = c.op("Gather", [i[0], index], s, axis=dim)
    perm = [a for a in range(rank + 1) if a != dim + 1] + [dim + 1]
    c.final("Transpose", [gathered], n, o, perm=perm)


@_kinds("silu")
def _silu(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Mul", [i[0], c.op("Sigmoid", [i[0]], n.name)], n, o)


@_kinds("gelu")
def _gelu(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    approximate = n.attrs["kwargs"].get("approximate", "none")
    c.final("Gelu", [i[0]], n, o, approximate=approximate)


@_kinds("clamp", "clamp_min", "clamp_max")
def _clamp(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    kind = n.attrs["aten"]
    args = n.attrs["args"]
    lo = args[1] if kind != "clamp_max" and len(args) > 1 else None
    hi = (
        args[2] if kind == "clamp" and len(args) > 2 else (args[1] if kind == "clamp_max" else None)
    )
    bounds = [c.const(v, _dtype(c, n)) if v is not None else "" for v in (lo, hi)]
    c.final("Clip", [i[0], *bounds], n, o)


@_kinds("where")
def _where(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Where", _operands(c, n, i, 3), n, o)


@_kinds("masked_fill")
def _masked_fill(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    value = n.attrs["args"][2]
    fill = i[2] if value is None else c.const(value, _dtype(c, n))
    c.final("Where", [i[1], fill, i[0]], n, o)


@_kinds("_to_copy")
def _to_copy(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    dt = n.outputs[0].dtype
    c.final("Cast", [i[0]], n, o, to=ONNX_TYPES[_kept(c, dt)])


@_kinds("copy")
def _copy(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Expand", [i[1], c.op("Shape", [i[0]], n.name)], n, o)


# -- reductions ----------------------------------------------------------------------------------
def _axes(n: Node, rank: int) -> list[int]:
    dims = n.attrs["args"][1] if len(n.attrs["args"]) > 1 else None
    if dims is None:
        return list(range(rank))
    return [d % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims])] or list(
        range(rank)
    )


def _reduction(onnx_op: str) -> Lower:
    def low(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
        rank = c.graph.type_of(n.inputs[0]).rank
        keep = int(len(n.outputs[0].dims) == rank)
        axes = c.const(_axes(n, rank))
        c.final(onnx_op, [i[0], axes], n, o, keepdims=keep)

    return low


GENERIC.update(
    mean=_reduction("ReduceMean"),
    sum=_reduction("ReduceSum"),
    amax=_reduction("ReduceMax"),
    amin=_reduction("ReduceMin"),
    logsumexp=_reduction("ReduceLogSumExp"),
)


@_kinds("any", "all")
def _any_all(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    """any: the max of the values as 0/1; all: their min."""
    rank = c.graph.type_of(n.inputs[0]).rank
    keep = int(len(n.outputs[0].dims) == rank)
    as_int = c.op("Cast", [i[0]], n.name, to=ONNX_TYPES["int32"])
    op = "ReduceMax" if n.attrs["aten"] == "any" else "ReduceMin"
    reduced = c.op(op, [as_int, c.const(_axes(n, rank))], n.name, keepdims=keep)
    c.final("Cast", [reduced], n, o, to=ONNX_TYPES["bool"])


@_kinds("flip")
def _flip(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    axes = list(n.attrs["args"][1])
    big = [-1] * len(axes)
    low = [-INT64_MAX] * len(axes)
    c.final("Slice", [i[0], c.const(big), c.const(low), c.const(axes), c.const(big)], n, o)


@_kinds("linalg_vector_norm")
def _vector_norm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    args = n.attrs["args"]
    rank = c.graph.type_of(n.inputs[0]).rank
    order = args[1] if len(args) > 1 and args[1] is not None else 2
    dims = args[2] if len(args) > 2 and args[2] is not None else list(range(rank))
    axes = c.const([d % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims])])
    keep = int(bool(args[3])) if len(args) > 3 and args[3] is not None else 0
    if order == 2:
        c.final("ReduceL2", [i[0], axes], n, o, keepdims=keep)
        return
    powered = c.op("Pow", [c.op("Abs", [i[0]], n.name), c.const(order, c.dtype)], n.name)
    summed = c.op("ReduceSum", [powered, axes], n.name, keepdims=keep)
    c.final("Pow", [summed, c.const(1 / order, c.dtype)], n, o)


@_kinds("_softmax")
def _softmax(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Softmax", [i[0]], n, o, axis=n.attrs["args"][1])


@_kinds("cumsum")
def _cumsum(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("CumSum", [i[0], c.const(n.attrs["args"][1])], n, o)


@_kinds("max")
def _max(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    axis, keep = (
        n.attrs["args"][1],
        int(bool(n.attrs["args"][2] if len(n.attrs["args"]) > 2 else 0)),
    )
    c.final("ReduceMax", [i[0], c.const([axis])], n, [o[0]], keepdims=keep)
    c.final("ArgMax", [i[0]], n, [o[1]], axis=axis, keepdims=keep)


@_kinds("topk")
def _topk(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    args = n.attrs["args"]
    axis = args[2] if len(args) > 2 and args[2] is not None else -1
    largest = int(args[3]) if len(args) > 3 and args[3] is not None else 1
    c.final("TopK", [i[0], c.const([args[1]])], n, o, axis=axis, largest=largest, sorted=1)


@_kinds("native_layer_norm")
def _layer_norm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    args = n.attrs["args"]
    w, b = optional_inputs(i[1:], n.attrs, 2, 2)
    if not w:
        d = int(n.outputs[0].dims[-1].size)  # type: ignore[arg-type]
        w = c.const(np.ones(d), c.dtype)
    axis = -len(args[1])
    c.final("LayerNormalization", [i[0], w, *([b] if b else [])], n, o, axis=axis, epsilon=args[4])


# -- contractions ---------------------------------------------------------------------------------
@_kinds("mm", "bmm")
def _mm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("MatMul", i, n, o)


@_kinds("convolution")
def _convolution(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    """ONNX's Conv, in its groups (stride 1, no padding: as the trace takes it)."""
    c.final("Conv", i, n, o, group=int(n.attrs["args"][8]))


@_kinds("addmm", "baddbmm")
def _addmm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    beta, alpha = (n.attrs["kwargs"].get(k, 1) for k in ("beta", "alpha"))
    product = c.op("MatMul", i[1:], n.name)
    if alpha != 1:
        product = c.op("Mul", [product, c.const(alpha, c.dtype)], n.name)
    bias = i[0] if beta == 1 else c.op("Mul", [i[0], c.const(beta, c.dtype)], n.name)
    c.final("Add", [bias, product], n, o)


# -- movement ---------------------------------------------------------------------------------------
@_kinds("view", "_unsafe_view", "reshape", "unsqueeze", "squeeze")
def _reshape(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Reshape", [i[0], shape_of(c, _out_sizes(c, n), n.name)], n, o)


@_kinds("expand")
def _expand(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Expand", [i[0], shape_of(c, _out_sizes(c, n), n.name)], n, o)


@_kinds("permute", "transpose", "t")
def _transpose(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    rank = c.graph.type_of(n.inputs[0]).rank
    kind, args = n.attrs["aten"], n.attrs["args"]
    if kind == "permute":
        perm = [d % rank for d in args[1]]
    elif kind == "t":
        perm = list(range(rank))[::-1]
    else:
        perm = list(range(rank))
        a, b = args[1] % rank, args[2] % rank
        perm[a], perm[b] = perm[b], perm[a]
    c.final("Transpose", [i[0]], n, o, perm=perm)


@_kinds("slice")
def _slice(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    sym = _sym(n)
    rank = c.graph.type_of(n.inputs[0]).rank
    dim = (sym[1] if len(sym) > 1 and sym[1] is not None else 0) % rank
    start = sym[2] if len(sym) > 2 and sym[2] is not None else 0
    end = sym[3] if len(sym) > 3 and sym[3] is not None else INT64_MAX
    step = sym[4] if len(sym) > 4 and sym[4] is not None else 1
    ends = size(c, min(end, INT64_MAX) if not isinstance(end, Expr) else end, n.name)
    c.final("Slice", [i[0], size(c, start, n.name), ends, c.const([dim]), c.const([step])], n, o)


@_kinds("slice_scatter")
def _slice_scatter(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    """base before the slice, the source, base after it: one Concat along the axis."""
    args = n.attrs["args"]
    base = c.graph.type_of(n.inputs[0])
    dim = args[2] % base.rank
    start, end = args[3] or 0, args[4]
    step = args[5] if len(args) > 5 and args[5] is not None else 1
    if step != 1:  # every step-th entry (an interleaved rotary's even channels)
        _strided_scatter(c, n, i, o, dim, step)
        return
    axis = c.const([dim])
    before = c.op("Slice", [i[0], c.const([0]), c.const([start]), axis], n.name)
    after = c.op("Slice", [i[0], c.const([end]), c.const([INT64_MAX]), axis], n.name)
    c.final("Concat", [before, i[1], after], n, o, axis=dim)


def _strided_scatter(c: Lowering, n: Node, i: list[str], o: list[str], dim: int, step: int) -> None:
    """slice_scatter with a step: ScatterElements at start, start + step, ... along the axis."""
    args = n.attrs["args"]
    src = c.graph.type_of(n.inputs[1])
    count = int(src.dims[dim].size)  # type: ignore[arg-type]
    at = (args[3] or 0) + step * np.arange(count, dtype=np.int64)
    shape = [1] * src.rank
    shape[dim] = count
    index = c.op("Expand", [c.const(at.reshape(shape)), c.op("Shape", [i[1]], n.name)], n.name)
    c.final("ScatterElements", [i[0], index, i[1]], n, o, axis=dim)


@_kinds("select_scatter")
def _select_scatter(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    """base before the row, the source as a row, base after it: one Concat along the axis."""
    args = n.attrs["args"]
    dim = args[2] % c.graph.type_of(n.inputs[0]).rank
    at, axis = args[3], c.const([dim])
    if at < 0:
        raise GraphllmError(f"{n.name}: a select_scatter from the end is not lowered")
    before = c.op("Slice", [i[0], c.const([0]), c.const([at]), axis], n.name)
    after = c.op("Slice", [i[0], c.const([at + 1]), c.const([INT64_MAX]), axis], n.name)
    row = c.op("Unsqueeze", [i[1], axis], n.name)
    c.final("Concat", [before, row, after], n, o, axis=dim)


@_kinds("select")
def _select(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    sym = _sym(n)
    index = c.op("Squeeze", [size(c, sym[2], n.name)], n.name)
    c.final("Gather", [i[0], index], n, o, axis=sym[1])


@_kinds("cat")
def _cat(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Concat", i, n, o, axis=n.attrs["args"][1] if len(n.attrs["args"]) > 1 else 0)


@_kinds("stack")
def _stack(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    axis = n.attrs["args"][1] if len(n.attrs["args"]) > 1 else 0
    parts = [c.op("Unsqueeze", [x, c.const([axis])], n.name) for x in i]
    c.final("Concat", parts, n, o, axis=axis)


@_kinds("split", "split_with_sizes")
def _split(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    args = n.attrs["args"]
    rank = c.graph.type_of(n.inputs[0]).rank
    dim = (args[2] if len(args) > 2 else 0) % rank
    sizes = [size(c, s[dim], n.name) for s in (_out_sizes(c, n, k) for k in range(len(o)))]
    c.final("Split", [i[0], c.op("Concat", sizes, n.name, axis=0)], n, o, axis=dim)


@_kinds("unbind")
def _unbind(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    axis = n.attrs["args"][1] if len(n.attrs["args"]) > 1 else 0
    parts = c.op("Split", [i[0]], n.name, n_out=len(o), axis=axis, num_outputs=len(o))
    parts = [parts] if isinstance(parts, str) else parts
    for part, out in zip(parts, o):
        c.final("Squeeze", [part, c.const([axis])], n, [out])


@_kinds("index_select")
def _index_select(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Gather", i, n, o, axis=n.attrs["args"][1])


@_kinds("embedding")
def _embedding(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Gather", i, n, o, axis=0)


@_kinds("gather")
def _gather(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("GatherElements", i, n, o, axis=n.attrs["args"][1])


@_kinds("scatter")
def _scatter(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    args = n.attrs["args"]
    src = i[2] if len(i) > 2 else None
    if src is None:  # a value: broadcast to the index's shape
        value = c.const([args[3]], _dtype(c, n))
        src = c.op("Expand", [value, c.op("Shape", [i[1]], n.name)], n.name)
    c.final("ScatterElements", [i[0], i[1], src], n, o, axis=args[1])


@_kinds("index")
def _index(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    positions = [k for k, v in enumerate(n.attrs["indices"]) if v is not None]
    if len(positions) != 1:
        raise GraphllmError(f"{n.name}: indexing with several tensors is not lowered to ONNX")
    c.final("Gather", i, n, o, axis=positions[0])


@_kinds("constant_pad_nd")
def _pad(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    rank = c.graph.type_of(n.inputs[0]).rank
    pads = list(n.attrs["args"][1])
    begin, end = [0] * rank, [0] * rank
    for k in range(len(pads) // 2):
        begin[rank - 1 - k], end[rank - 1 - k] = pads[2 * k], pads[2 * k + 1]
    value = n.attrs["args"][2] if len(n.attrs["args"]) > 2 and n.attrs["args"][2] else 0
    c.final("Pad", [i[0], c.const(begin + end), c.const(value, _dtype(c, n))], n, o)


@_kinds("repeat")
def _repeat(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    reps = list(_sym(n)[1])  # a count may be a size (BLOOM repeats its ALiBi B times)
    extra = len(reps) - c.graph.type_of(n.inputs[0]).rank
    x = i[0]
    if extra > 0:  # torch's repeat puts the axes it adds first
        x = c.op("Unsqueeze", [x, c.const(list(range(extra)))], n.name)
    c.final("Tile", [x, shape_of(c, reps, n.name)], n, o)


@_kinds("tril", "triu")
def _trilu(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    k = n.attrs["args"][1] if len(n.attrs["args"]) > 1 and n.attrs["args"][1] else 0
    c.final("Trilu", [i[0], c.const(k)], n, o, upper=int(n.attrs["aten"] == "triu"))


# -- creation -------------------------------------------------------------------------------------
@_kinds("arange")
def _arange(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    numbers = [v for v in _sym(n) if isinstance(v, (int, float, Expr)) and not isinstance(v, bool)]
    start, end, step = (
        (0, numbers[0], 1) if len(numbers) == 1 else (*numbers[:2], (numbers + [1])[2])
    )
    dt = n.outputs[0].dtype
    dt = _kept(c, dt) if dt != "bool" else c.dtype
    scal = [_scalar(c, v, dt, n.name) for v in (start, end, step)]
    c.final("Range", scal, n, o)


def _scalar(c: Lowering, v: Any, dtype: str, scope: str) -> str:
    if isinstance(v, Expr):
        s = c.op("Squeeze", [size(c, v, scope)], scope)
        return s if dtype == "int64" else c.op("Cast", [s], scope, to=ONNX_TYPES[dtype])
    return c.const(v, dtype)


@_kinds(
    "full", "zeros", "ones", "empty", "scalar_tensor", "new_zeros", "new_ones", "new_empty",
    "new_full", "zeros_like", "ones_like", "empty_like", "full_like",
)  # fmt: skip
def _full(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    dt = n.outputs[0].dtype
    dt = _kept(c, dt)
    fill = np.asarray([n.attrs["fill"] or 0], dtype=_NP.get(dt, np.float32))
    value = helper.make_tensor("value", ONNX_TYPES[dt], [1], fill.tolist())
    c.final("ConstantOfShape", [shape_of(c, _out_sizes(c, n), n.name)], n, o, value=value)


_NP = {"int64": np.int64, "int32": np.int32, "bool": np.bool_, "fp64": np.float64}


@lowers("constant")
def _constant(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    value = n.attrs.get("value")
    if value is None:
        raise GraphllmError(f"{n.name}: the model was traced without its constants' values")
    dt = _kept(c, n.out.dtype)
    c.final("Identity", [c.const(np.asarray(value).reshape(_shape(n)), dt, "traced")], n, o)


def _shape(n: Node) -> tuple[int, ...]:
    return tuple(int(d.size) for d in n.out.dims)  # type: ignore[arg-type]


FALLBACKS.append(generic_lowering)
