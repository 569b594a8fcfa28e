"""Decomposed ONNX lowerings of the lightning attention rows (graphllm.ops.lightning).

Both forms are one Scan over the new tokens, the state (B, H, d_k, d_v) carried in fp32:
S_t = exp(-rate) S_{t-1} + k_t v_t^T, o_t = q_t S_t. The block form transformers runs from a
zero state is the same sum grouped otherwise (the IR keeps it for what it costs); the token
Scan is exact for any T and is the arithmetic of the step from a state, so one export serves
a prefill (a zero state) and a cached step. The body reads the decay exp(-rate) (H, 1, 1)
from the outer graph.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from graphllm.exporters.onnx.lowering import ONNX_TYPES, Lowering, lowers
from graphllm.ir import Node


def _step_body(c: Lowering, s: str, decay: str) -> object:
    """The Scan body: state (B, H, d_k, d_v) and one token's q, k (B, H, d_k), v (B, H, d_v)
    -> the next state and the token's output q S (B, H, d_v)."""
    ax2, ax3 = c.const([2]), c.const([3])
    nodes = []

    def op(kind: str, ins: list[str], name: str, **attrs: object) -> str:
        out = f"{s}/scan/{name}"
        nodes.append(helper.make_node(kind, ins, [out], name=out, **attrs))
        return out

    write = op(
        "Mul",
        [op("Unsqueeze", ["k_t", ax3], "k_col"), op("Unsqueeze", ["v_t", ax2], "v_row")],
        "kv",
    )
    decayed = op("Mul", ["state_in", decay], "decayed")
    nodes.append(helper.make_node("Add", [decayed, write], ["state_out"], name=f"{s}/scan/state"))
    read = op("Mul", ["state_out", op("Unsqueeze", ["q_t", ax3], "q_col")], "read")
    nodes.append(
        helper.make_node("ReduceSum", [read, ax2], ["o_t"], name=f"{s}/scan/o", keepdims=0)
    )

    def vi(name: str) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    ins = [vi(x) for x in ("state_in", "q_t", "k_t", "v_t")]
    return helper.make_graph(nodes, f"{s}/scan_body", ins, [vi("state_out"), vi("o_t")])


@lowers("lightning_attention", "lightning_attention_past")
def _lightning(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    q, k, v, rate = (c.cast(x, c.dtype, "fp32", s) for x in i[:4])
    heads = int(c.graph.type_of(n.inputs[3]).dims[0].size)  # type: ignore[arg-type]
    d_k = int(c.graph.type_of(n.inputs[0]).dims[3].size)  # type: ignore[arg-type]
    d_v = int(c.graph.type_of(n.inputs[2]).dims[3].size)  # type: ignore[arg-type]
    decay = c.op("Exp", [c.op("Neg", [rate], s)], s)
    decay = c.op("Reshape", [decay, c.const([heads, 1, 1])], s)  # (H, 1, 1)
    if len(i) > 4:
        state = c.cast(i[4], c.dtype, "fp32", s)
    else:  # a zero state of (B, H, d_k, d_v), B from the input
        shape = c.op("Concat", [c.dim(i[0], 0, s), c.const([heads, d_k, d_v])], s, axis=0)
        zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
        state = c.op("ConstantOfShape", [shape], s, value=zero)
    final, out = c.op(
        "Scan",
        [state, q, k, v],
        s,
        n_out=2,
        body=_step_body(c, s, decay),
        num_scan_inputs=3,
        scan_input_axes=[2] * 3,
        scan_output_axes=[2],
    )  # final (B, H, d_k, d_v); out (B, H, T, d_v)
    c.final_from_fp32(out, n, [o[0]])
    # the state is kept in the model's dtype, as transformers' cache keeps it
    state_dtype = {"to": ONNX_TYPES[c.dtype]} if c.dtype != "fp32" else {}
    c.named("Cast" if state_dtype else "Identity", [final], [o[1]], f"{s}/state", **state_dtype)
