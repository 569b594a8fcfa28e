"""Decomposed ONNX lowerings of Nemotron-H's Mamba2 rows (graphllm.ops.mamba).

`ssm_scan` / `ssm_scan_past` lower to the chunked SSD form of transformers' torch path, loop-free:
the chunks are a reshape of the (padded) token axis, the intra-chunk blocks Einsums under the
segment-sum decay mask, the inter-chunk recurrence one more Einsum with the (c+1) x (c+1)
chunk-to-chunk decays, as mamba2_chunk_scan computes it. Why not a Scan or Loop: no step of the
chunked form depends on the previous one except through that decay matrix, so it is a fixed
DAG of about fifty nodes for any T, and onnxruntime runs its Einsums as batched GEMMs, where a
token-by-token Scan would run T small bodies for a prefill. The chunk length is min(T,
chunk_size), computed at run time: for T below the chunk one unpadded chunk, so that a decode
step (T = 1) is the recurrent step's arithmetic, not a chunk of zeros. The chunking changes only
the rounding (the exact sum is the same), and the two forms agree within fp32 rounding.

transformers clamps dt at time_step_limit's floor in its chunked form only, not in its recurrent step (one
token after a past): the export applies the clamp unless T = 1 and the attention mask is
longer than the new tokens (a past), as the interpreter's dispatch does.

- `gated_group_rmsnorm` reshapes to (..., groups, group_size), normalises, reshapes back.
- `relu2` is Relu then a Mul.
"""

from __future__ import annotations

from collections.abc import Callable

from graphllm.exporters.onnx.lowering import INT64_MAX, ONNX_TYPES, Lowering, lowers
from graphllm.ir import Node


def _f32(c: Lowering, value: float) -> str:
    return c.const(value, "fp32", "f")


