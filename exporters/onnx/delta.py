"""Decomposed ONNX lowerings of Qwen3-Next's Gated DeltaNet rows and Kimi Delta Attention's
(graphllm.ops.delta).

The delta rule, in every form the IR gives it (chunked for a prefill, from a carried state, or
the decode step; KDA's with its decay per key channel), is one Scan over the new tokens: the
recurrent form, step by step, the state (B, H, d_k, d_v) carried in fp32. Why not the chunked
form: its UT transform is a triangular solve per chunk, a second loop (or 63 unrolled row
updates per chunk) inside the loop over chunks, where the token Scan is one small body that is
exact for any T and is the same arithmetic as the decode step; the IR keeps the chunked form
for what it costs. The logits of both agree with transformers' within fp32 rounding
(tests/exporters/onnx/test_export_qwen3_next.py, tests/trace/test_traced_kda.py).

- `select_blocked` is a Gather on the channel axis, `select_rows` on a
  weight's rows; `to_heads`/`from_heads`/`ungroup_heads` are Reshapes.
- `l2normalize`, `delta_decay` (Softplus, whose large-input form equals torch's threshold within
  fp32) and `gated_rmsnorm` compute in fp32.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from graphllm.exporters.onnx.lowering import Lowering, axis_size, lowers
from graphllm.ir import Node
from graphllm.ops.delta import blocked_index


@lowers("select_blocked")
def _select_blocked(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    # a tp rank holds a block of the head groups: its share of the index, from its offset
    attrs = dict(n.attrs)
    shard = c.offsets(n).get("f")
    if shard is not None:
        attrs["shard"] = {"f": shard}
    held = int(c.graph.type_of(n.inputs[0]).dims[-1].size)  # type: ignore[arg-type]
    c.final("Gather", [i[0], c.const(blocked_index(attrs, held))], n, o, axis=2)


@lowers("select_rows")
def _select_rows(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Gather", [i[0], c.const(list(n.attrs["index"]))], n, o, axis=0)


@lowers("ungroup_heads")
def _ungroup_heads(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    shape = c.const([0, 0, axis_size(n, "h"), axis_size(n, "e")])
    c.final("Reshape", [i[0], shape], n, o)  # (B, T, value heads, d_v)


@lowers("to_heads")
def _to_heads(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    shape = c.const([0, 0, axis_size(n, "h"), axis_size(n, "e")])
    c.final("Reshape", [i[0], shape], n, o)  # (B, T, heads, e)


@lowers("from_heads")
def _from_heads(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("Reshape", [i[0], c.const([0, 0, -1])], n, o)  # (B, T, heads * e)


@lowers("l2normalize")
def _l2normalize(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    x = c.cast(i[0], c.dtype, "fp32", s)
    sq = c.op("ReduceSum", [c.op("Mul", [x, x], s), c.const([-1])], s, keepdims=1)
    den = c.op("Sqrt", [c.op("Add", [sq, c.const(n.attrs["eps"], "fp32", "eps")], s)], s)
    c.final_from_fp32(c.op("Div", [x, den], s), n, o)


@lowers("delta_decay")
def _delta_decay(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    x, a_log, dt_bias = (c.cast(v, c.dtype, "fp32", s) for v in i)
    soft = c.op("Softplus", [c.op("Add", [x, dt_bias], s)], s)
    rate = c.op("Neg", [c.op("Exp", [a_log], s)], s)
    c.final_from_fp32(c.op("Mul", [rate, soft], s), n, o)


@lowers("gated_rmsnorm")
def _gated_rmsnorm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    x, z, w = (c.cast(v, c.dtype, "fp32", s) for v in i)
    var = c.op("ReduceMean", [c.op("Mul", [x, x], s), c.const([-1])], s, keepdims=1)
    den = c.op("Sqrt", [c.op("Add", [var, c.const(n.attrs["eps"], "fp32", "eps")], s)], s)
    normed = c.op("Mul", [c.op("Div", [x, den], s), w], s)
    gate = c.op("Mul", [z, c.op("Sigmoid", [z], s)], s)
    c.final_from_fp32(c.op("Mul", [normed, gate], s), n, o)


def _step_body(c: Lowering, s: str, per_channel: bool) -> object:
    """The Scan body: state (B, H, d_k, d_v) and one token's q, k (B, H, d_k), v (B, H, d_v),
    g (B, H), or (B, H, d_k) for a decay per key channel (KDA), and beta (B, H) -> the next
    state and the token's output S^T q (B, H, d_v)."""
    f = TensorProto.FLOAT
    ax2, ax3, ax23 = c.const([2]), c.const([3]), c.const([2, 3])
    nodes = []

    def op(kind: str, ins: list[str], name: str, **attrs: object) -> str:
        out = f"{s}/scan/{name}"
        nodes.append(helper.make_node(kind, ins, [out], name=out, **attrs))
        return out

    # (B, H, d_k, 1) scales each key channel's row of the state, (B, H, 1, 1) all of it
    decay = op("Unsqueeze", [op("Exp", ["g_t"], "exp_g"), ax3 if per_channel else ax23], "decay")
    state = op("Mul", ["state_in", decay], "decayed")
    k_col = op("Unsqueeze", ["k_t", ax3], "k_col")  # (B, H, d_k, 1)
    kv_mem = op("ReduceSum", [op("Mul", [state, k_col], "sk"), ax2], "kv_mem", keepdims=0)
    beta = op("Unsqueeze", ["b_t", ax2], "beta")  # (B, H, 1)
    delta = op("Mul", [op("Sub", ["v_t", kv_mem], "error"), beta], "delta")
    write = op("Mul", [k_col, op("Unsqueeze", [delta, ax2], "delta_row")], "write")
    nodes.append(helper.make_node("Add", [state, write], ["state_out"], name=f"{s}/scan/state"))
    q_col = op("Unsqueeze", ["q_t", ax3], "q_col")
    read = op("Mul", ["state_out", q_col], "sq")
    nodes.append(
        helper.make_node("ReduceSum", [read, ax2], ["o_t"], name=f"{s}/scan/read", keepdims=0)
    )

    def vi(name: str) -> object:
        return helper.make_tensor_value_info(name, f, None)

    ins = [vi(x) for x in ("state_in", "q_t", "k_t", "v_t", "g_t", "b_t")]
    return helper.make_graph(nodes, f"{s}/scan_body", ins, [vi("state_out"), vi("o_t")])


