"""Generic op rows: what a traced model's code between its recognised units is made of
(graphllm.trace lowers every aten op that no semantic row matches onto one of these).

A generic row is one aten op kind applied to axes in one arrangement: `aten.mul[a b c, c -> a b c]`
is a broadcast product whose second input holds the last axis alone. The arrangement is the
row's signature, so shapes, token mixing, FLOPs and bytes come from the same generic rules as
every hand-written row; the rows are declared on first use (`generic_row`), the same name always
declaring the same row. The numpy reference of each aten op kind is `ATEN` below; its attrs are
the op's non-tensor arguments (`args`, tensors standing as None) and the output `shape`.

FLOP conventions (the module docstring of graphllm.ir.opspec): mm, bmm and addmm are matrix
multiplies (2 x the product of the axis sizes, as torch's FlopCounterMode counts them); a
pointwise op costs 1 per output element; a reduction 1 per input element; data movement 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from graphllm.errors import GraphError
from graphllm.ir.opspec import (
    CONTRACTION,
    ELEMENTWISE,
    MOVEMENT,
    OPS,
    REDUCTION,
    SOURCE,
    OpSpec,
    register,
)
from graphllm.ops.common import f32

Impl = Callable[[list[np.ndarray], dict[str, Any]], Any]
PREFIX = "aten."


def _fl(x: Any) -> np.ndarray:
    """A float operand at the interpreter's precision: fp32, or fp64 where the trace computes
    in it (Ergo's RoPE angles), so that those ops run as torch runs them."""
    return x if isinstance(x, np.ndarray) and x.dtype == np.float64 else f32(x)


def _name(x: np.ndarray) -> str | None:
    """fp64 for an fp64 array (kept so by an op without a dtype of its own), else None."""
    return "fp64" if x.dtype == np.float64 else None


def _np_dtype(name: str | None) -> Any:
    return {
        "fp64": np.float64,
        "int64": np.int64,
        "int32": np.int32,
        "bool": np.bool_,
        "int8": np.int8,
        "uint8": np.uint8,
    }.get(name or "", np.float32)


def _scalar(a: dict[str, Any], i: int, default: Any = None) -> Any:
    args = a["args"]
    return args[i] if len(args) > i and args[i] is not None else default


def _binary(fn: Callable[[Any, Any], Any]) -> Impl:
    """A pointwise op of two operands, each a tensor input or a scalar argument, in order."""

    def impl(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
        it = iter(xs)
        ops = [next(it) if v is None else v for v in a["args"][:2]]
        ops = [_fl(v) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v for v in ops]
        alpha = a["kwargs"].get("alpha")
        if alpha is not None:
            ops[1] = ops[1] * alpha
        return np.asarray(fn(ops[0], ops[1]))

    return impl


def _unary(fn: Callable[[np.ndarray], Any]) -> Impl:
    return lambda xs, a: np.asarray(fn(_fl(xs[0]) if xs[0].dtype.kind == "f" else xs[0]))


def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float32])(x)


def _gelu(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = _fl(xs[0])
    if a["kwargs"].get("approximate", "none") == "tanh":
        c = np.float32(math.sqrt(2.0 / math.pi))
        return 0.5 * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x**3)))
    return 0.5 * x * (1 + _erf(x / np.float32(math.sqrt(2.0))))


def _pow(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    it = iter(xs)
    base, exp = (next(it) if v is None else v for v in a["args"][:2])
    return np.power(_fl(base), exp if not isinstance(exp, np.ndarray) else _fl(exp))


def _dims(a: dict[str, Any], i: int, rank: int) -> tuple[int, ...]:
    d = _scalar(a, i)
    if d is None:
        return tuple(range(rank))
    return tuple(x % rank for x in (d if isinstance(d, (list, tuple)) else [d]))


def _reduce(fn: Callable[..., np.ndarray]) -> Impl:
    def impl(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
        x = xs[0]
        keep = bool(_scalar(a, 2, a["kwargs"].get("keepdim", False)))
        out = fn(_fl(x) if x.dtype.kind == "f" else x, axis=_dims(a, 1, x.ndim), keepdims=keep)
        return np.asarray(out).astype(_np_dtype(a.get("dtype") or _name(x)))

    return impl


def _logsumexp(x: np.ndarray, axis: Any, keepdims: bool) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)  # a row of -inf sums to -inf, not nan
    out = np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)) + m
    return out if keepdims else np.squeeze(out, axis=axis)