@lowers("relu2")
def _relu2(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    r = c.op("Relu", [i[0]], n.name)
    c.final("Mul", [r, r], n, o)


@lowers("gated_group_rmsnorm")
def _gated_group_rmsnorm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    y, z, w = (c.cast(v, c.dtype, "fp32", s) for v in i)
    h = c.op("Mul", [y, c.op("Mul", [z, c.op("Sigmoid", [z], s)], s)], s)  # y * silu(z)
    groups = c.op("Reshape", [h, c.const([0, 0, -1, n.attrs["group_size"]])], s)
    var = c.op("ReduceMean", [c.op("Mul", [groups, groups], s), c.const([-1])], s, keepdims=1)
    den = c.op("Sqrt", [c.op("Add", [var, _f32(c, n.attrs["eps"])], s)], s)
    normed = c.op("Reshape", [c.op("Div", [groups, den], s), c.const([0, 0, -1])], s)
    c.final_from_fp32(c.op("Mul", [normed, w], s), n, o)


def _segsum(c: Lowering, x: str, s: str) -> str:
    """transformers' segment_sum over x's last axis (size n at run time): (..., n) -> (..., n,
    n), out[i, j] = sum x[j+1..i] for j <= i, -inf above the diagonal."""
    n = c.op("Shape", [x], s, start=-1)  # (1,)
    ones = c.op("ConstantOfShape", [c.op("Concat", [n, n], s, axis=0)], s)  # int64 zeros...
    ones = c.op("Add", [c.op("Cast", [ones], s, to=ONNX_TYPES["fp32"]), _f32(c, 1.0)], s)
    strict = c.op("Cast", [c.op("Trilu", [ones, c.const(-1)], s, upper=0)], s, to=9)  # bool
    lower = c.op("Cast", [c.op("Trilu", [ones, c.const(0)], s, upper=0)], s, to=9)
    shape = c.op("Concat", [c.op("Shape", [x], s), n], s, axis=0)
    xx = c.op("Expand", [c.op("Unsqueeze", [x, c.const([-1])], s), shape], s)  # xx[.., i, j] = x_i
    xx = c.op("Where", [strict, xx, _f32(c, 0.0)], s)
    cs = c.op("CumSum", [xx, c.const(-2)], s)
    return c.op("Where", [lower, cs, _f32(c, float("-inf"))], s)


@lowers("ssm_scan", "ssm_scan_past")
def _ssm_scan(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, a = n.name, n.attrs
    x, dt, a_log, bm, cm, d, dt_bias = (c.cast(v, c.dtype, "fp32", s) for v in i[:7])
    t_x, t_b = c.graph.type_of(n.inputs[0]), c.graph.type_of(n.inputs[3])
    heads, width = t_x.dims[2].size, t_x.dims[3].size
    groups, state = t_b.dims[2].size, t_b.dims[3].size
    r = heads // groups  # type: ignore[operator]
    t = c.dim(i[0], 1, s)  # (1,) the new tokens
    dt = _scan_dt(c, s, dt, dt_bias, a["dt_min"], t, step=len(i) > 7)  # (B, T, H)
    # A (H,): the input itself where the model computed it before the scan
    rate = a_log if a.get("a_is_rate") else c.op("Neg", [c.op("Exp", [a_log], s)], s)

    def to_heads(v: str) -> str:  # (B, T, G, N) -> (B, T, H, N): each group's heads
        e = c.op("Unsqueeze", [v, c.const([3])], s)
        e = c.op("Expand", [e, c.const([1, 1, 1, r, 1])], s)
        return c.op("Reshape", [e, c.const([0, 0, heads, state])], s)

    bh, ch = to_heads(bm), to_heads(cm)
    d_res = c.op("Mul", [x, c.op("Unsqueeze", [d, c.const([1])], s)], s)  # (B, T, H, P)
    xs = c.op("Mul", [x, c.op("Unsqueeze", [dt, c.const([3])], s)], s)
    av = c.op("Mul", [dt, rate], s)  # (B, T, H)

    chunks = _chunker(c, s, t, a["chunk_size"])
    zero = c.const([0])
    xc = chunks(xs, 4, [heads, width])
    bc = chunks(bh, 4, [heads, state])
    cc = chunks(ch, 4, [heads, state])
    ac = c.op("Transpose", [chunks(av, 3, [heads])], s, perm=[0, 3, 1, 2])  # (B,H,c,L)
    a_cum = c.op("CumSum", [ac, c.const(-1)], s)

    lmat = c.op("Exp", [_segsum(c, ac, s)], s)  # (B, H, c, L, L)
    gmat = c.op("Einsum", [cc, bc], s, equation="bclhn,bcshn->bclsh")
    m = c.op("Mul", [gmat, c.op("Transpose", [lmat], s, perm=[0, 2, 3, 4, 1])], s)
    y_diag = c.op("Einsum", [m, xc], s, equation="bclsh,bcshp->bclhp")
    starts, final = _chunk_states(c, s, a_cum, bc, xc, i[7] if len(i) > 7 else None)

    c_states = c.op("Einsum", [cc, starts], s, equation="bclhn,bchpn->bclhp")
    out_decay = c.op("Transpose", [c.op("Exp", [a_cum], s)], s, perm=[0, 2, 3, 1])
    y_off = c.op("Mul", [c_states, c.op("Unsqueeze", [out_decay, c.const([-1])], s)], s)
    y = c.op("Reshape", [c.op("Add", [y_diag, y_off], s), c.const([0, -1, heads, width])], s)
    y = c.op("Slice", [y, zero, t, c.const([1])], s)  # the padding cut off
    y = c.op("Add", [y, d_res], s)
    if c.dtype == "fp32":
        c.named("Identity", [y], [o[0]], f"{s}/y")
    else:
        c.named("Cast", [y], [o[0]], f"{s}/y", to=ONNX_TYPES[c.dtype])
    c.final("Identity", [final], n, [o[1]])


def _scan_dt(c: Lowering, s: str, dt: str, dt_bias: str, dt_min: float, t: str, step: bool) -> str:
    """softplus(dt + dt_bias), clamped below at dt_min except in the recurrent step (one token
    after a past: `step` the scan has a past state, and the attention mask is longer than T)."""
    dt = c.op("Softplus", [c.op("Add", [dt, dt_bias], s)], s)  # (B, T, H)
    clamped = c.op("Max", [dt, _f32(c, dt_min)], s)
    if not step:
        return clamped
    one = c.op("Equal", [t, c.const([1])], s)
    mask_len = c.op("Shape", ["attention_mask"], s, start=1, end=2)
    past = c.op("Greater", [mask_len, t], s)
    return c.op("Where", [c.op("And", [one, past], s), dt, clamped], s)


def _chunker(c: Lowering, s: str, t: str, size: int) -> Callable[[str, int, list[int]], str]:
    """A function (v, rank, tail) -> v (B, T, ...) of that rank with T padded up to whole chunks
    at its end, as (B, chunks, L, *tail); L the chunk size, or T where T is shorter."""
    ell = c.op("Min", [t, c.const([size])], s)  # one unpadded chunk below the chunk size
    pad = c.op("Mod", [c.op("Sub", [ell, c.op("Mod", [t, ell], s)], s), ell], s)
    zero = c.const([0])

    def chunks(v: str, rank: int, tail: list[int]) -> str:
        pads = [c.const([0] * rank), zero, pad, c.const([0] * (rank - 2))]
        v = c.op("Pad", [v, c.op("Concat", pads, s, axis=0)], s)
        shape = c.op("Concat", [c.const([0, -1]), ell, c.const(tail)], s, axis=0)
        return c.op("Reshape", [v, shape], s)  # (B, c, L, ...)

    return chunks


def _chunk_states(
    c: Lowering, s: str, a_cum: str, bc: str, xc: str, past: str | None
) -> tuple[str, str]:
    """(the state each chunk starts from (B, c, H, P, N), the final state (B, H, P, N)): each
    chunk's own state, carried across chunks from the past state (zeros without one)."""
    zero = c.const([0])
    last = c.op("Slice", [a_cum, c.const([-1]), c.const([INT64_MAX]), c.const([3])], s)
    decay = c.op("Exp", [c.op("Sub", [last, a_cum], s)], s)  # (B, H, c, L)
    decay = c.op("Transpose", [decay], s, perm=[0, 2, 3, 1])  # (B, c, L, H)
    b_decay = c.op("Mul", [bc, c.op("Unsqueeze", [decay, c.const([-1])], s)], s)
    states = c.op("Einsum", [b_decay, xc], s, equation="bclhn,bclhp->bchpn")
    if past is not None:
        prev = c.op("Unsqueeze", [past, c.const([1])], s)
    else:
        first = c.op("Slice", [states, zero, c.const([1]), c.const([1])], s)
        prev = c.op("Mul", [first, _f32(c, 0.0)], s)
    states = c.op("Concat", [prev, states], s, axis=1)  # (B, c+1, H, P, N)
    ends = c.op("Squeeze", [last, c.const([3])], s)  # (B, H, c)
    start = c.op(
        "Mul", [c.op("Slice", [ends, zero, c.const([1]), c.const([2])], s), _f32(c, 0.0)], s
    )
    edges = c.op("Concat", [start, ends], s, axis=2)  # (B, H, c+1)
    decay_chunk = c.op("Exp", [_segsum(c, edges, s)], s)  # (B, H, c+1, c+1)
    decay_chunk = c.op("Transpose", [decay_chunk], s, perm=[0, 3, 2, 1])  # (B, z, c, H)
    new = c.op("Einsum", [decay_chunk, states], s, equation="bzch,bzhpn->bchpn")
    starts = c.op("Slice", [new, zero, c.const([-1]), c.const([1])], s)
    return starts, c.op("Gather", [new, c.const(-1)], s, axis=1)


@lowers("weight_rows")
def _rows(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Gather", [i[0], c.const(list(n.attrs["index"]))], n, o, axis=0)