@lowers(
    "gated_delta_chunked",
    "gated_delta_chunked_state",
    "gated_delta_step",
    "kda_chunked",
    "kda_chunked_state",
    "kda_step",
)
def _gated_delta(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    q, k, v, g, beta = (c.cast(x, c.dtype, "fp32", s) for x in i[:5])
    t_q = c.graph.type_of(n.inputs[0])
    t_v = c.graph.type_of(n.inputs[2])
    n_k, d_k = t_q.dims[2].size, t_q.dims[3].size
    n_v, d_v = t_v.dims[2].size, t_v.dims[3].size
    r = n_v // n_k  # type: ignore[operator]

    def to_value_heads(x: str) -> str:  # (B, T, h_k, d_k) -> (B, T, h_v, d_k): repeat_interleave
        if r == 1:
            return x
        x5 = c.op("Unsqueeze", [x, c.const([3])], s)  # (B, T, h_k, 1, d_k)
        x5 = c.op("Expand", [x5, c.const([1, 1, 1, r, 1])], s)
        return c.op("Reshape", [x5, c.const([0, 0, n_v, d_k])], s)

    q = c.op("Mul", [to_value_heads(q), c.const(d_k**-0.5, "fp32", "scale")], s)  # type: ignore[operator]
    k = to_value_heads(k)
    if len(i) > 5:
        state = c.cast(i[5], c.dtype, "fp32", s)
    else:  # a zero state of (B, H, d_k, d_v), B from the input
        shape = c.op("Concat", [c.dim(i[2], 0, s), c.const([n_v, d_k, d_v])], s, axis=0)
        zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
        state = c.op("ConstantOfShape", [shape], s, value=zero)
    final, out = c.op(
        "Scan",
        [state, q, k, v, g, beta],
        s,
        n_out=2,
        body=_step_body(c, s, per_channel=n.op.startswith("kda_")),
        num_scan_inputs=5,
        scan_input_axes=[1] * 5,
        scan_output_axes=[1],
    )  # final (B, H, d_k, d_v); out (B, T, H, d_v)
    c.final_from_fp32(out, n, [o[0]])
    c.named("Identity", [final], [o[1]], f"{s}/state")