def _vector_norm(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """linalg_vector_norm(x, ord, dim, keepdim): the ord-norm over `dim`."""
    x, order = _fl(xs[0]), _scalar(a, 1, 2)
    dims = _dims(a, 2, x.ndim)
    keep = bool(_scalar(a, 3, False))
    return np.sum(np.abs(x) ** order, axis=dims, keepdims=keep) ** (1 / order)


def _softmax(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = _fl(xs[0])
    ax = a["args"][1]
    e = np.exp(x - np.max(x, axis=ax, keepdims=True))
    return e / np.sum(e, axis=ax, keepdims=True)


def _max_dim(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x, ax = xs[0], a["args"][1]
    keep = bool(_scalar(a, 2, False))
    return np.max(x, axis=ax, keepdims=keep), np.argmax(x, axis=ax, keepdims=keep)


def _topk(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x, k = xs[0], a["args"][1]
    ax = _scalar(a, 2, -1)
    largest = _scalar(a, 3, True)
    idx = np.argsort(-x if largest else x, axis=ax, kind="stable")
    idx = np.take(idx, np.arange(k), axis=ax)
    return np.take_along_axis(x, idx, axis=ax), idx.astype(np.int64)


def _reshape(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.reshape(xs[0], a["shape"])


def _slice(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]
    dim = _scalar(a, 1, 0) % x.ndim
    start, end, step = _scalar(a, 2, 0), _scalar(a, 3, None), _scalar(a, 4, 1)
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    return x[tuple(idx)]


def _slice_scatter(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """slice_scatter(base, src, dim, start, end, step): base with src written over the slice."""
    x = xs[0].copy()
    dim = _scalar(a, 2, 0) % x.ndim
    start, end, step = _scalar(a, 3, 0), _scalar(a, 4, None), _scalar(a, 5, 1)
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, end, step)
    x[tuple(idx)] = xs[1]
    return x


def _select_scatter(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """select_scatter(base, src, dim, index): base with src written at that index."""
    x = xs[0].copy()
    idx = [slice(None)] * x.ndim
    idx[a["args"][2] % x.ndim] = a["args"][3]
    x[tuple(idx)] = xs[1]
    return x


def _select(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.take(xs[0], a["args"][2], axis=a["args"][1])


def _cat(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    dim = _scalar(a, 1, 0)
    parts = [x for x in xs if x.size or x.ndim > 1]
    return np.concatenate(parts, axis=dim)


def _split(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    return tuple(np.reshape(p, s) for p, s in zip(_split_parts(xs[0], a), a["shapes"]))


def _split_parts(x: np.ndarray, a: dict[str, Any]) -> list[np.ndarray]:
    dim = _scalar(a, 2, 0) % x.ndim
    sizes = [s[dim] for s in a["shapes"]] if a["aten"] != "unbind" else None
    if sizes is None:
        return [np.take(x, i, axis=_scalar(a, 1, 0)) for i in range(x.shape[_scalar(a, 1, 0)])]
    return np.split(x, np.cumsum(sizes)[:-1], axis=dim)


def _stack(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.stack(xs, axis=_scalar(a, 1, 0))


def optional_inputs(inputs: list[Any], a: dict[str, Any], first: int, count: int) -> list[Any]:
    """Args first .. first+count-1 of an op whose args may be tensors or Python None (a layer
    norm without weight): the next of `inputs` for a tensor, None where the model passed None
    (attrs["absent"]: the positions it did)."""
    it = iter(inputs)
    absent = a.get("absent", ())
    return [None if first + j in absent else next(it) for j in range(count)]


def _native_layer_norm(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    x = _fl(xs[0])
    w, b = optional_inputs(xs[1:], a, 2, 2)
    axes = tuple(range(x.ndim - len(a["args"][1]), x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(np.mean((x - mean) ** 2, axis=axes, keepdims=True) + a["args"][4])
    out = (x - mean) * rstd
    out = out * _fl(w) if w is not None else out
    out = out + _fl(b) if b is not None else out
    return out, mean, rstd


def _expand(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.broadcast_to(xs[0], a["shape"]).copy()


def _index(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    it = iter(xs[1:])
    idx = tuple(slice(None) if v is None else next(it) for v in a["indices"])
    return xs[0][idx]


def _where(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    it = iter(xs)
    c, x, y = (next(it) if v is None else v for v in a["args"][:3])
    return np.where(c, x, y)


def _masked_fill(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    it = iter(xs)
    x, m = next(it), next(it)
    v = a["args"][2] if a["args"][2] is not None else next(it)
    return np.where(m, v, x)


def _to(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    dt = a.get("dtype") or a.get("dtype_to")
    if dt in ("fp64", "int64", "int32", "bool", "int8", "uint8"):
        return xs[0].astype(_np_dtype(dt))
    return f32(xs[0]) if dt else _fl(xs[0])


def _arange(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    args = [v for v in a["args"] if isinstance(v, (int, float))]
    return np.arange(*args).astype(_np_dtype(a.get("dtype")))


def _full(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.full(a["shape"], a["fill"], dtype=_np_dtype(a.get("dtype")))


def _scatter(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    it = iter(xs)
    x, index = next(it).copy(), next(it)
    src = a["args"][3] if len(a["args"]) > 3 and a["args"][3] is not None else next(it)
    src = np.broadcast_to(np.asarray(src, dtype=x.dtype), index.shape)
    np.put_along_axis(x, index, src, axis=a["args"][1])
    return x


def _gather(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.take_along_axis(xs[0], xs[1], axis=a["args"][1])


def _index_select(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.take(xs[0], xs[1], axis=a["args"][1])


def _mm(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return _fl(xs[0]) @ _fl(xs[1])


def _addmm(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    beta, alpha = a["kwargs"].get("beta", 1), a["kwargs"].get("alpha", 1)
    return beta * _fl(xs[0]) + alpha * (_fl(xs[1]) @ _fl(xs[2]))


def _cumsum(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]
    return np.cumsum(_fl(x) if x.dtype.kind == "f" else x, axis=a["args"][1]).astype(
        _np_dtype(a.get("dtype") or _name(x))
    )


def _clamp(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    lo, hi = _scalar(a, 1), _scalar(a, 2)
    return np.clip(_fl(xs[0]), lo, hi)


def _constant(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    value = a.get("value")
    if value is None:
        raise GraphError("a traced constant without its value (the model was traced for analysis)")
    return value


def _pad(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """torch's constant_pad_nd: (before, after) pairs from the last axis back; a negative
    one cuts that many entries off instead (a conv state padded to K or cut to its last K)."""
    x, pads = xs[0], a["args"][1]
    width = [(0, 0)] * x.ndim
    cut = [slice(None)] * x.ndim
    for i in range(len(pads) // 2):
        lo, hi = pads[2 * i], pads[2 * i + 1]
        width[x.ndim - 1 - i] = (max(lo, 0), max(hi, 0))
        cut[x.ndim - 1 - i] = slice(max(-lo, 0), x.shape[x.ndim - 1 - i] - max(-hi, 0))
    return np.pad(x[tuple(cut)], width, constant_values=_scalar(a, 2, 0))


def _unfold(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """unfold(x, dim, size, step): the windows of `size` along `dim`, `step` apart, each
    window's entries on a new last axis."""
    x, (dim, size, step) = xs[0], a["args"][1:4]
    windows = np.lib.stride_tricks.sliding_window_view(x, size, axis=dim % x.ndim)
    return np.take(windows, np.arange(0, windows.shape[dim % x.ndim], step), axis=dim % x.ndim)


def _convolution(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    """A 1-d convolution, stride 1 and no padding (as the trace takes it): x (B, Cin, L), w
    (Cout, Cin/g, K) in g groups, an optional bias (Cout,) -> (B, Cout, L-K+1)."""
    x, w = _fl(xs[0]), _fl(xs[1])
    (bias,) = optional_inputs(xs[2:], a, 2, 1)
    groups, k = a["args"][8], w.shape[-1]
    t = x.shape[-1] - k + 1
    cin, cout = x.shape[1] // groups, w.shape[0] // groups
    out = np.zeros((x.shape[0], w.shape[0], t), np.float32)
    for g in range(groups):
        xg, wg = x[:, g * cin : (g + 1) * cin], w[g * cout : (g + 1) * cout]
        for j in range(k):  # tap j reads the input j positions into the window
            out[:, g * cout : (g + 1) * cout] += np.einsum(
                "oi,bit->bot", wg[:, :, j], xg[..., j : j + t]
            )
    return out + _fl(bias)[None, :, None] if bias is not None else out


def _conv_flops(s: dict[str, float]) -> float:
    """2 per tap a channel of its group reads, an output: the letters the trace's
    convolution signature gives (a b c, d e f -> a d g: B Cin L, Cout Cin/g K -> B Cout T)."""
    return 2 * s["a"] * s["d"] * s["g"] * s["e"] * s["f"]


def _window_ending_at(a: dict[str, Any], t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """unfold or a convolution over the token axis: output position t reads the window of
    inputs t-K+1 .. t (a causal window: the input holds K-1 positions before the outputs')."""
    return t - a.get("kernel", a["args"][2]) + 1, t.copy()


def _shifted(a: dict[str, Any], t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A pad that shifts the token axis by attrs['shift'] (RWKV's time shift: one zero before,
    the last position cut): output position t reads input position t - shift."""
    return t - a["shift"], t - a["shift"]


def _repeat(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    reps = a["args"][1]
    x = xs[0].reshape((1,) * (len(reps) - xs[0].ndim) + xs[0].shape)
    return np.tile(x, reps)


def _tri(fn: Callable[..., np.ndarray]) -> Impl:
    return lambda xs, a: fn(xs[0], k=_scalar(a, 1, 0))


# aten op kind -> (category, numpy reference); the kind is the overload packet's name
ATEN: dict[str, tuple[str, Impl]] = {
    "add": (ELEMENTWISE, _binary(np.add)),
    "sub": (ELEMENTWISE, _binary(np.subtract)),
    "rsub": (ELEMENTWISE, _binary(lambda x, y: y - x)),
    "mul": (ELEMENTWISE, _binary(np.multiply)),
    "div": (ELEMENTWISE, _binary(np.divide)),
    "floor_divide": (ELEMENTWISE, _binary(np.floor_divide)),
    "maximum": (ELEMENTWISE, _binary(np.maximum)),
    "minimum": (ELEMENTWISE, _binary(np.minimum)),
    "eq": (ELEMENTWISE, _binary(np.equal)),
    "ne": (ELEMENTWISE, _binary(np.not_equal)),
    "gt": (ELEMENTWISE, _binary(np.greater)),
    "ge": (ELEMENTWISE, _binary(np.greater_equal)),
    "lt": (ELEMENTWISE, _binary(np.less)),
    "le": (ELEMENTWISE, _binary(np.less_equal)),
    "logical_and": (ELEMENTWISE, _binary(np.logical_and)),
    "logical_or": (ELEMENTWISE, _binary(np.logical_or)),
    "bitwise_and": (ELEMENTWISE, _binary(np.bitwise_and)),
    "bitwise_or": (ELEMENTWISE, _binary(np.bitwise_or)),
    "pow": (ELEMENTWISE, _pow),
    "where": (ELEMENTWISE, _where),
    "masked_fill": (ELEMENTWISE, _masked_fill),
    "rsqrt": (ELEMENTWISE, _unary(lambda x: 1 / np.sqrt(x))),
    "sqrt": (ELEMENTWISE, _unary(np.sqrt)),
    "exp": (ELEMENTWISE, _unary(np.exp)),
    "log": (ELEMENTWISE, _unary(np.log)),
    "log1p": (ELEMENTWISE, _unary(np.log1p)),
    "expm1": (ELEMENTWISE, _unary(np.expm1)),
    "neg": (ELEMENTWISE, _unary(np.negative)),
    "abs": (ELEMENTWISE, _unary(np.abs)),
    "tanh": (ELEMENTWISE, _unary(np.tanh)),
    "sigmoid": (ELEMENTWISE, _unary(lambda x: 1 / (1 + np.exp(-x)))),
    "silu": (ELEMENTWISE, _unary(lambda x: x / (1 + np.exp(-x)))),
    "relu": (ELEMENTWISE, _unary(lambda x: np.maximum(x, 0))),
    "gelu": (ELEMENTWISE, _gelu),
    "softplus": (ELEMENTWISE, _unary(lambda x: np.logaddexp(0, x))),
    "log_sigmoid": (ELEMENTWISE, _unary(lambda x: -np.logaddexp(0, -x))),
    "erf": (ELEMENTWISE, _unary(_erf)),
    "cos": (ELEMENTWISE, _unary(np.cos)),
    "sin": (ELEMENTWISE, _unary(np.sin)),
    "reciprocal": (ELEMENTWISE, _unary(np.reciprocal)),
    "floor": (ELEMENTWISE, _unary(np.floor)),
    "ceil": (ELEMENTWISE, _unary(np.ceil)),
    "sign": (ELEMENTWISE, _unary(np.sign)),
    "logical_not": (ELEMENTWISE, _unary(np.logical_not)),
    "bitwise_not": (
        ELEMENTWISE,
        _unary(lambda x: np.invert(x.astype(bool) if x.dtype.kind == "f" else x)),
    ),
    "clamp": (ELEMENTWISE, _clamp),
    "clamp_min": (ELEMENTWISE, lambda xs, a: np.maximum(_fl(xs[0]), a["args"][1])),
    "clamp_max": (ELEMENTWISE, lambda xs, a: np.minimum(_fl(xs[0]), a["args"][1])),
    "_to_copy": (ELEMENTWISE, _to),
    "mean": (REDUCTION, _reduce(np.mean)),
    "sum": (REDUCTION, _reduce(np.sum)),
    "amax": (REDUCTION, _reduce(np.max)),
    "amin": (REDUCTION, _reduce(np.min)),
    "logsumexp": (REDUCTION, _reduce(_logsumexp)),
    "linalg_vector_norm": (REDUCTION, _vector_norm),
    "any": (REDUCTION, _reduce(np.any)),
    "all": (REDUCTION, _reduce(np.all)),
    "_softmax": (REDUCTION, _softmax),
    "max": (REDUCTION, _max_dim),
    "topk": (REDUCTION, _topk),
    "cumsum": (REDUCTION, _cumsum),
    "mm": (CONTRACTION, _mm),
    "bmm": (CONTRACTION, _mm),
    "addmm": (CONTRACTION, _addmm),
    "baddbmm": (CONTRACTION, _addmm),
    "convolution": (CONTRACTION, _convolution),
    "view": (MOVEMENT, _reshape),
    "_unsafe_view": (MOVEMENT, _reshape),
    "reshape": (MOVEMENT, _reshape),
    "permute": (MOVEMENT, lambda xs, a: np.transpose(xs[0], a["args"][1])),
    "transpose": (
        MOVEMENT,
        lambda xs, a: np.swapaxes(xs[0], a["args"][1], a["args"][2]),
    ),
    "t": (MOVEMENT, lambda xs, a: xs[0].T),
    "unsqueeze": (MOVEMENT, _reshape),
    "squeeze": (MOVEMENT, _reshape),
    "expand": (MOVEMENT, _expand),
    "slice": (MOVEMENT, _slice),
    "slice_scatter": (MOVEMENT, _slice_scatter),
    "select_scatter": (MOVEMENT, _select_scatter),
    "select": (MOVEMENT, _select),
    "cat": (MOVEMENT, _cat),
    "stack": (MOVEMENT, _stack),
    "native_layer_norm": (REDUCTION, _native_layer_norm),
    "split": (MOVEMENT, _split),
    "split_with_sizes": (MOVEMENT, _split),
    "unbind": (MOVEMENT, _split),
    "clone": (MOVEMENT, lambda xs, a: xs[0].copy()),
    "alias": (MOVEMENT, lambda xs, a: xs[0]),
    "detach": (MOVEMENT, lambda xs, a: xs[0]),
    "lift_fresh": (MOVEMENT, lambda xs, a: xs[0]),
    "lift_fresh_copy": (MOVEMENT, lambda xs, a: xs[0].copy()),
    "copy": (MOVEMENT, lambda xs, a: np.broadcast_to(xs[1], xs[0].shape).astype(xs[0].dtype)),
    "index": (MOVEMENT, _index),
    "index_select": (MOVEMENT, _index_select),
    "gather": (MOVEMENT, _gather),
    "scatter": (MOVEMENT, _scatter),
    "embedding": (MOVEMENT, lambda xs, a: _fl(xs[0])[xs[1]]),
    "constant_pad_nd": (MOVEMENT, _pad),
    "repeat": (MOVEMENT, _repeat),
    "unfold": (MOVEMENT, _unfold),
    "flip": (MOVEMENT, lambda xs, a: np.flip(xs[0], axis=tuple(a["args"][1]))),
    "tril": (MOVEMENT, _tri(np.tril)),
    "triu": (MOVEMENT, _tri(np.triu)),
    "arange": (SOURCE, _arange),
    "full": (SOURCE, _full),
    "zeros": (SOURCE, _full),
    "ones": (SOURCE, _full),
    "empty": (SOURCE, _full),
    "scalar_tensor": (SOURCE, _full),
    "new_zeros": (SOURCE, _full),
    "new_ones": (SOURCE, _full),
    "new_empty": (SOURCE, _full),
    "new_full": (SOURCE, _full),
    "zeros_like": (SOURCE, _full),
    "ones_like": (SOURCE, _full),
    "empty_like": (SOURCE, _full),
    "full_like": (SOURCE, _full),
}
# views: what an engine does not copy (torch returns an alias)
VIEWS = frozenset(
    {"view", "_unsafe_view", "permute", "transpose", "t", "unsqueeze", "squeeze", "expand"}
    | {"slice", "select", "split", "split_with_sizes", "unbind", "alias", "detach"}
)
MATMULS = frozenset({"mm", "bmm", "addmm", "baddbmm"})


def _reduction_flops(sizes: dict[str, float]) -> float:
    """One FLOP per input element: the product of every letter's size (the inputs' letters)."""
    return math.prod(v for k, v in sizes.items() if not k.startswith("..."))


def _typed(impl: Impl) -> Impl:
    """`impl` with its integer and boolean outputs at the dtypes the trace gave them (numpy
    promotes where torch keeps the type: a comparison of masks, a scatter into one)."""

    def run(xs: list[np.ndarray], a: dict[str, Any]) -> Any:
        out = impl(xs, a)
        dtypes = a.get("dtypes") or ()
        if isinstance(out, tuple):
            return tuple(_as(o, dt) for o, dt in zip(out, dtypes))
        return _as(out, dtypes[0]) if dtypes else out

    return run


def _as(x: Any, dtype: str) -> Any:
    if dtype in ("fp64", "int64", "int32", "bool") and isinstance(x, np.ndarray):
        return x.astype(_np_dtype(dtype), copy=False)
    if isinstance(x, np.ndarray) and x.dtype == np.float64:  # fp64 only where torch has it
        return f32(x)
    return x


def generic_row(
    kind: str,
    sig: str,
    same_position: tuple[tuple[str, ...], ...] = (),
    reduce: tuple[str, ...] = (),
    carries: tuple[tuple[str, str], ...] = (),
    shift: bool = False,
) -> str:
    """The op name of aten op `kind` applied as `sig` says, its row declared on first use.
    `carries`: letter pairs that one split cuts alike (a reshape's merged or split axis and its
    outermost factor), so that a sharding passes through it (passes/parallel/sharding.py).
    `shift`: a pad that shifts the token axis (its output letter the input's moved by
    attrs['shift'] positions, the row's relation)."""
    if kind not in ATEN:
        raise GraphError(f"aten op {kind!r} has no generic row")
    extra = ";" + " ".join("=".join(g) for g in same_position) if same_position else ""
    extra += ";reduce " + " ".join(reduce) if reduce else ""
    extra += ";carries " + " ".join(">".join(p) for p in carries) if carries else ""
    extra += ";shift" if shift else ""
    name = f"{PREFIX}{kind}[{sig}{extra}]"
    if name in OPS:
        return name
    category, impl = ATEN[kind]
    n_out = sig.split("->")[1].count(",") + 1
    spec = OpSpec(
        name,
        sig,
        category,
        _typed(impl),
        f"aten.{kind} as traced from the model's code ({sig}).",
        reduce=reduce,
        same_position=same_position,
        flops_per_elem=1 if category == ELEMENTWISE and kind != "_to_copy" else 0,
        flops_fn=_conv_flops
        if kind == "convolution"
        else (_reduction_flops if category == REDUCTION else None),
        out_dtypes=("attr",) * n_out,
        matmul=kind in MATMULS,
        view=kind in VIEWS,
        linear=() if category == ELEMENTWISE and kind not in ("add", "sub", "neg") else None,
        carries=carries,
        relation=_shifted
        if shift
        else (_window_ending_at if kind in ("unfold", "convolution") else None),
    )
    register(spec)
    return name


def ensure_row(name: str) -> None:
    """Declare the generic row `name` (as `generic_row` names it) if it is not yet: a traced
    graph read back from disk names rows this process has not declared."""
    if name in OPS or not name.startswith(PREFIX):
        return
    kind, rest = name[len(PREFIX) :].split("[", 1)
    parts = rest[:-1].split(";")
    same: tuple[tuple[str, ...], ...] = ()
    reduce: tuple[str, ...] = ()
    carries: tuple[tuple[str, str], ...] = ()
    shift = False
    for part in parts[1:]:
        if part == "shift":
            shift = True
        elif part.startswith("reduce "):
            reduce = tuple(part[len("reduce ") :].split())
        elif part.startswith("carries "):
            pairs = (p.split(">") for p in part[len("carries ") :].split())
            carries = tuple((x, y) for x, y in pairs)
        else:
            same = tuple(tuple(g.split("=")) for g in part.split())
    generic_row(kind, parts[0], same, reduce, carries, shift)


register(
    OpSpec(
        "constant",
        "-> ...",
        SOURCE,
        _constant,
        "A value the model computes from its config alone (a RoPE frequency table, a buffer).",
    ),
)
