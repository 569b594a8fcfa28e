"""The decomposed lowering: one lowering per op-table row, emitting standard ONNX ops.

One model serves prefill and decode. Inputs: `input_ids` (batch, sequence_length) int64,
`attention_mask` (batch, total_sequence_length) int64, `position_ids` (batch, sequence_length)
int64, `past_key_values.{i}.key|value` (batch, kv_heads, past_sequence_length, head_dim) (length 0
for a prefill). Outputs: `logits` (batch, sequence_length, vocab) and `present.{i}.key|value`
(batch, kv_heads, total_sequence_length, head_dim). Every batch and length is dynamic.

The lowering mirrors the IR node for node: each op-table row has one lowering here, keyed by the
op's name, that emits standard ONNX ops. The ONNX node that produces an IR node's value carries the
IR node's name (`model.layers.3.self_attn.q_proj`); helper nodes are named `<that name>/<OpType>`,
so Netron shows the model's hierarchy. Weights are initializers named like the checkpoint tensors
(stacked experts with `*`), in one `.onnx` file, or, past protobuf's 2 GB, in a `.onnx.<8 hex>.data` file
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

from typing import Any

import numpy as np
from onnx import TensorProto, numpy_helper

from graphllm.exporters.onnx.lowering import (
    INT64_MAX,
    NP_TYPES,
    ONNX_TYPES,
    Lowering,
    axis_size,
    lowers,
)
from graphllm.exporters.onnx.quantize import quantized_linear
from graphllm.ir import Node


# -- one lowering per op row -----------------------------------------------------------------
@lowers("embedding")
def _embedding(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    shard = c.offsets(n).get("v")
    if shard is None:
        c.final("Gather", [i[1], i[0]], n, o, axis=0)  # (B, T, d): row of each token id
        return
    # a vocab-parallel rank's block of the table: ids it does not hold read zeros (the other
    # ranks' rows, summed in by the all-reduce after it)
    s, rows = n.name, int(c.graph.type_of(n.inputs[1]).dims[0].size)  # type: ignore[arg-type]
    local = c.op("Sub", [i[0], c.const(shard[0], hint="vocab_first")], s)
    held = c.op(
        "And",
        [
            c.op("GreaterOrEqual", [local, c.const(0, hint="zero")], s),
            c.op("Less", [local, c.const(rows, hint="vocab_rows")], s),
        ],
        s,
    )
    row = c.op("Where", [held, local, c.const(0, hint="zero")], s)
    picked = c.op("Gather", [i[1], row], s, axis=0)  # (B, T, d)
    zero = c.const(0.0, c.dtype, "zero")
    c.final("Where", [c.op("Unsqueeze", [held, c.const([-1])], s), picked, zero], n, o)


@lowers("linear")
def _linear(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    if c.quantization is not None:
        quantized_linear(c, n, i, o)
        return
    wt = c.op("Transpose", [i[1]], n.name, perm=[1, 0])  # (in, out)
    c.final("MatMul", [i[0], wt], n, o)


@lowers("linear_bias")
def _linear_bias(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    if c.quantization is not None:
        quantized_linear(c, n, i, o)
        return
    wt = c.op("Transpose", [i[1]], n.name, perm=[1, 0])  # (in, out)
    c.final("Add", [c.op("MatMul", [i[0], wt], n.name), i[2]], n, o)


@lowers("expert_linear")
def _expert_linear(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    wt = c.op("Transpose", [i[1]], n.name, perm=[0, 2, 1])  # (E, in, out)
    c.final("MatMul", [i[0], wt], n, o)  # (E, slots, out)


@lowers("expert_matmul")
def _expert_matmul(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("MatMul", [i[0], i[1]], n, o)  # (E, slots, in) @ (E, in, out)


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


# Cohere's LayerNorm, over the hidden axis or each head's channels with its own weight
def _centred_norm(c: Lowering, n: Node, x: str, w: str, o: list[str]) -> None:
    s = n.name
    x = c.cast(x, c.dtype, "fp32", s)
    mean = c.op("ReduceMean", [x, c.const([-1])], s, keepdims=1)
    centred = c.op("Sub", [x, mean], s)
    var = c.op("ReduceMean", [c.op("Mul", [centred, centred], s), c.const([-1])], s, keepdims=1)
    den = c.op("Sqrt", [c.op("Add", [var, c.const(n.attrs["eps"], "fp32", "eps")], s)], s)
    y = c.op("Div", [centred, den], s)
    if c.dtype == "fp32":
        c.final("Mul", [y, w], n, o)
    else:
        c.final("Cast", [c.op("Mul", [y, w], s)], n, o, to=ONNX_TYPES[c.dtype])


@lowers("layernorm")
def _layernorm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    _centred_norm(c, n, i[0], c.cast(i[1], c.dtype, "fp32", n.name), o)


@lowers("head_layernorm")
def _head_layernorm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    w = c.cast(i[1], c.dtype, "fp32", n.name)
    w = c.op("Unsqueeze", [w, c.const([1])], n.name)  # (h, 1, e) against (B, h, T, e)
    _centred_norm(c, n, i[0], w, o)


@lowers("split", "split3")
def _split(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Split", [i[0], c.const(list(n.attrs["sizes"]))], n, o, axis=-1)


@lowers("split_heads")
def _split_heads(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    shape = c.const([0, 0, axis_size(n, "h"), axis_size(n, "e")])
    x = c.op("Reshape", [i[0], shape], n.name)  # (B, T, heads, hd)
    c.final("Transpose", [x], n, o, perm=[0, 2, 1, 3])  # (B, heads, T, hd)


@lowers("merge_heads")
def _merge_heads(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    x = c.op("Transpose", [i[0]], n.name, perm=[0, 2, 1, 3])  # (B, T, heads, hd)
    c.final("Reshape", [x, c.const([0, 0, axis_size(n, "(h e)")])], n, o)  # (B, T, heads*hd)


@lowers("last_position")
def _last_position(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Slice", [i[0], c.const([-1]), c.const([INT64_MAX]), c.const([1])], n, o)


def rotary_tables(
    c: Lowering, pos: str, n: Node, full: bool = True, head_axis: bool = True
) -> tuple[str, str]:
    """cos and sin of the position ids' angles, built once per distinct frequency set and form.

    Each angle is position x inv_freq (scaled by the node's attention_scaling): (B, T, hd/2), or
    with `full` repeated to (B, T, hd) as rotate-half RoPE reads it, and with `head_axis` given a
    head axis, (B, 1, T, ·), to broadcast over the heads."""
    inv = np.asarray(n.attrs["inv_freq"], dtype=np.float32)
    scale = float(n.attrs.get("attention_scaling", 1.0))
    long = n.attrs.get("long_inv_freq")
    long_key = None if long is None else (np.asarray(long).tobytes(), n.attrs["long_from"])

    def make() -> tuple[str, str]:
        s = "model.rotary_emb"
        p = c.op("Unsqueeze", [c.op("Cast", [pos], s, to=TensorProto.FLOAT), c.const([-1])], s)
        freqs = c.const(inv, "fp32", "inv_freq")
        if long is not None:
            # longrope chooses per call, as transformers does: the long frequencies once the
            # largest position id + 1 passes long_from, the short ones below
            top = c.op("ReduceMax", [pos], s, keepdims=0)
            past = c.op("Greater", [top, c.const(int(n.attrs["long_from"]) - 1)], s)
            longs = c.const(np.asarray(long, dtype=np.float32), "fp32", "long_inv_freq")
            freqs = c.op("Where", [past, longs, freqs], s)
        angles = c.op("Mul", [p, freqs], s)  # (B, T, hd/2)
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

    return c.shared(("rope", pos, inv.tobytes(), scale, full, head_axis, long_key), make)


@lowers("rope")
def _rope(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    cos, sin = rotary_tables(c, i[1], n)
    s = n.name
    rot = 2 * len(n.attrs["inv_freq"])
    width = int(c.graph.type_of(n.inputs[0]).dims[-1].size)  # type: ignore[arg-type]
    x = i[0]
    if rot < width:  # partial rotary: turn the leading rot channels, pass the rest through
        x, rest = c.op("Split", [x, c.const([rot, width - rot])], s, n_out=2, axis=-1)
    x1, x2 = c.op("Split", [x], s, n_out=2, axis=-1, num_outputs=2)
    rotated = c.op("Concat", [c.op("Neg", [x2], s), x1], s, axis=-1)  # (-x2, x1)
    turned = [c.op("Mul", [x, cos], s), c.op("Mul", [rotated, sin], s)]
    if rot < width:
        c.final("Concat", [c.op("Add", turned, s), rest], n, o, axis=-1)
    else:
        c.final("Add", turned, n, o)


@lowers("kv_concat")
def _kv_concat(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Concat", [i[0], i[1]], n, o, axis=2)  # (B, kv_heads, P+T, hd)


@lowers("repeat_kv")
def _repeat_kv(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    src = c.graph.type_of(n.inputs[0]).dims
    g, e, h = int(src[1].size), int(src[3].size), axis_size(n, "h")  # type: ignore[arg-type]
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


@lowers("softcap")
def _softcap(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    cap = c.const(n.attrs["cap"], c.dtype, "softcap")
    c.final("Mul", [c.op("Tanh", [c.op("Div", [i[0], cap], n.name)], n.name), cap], n, o)


def _cache_indices(c: Lowering) -> tuple[str, str]:
    """((S,) key index, (T,) query index) into the cache, queries being its last T."""

    def make() -> tuple[str, str]:
        s = "model.attention_mask"
        n_key = c.scalar(c.dim("attention_mask", 1, s), s)  # S
        n_new = c.scalar(c.dim("input_ids", 1, s), s)  # T
        one = c.const(1, hint="one")
        k = c.op("Range", [c.const(0, hint="zero"), n_key, one], s)  # (S,) key index
        block, blocks = c.query_block
        if blocks == 1:
            q = c.op("Range", [c.op("Sub", [n_key, n_new], s), n_key, one], s)  # (T,) query index
            return k, q
        # a rank's block of the tokens: n_new is the block's; the call has blocks x
        # as many, and this block starts `block` blocks into them
        first = c.op("Sub", [n_key, c.op("Mul", [n_new, c.const(blocks - block, hint="b")], s)], s)
        q = c.op("Range", [first, c.op("Add", [first, n_new], s), one], s)  # (T/blocks,)
        return k, q

    return c.shared(("cache_indices",), make)


def allowed_keys(c: Lowering, attrs: dict[str, Any]) -> str:
    """(B, 1, T, S) bool: causal / window / chunk relation by cache index, and the attention
    mask."""
    causal, window, chunk = attrs.get("causal", True), attrs.get("window"), attrs.get("chunk")

    def make() -> str:
        s = "model.attention_mask"
        k, q = _cache_indices(c)
        q = c.op("Unsqueeze", [q, c.const([1])], s)  # (T, 1)
        ok = c.op("Cast", [c.op("Unsqueeze", ["attention_mask", c.const([1, 2])], s)], s, to=9)
        if causal:
            ok = c.op("And", [ok, c.op("LessOrEqual", [k, q], s)], s)
        if window:
            lo = c.op("Sub", [q, c.const(window, hint="window")], s)
            ok = c.op("And", [ok, c.op("Greater", [k, lo], s)], s)
        if chunk:
            # transformers' chunked_overlay: (k - pad) // C == (q - pad) // C, pad the row's
            # left padding (the leading zeros of its attention_mask). Div truncates toward
            # zero, which is the floor for every real key and query (index >= pad); a padded
            # key's bit is 0 above, whatever its quotient
            csum = c.op("CumSum", ["attention_mask", c.const(1)], s)
            lead = c.op("Cast", [c.op("Equal", [csum, c.const(0, hint="zero")], s)], s, to=7)
            pad = c.op("ReduceSum", [lead, c.const([1])], s, keepdims=1)  # (B, 1)
            pad = c.op("Unsqueeze", [pad, c.const([2, 3])], s)  # (B, 1, 1, 1)
            size = c.const(chunk, hint="chunk")
            kc = c.op("Div", [c.op("Sub", [k, pad], s), size], s)  # (B, 1, 1, S)
            qc = c.op("Div", [c.op("Sub", [q, pad], s), size], s)  # (B, 1, T, 1)
            ok = c.op("And", [ok, c.op("Equal", [kc, qc], s)], s)
        return ok  # (B, 1, 1, S) & (T, S) -> (B, 1, T, S)

    # other families' masks keep the key (and so the bytes) they had before chunks
    key = ("mask", causal, window) + ((chunk,) if chunk else ())
    return c.shared(key, make)


@lowers("mask")
def _mask(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    lowest = c.const(np.finfo(NP_TYPES[c.dtype]).min, c.dtype, "lowest")
    c.final("Where", [allowed_keys(c, n.attrs), i[0], lowest], n, o)


# Llama 4's weightless L2 QK-norm and its NoPE layers' attention temperature
@lowers("l2norm")
def _l2norm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    x = c.cast(i[0], c.dtype, "fp32", s)
    var = c.op("ReduceMean", [c.op("Mul", [x, x], s), c.const([-1])], s, keepdims=1)
    den = c.op("Sqrt", [c.op("Add", [var, c.const(n.attrs["eps"], "fp32", "eps")], s)], s)
    if c.dtype == "fp32":
        c.final("Div", [x, den], n, o)
    else:
        c.final("Cast", [c.op("Div", [x, den], s)], n, o, to=ONNX_TYPES[c.dtype])


@lowers("attn_temperature")
def _attn_temperature(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    # the query's index in the cache, as transformers' cache_position (left padding included)
    s = n.name
    _, q = _cache_indices(c)
    one = c.const(1.0, "fp32", "one")
    pos = c.op("Cast", [q], s, to=ONNX_TYPES["fp32"])
    f = c.op(
        "Floor",
        [
            c.op(
                "Div",
                [
                    c.op("Add", [pos, one], s),
                    c.const(float(n.attrs["floor_scale"]), "fp32", "floor_scale"),
                ],
                s,
            )
        ],
        s,
    )
    scale = c.op(
        "Mul",
        [
            c.op("Log", [c.op("Add", [f, one], s)], s),
            c.const(n.attrs["attn_scale"], "fp32", "attn_scale"),
        ],
        s,
    )
    scale = c.op("Unsqueeze", [c.op("Add", [scale, one], s), c.const([1])], s)  # (T, 1)
    c.final("Mul", [i[0], c.cast(scale, "fp32", c.dtype, s)], n, o)


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
    n_exp, k = axis_size(n, "x"), int(c.graph.type_of(n.inputs[1]).dims[-1].size)  # type: ignore[arg-type]
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


@lowers("moe_dispatch_pairs")
def _moe_dispatch_pairs(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, x, chosen = n.name, i[0], i[1]
    n_exp, k = axis_size(n, "x"), int(c.graph.type_of(n.inputs[1]).dims[-1].size)  # type: ignore[arg-type]
    d = int(c.graph.type_of(n.inputs[0]).dims[-1].size)  # type: ignore[arg-type]
    where = _expert_slots(c, chosen, n_exp, s)  # (N, 2), pairs in (b, t, k) order
    rows = c.op("Reshape", [x, c.const([-1, d])], s)  # (N, d): a vector each pair
    tokens = c.op("Div", [c.dim(rows, 0, s), c.const([k], hint="k")], s)
    shape = c.op("Concat", [c.const([n_exp]), tokens, c.const([d])], s, axis=0)
    zero = numpy_helper.from_array(np.zeros(1, NP_TYPES[c.dtype]))
    empty = c.op("ConstantOfShape", [shape], s, value=zero)  # (E, B*T, d): room for all
    c.final("ScatterND", [empty, where, rows], n, o)


@lowers("moe_gather")
def _moe_gather(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, y, chosen = n.name, i[0], i[1]
    n_exp, f = (int(x.size) for x in c.graph.type_of(n.inputs[0]).dims[::2])  # type: ignore[arg-type]
    where = _expert_slots(c, chosen, n_exp, s)
    picked = c.op("GatherND", [y, where], s)  # (N, f)
    shape = c.op("Concat", [c.op("Shape", [chosen], s), c.const([f])], s, axis=0)
    c.final("Reshape", [picked, shape], n, o)  # (B, T, k, f)


@lowers("moe_scale_slots")
def _moe_scale_slots(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, y, w, chosen = n.name, i[0], i[1], i[2]
    n_exp = int(c.graph.type_of(n.inputs[0]).dims[0].size)  # type: ignore[arg-type]
    where = _expert_slots(c, chosen, n_exp, s)  # (N, 2), pairs in (b, t, k) order
    picked = c.op("GatherND", [y, where], s)  # (N, d)
    scaled = c.op("Mul", [picked, c.op("Reshape", [w, c.const([-1, 1])], s)], s)
    c.final("ScatterND", [y, where, scaled], n, o)  # empty slots stay as they were: zero


@lowers("moe_sum")
def _moe_sum(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s, y, chosen = n.name, i[0], i[1]
    n_exp, d = (int(x.size) for x in c.graph.type_of(n.inputs[0]).dims[::2])  # type: ignore[arg-type]
    where = _expert_slots(c, chosen, n_exp, s)
    picked = c.op("GatherND", [y, where], s)  # (N, d)
    shape = c.op("Concat", [c.op("Shape", [chosen], s), c.const([d])], s, axis=0)
    picked = c.op("Reshape", [picked, shape], s)  # (B, T, k, d)
    c.final("ReduceSum", [picked, c.const([2])], n, o, keepdims=0)  # (B, T, d)


# -- gpt-oss -------------------------------------------------------------------------
@lowers("softmax_sink")
def _softmax_sink(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    sink = c.cast(i[1], c.dtype, "fp32", n.name)  # (H,): a head's, along the head axis
    _with_sink(c, n, i[0], c.op("Reshape", [sink, c.const([1, -1, 1, 1])], n.name), o)


@lowers("softmax_token_sink")
def _softmax_token_sink(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    _with_sink(c, n, i[0], c.cast(i[1], c.dtype, "fp32", n.name), o)  # (B, H, T, 1): a query's


def _with_sink(c: Lowering, n: Node, scores: str, sink: str, o: list[str]) -> None:
    # the sink joins each row's max and denominator; a padding query (every key at the lowest
    # finite value) puts all its mass on the sink, so its probabilities are 0, not NaN
    s = n.name
    x = c.cast(scores, c.dtype, "fp32", s)
    m = c.op("Max", [c.op("ReduceMax", [x, c.const([-1])], s, keepdims=1), sink], s)
    e = c.op("Exp", [c.op("Sub", [x, m], s)], s)
    den = c.op("ReduceSum", [e, c.const([-1])], s, keepdims=1)
    den = c.op("Add", [den, c.op("Exp", [c.op("Sub", [sink, m], s)], s)], s)
    if c.dtype == "fp32":
        c.final("Div", [e, den], n, o)
    else:
        c.final("Cast", [c.op("Div", [e, den], s)], n, o, to=ONNX_TYPES[c.dtype])


@lowers("expert_linear_bias")
def _expert_linear_bias(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    b = c.op("Unsqueeze", [i[2], c.const([1])], n.name)  # (E, 1, out)
    c.final("Add", [c.op("MatMul", [i[0], i[1]], n.name), b], n, o)  # (E, slots, out)


@lowers("split_interleaved")
def _split_interleaved(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    for k, out in enumerate(o):
        start, end, axis, step = c.const([k]), c.const([INT64_MAX]), c.const([-1]), c.const([2])
        c.named("Slice", [i[0], start, end, axis, step], [out], f"{n.name}/{k}")


@lowers("clamped_swiglu")
def _clamped_swiglu(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    limit = c.const(n.attrs["limit"], c.dtype, "swiglu_limit")
    low = c.const(-n.attrs["limit"], c.dtype, "swiglu_low")
    gate = c.op("Min", [i[0], limit], s)
    up = c.op("Clip", [i[1], low, limit], s)
    alpha = c.const(n.attrs["alpha"], c.dtype, "swiglu_alpha")
    glu = c.op("Mul", [gate, c.op("Sigmoid", [c.op("Mul", [gate, alpha], s)], s)], s)
    one = c.const(1.0, c.dtype, "one")
    c.final("Mul", [c.op("Add", [up, one], s), glu], n, o)
