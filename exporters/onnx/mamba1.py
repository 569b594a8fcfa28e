"""Decomposed ONNX lowerings of the Mamba-1 rows (graphllm.ops.mamba1).

`selective_scan` and `selective_state_update` are one Scan over the new tokens, the state
(B, D, N) carried in fp32, as the delta rule's rows lower (exporters/onnx/delta.py). Why not a
loop-free form like Mamba2's: the decay differs per channel and state entry, so the chunked
form's decay mask would be (B, D, N, L, L), where the token Scan holds one (B, D, N) state. The
body reads A from the outer graph; dt's bias and softplus, the D skip and the gate are computed
for all tokens at once outside it.

transformers steps from the carried state for one new token only; several tokens after a past
run its selective_scan_fn, which starts from zeros: the state row starts from its state input
where T = 1 and from zeros otherwise, so one export serves prefill and decode as transformers
runs them.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from graphllm.exporters.onnx.lowering import Lowering, lowers
from graphllm.ir import Node


def _step_body(c: Lowering, s: str, rate: str) -> object:
    """The Scan body: state (B, D, N) and one token's u, dt (B, D), B, C (B, N) -> the next
    state and the token's y = state C (B, D)."""
    ax1, ax2 = c.const([1]), c.const([2])
    nodes = []

    def op(kind: str, ins: list[str], name: str, **attrs: object) -> str:
        out = f"{s}/scan/{name}"
        nodes.append(helper.make_node(kind, ins, [out], name=out, **attrs))
        return out

    step = op("Unsqueeze", ["dt_t", ax2], "step")  # (B, D, 1)
    decay = op("Exp", [op("Mul", [step, rate], "dt_a")], "decay")  # (B, D, N)
    write = op("Mul", [step, op("Unsqueeze", ["b_t", ax1], "b_row")], "dt_b")
    write = op("Mul", [write, op("Unsqueeze", ["u_t", ax2], "u_col")], "write")
    decayed = op("Mul", [decay, "state_in"], "decayed")
    nodes.append(helper.make_node("Add", [decayed, write], ["state_out"], name=f"{s}/scan/state"))
    read = op("Mul", ["state_out", op("Unsqueeze", ["c_t", ax1], "c_row")], "read")
    nodes.append(
        helper.make_node("ReduceSum", [read, ax2], ["y_t"], name=f"{s}/scan/y", keepdims=0)
    )

    def vi(name: str) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    ins = [vi(x) for x in ("state_in", "u_t", "dt_t", "b_t", "c_t")]
    return helper.make_graph(nodes, f"{s}/scan_body", ins, [vi("state_out"), vi("y_t")])


@lowers("selective_scan", "selective_state_update")
def _selective_scan(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    u, dt, rate, bm, cm, d, z, dt_bias = (c.cast(v, c.dtype, "fp32", s) for v in i[:8])
    channels, state = (int(x.size) for x in c.graph.type_of(n.inputs[2]).dims)  # type: ignore[arg-type]
    dt = c.op("Softplus", [c.op("Add", [dt, c.op("Unsqueeze", [dt_bias, c.const([1])], s)], s)], s)
    shape = c.op("Concat", [c.dim(i[0], 0, s), c.const([channels, state])], s, axis=0)
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
    init = c.op("ConstantOfShape", [shape], s, value=zero)  # (B, D, N)
    if len(i) > 8:  # the carried state for one new token, zeros for several
        one = c.op("Equal", [c.dim(i[0], 2, s), c.const([1])], s)
        init = c.op("Where", [one, c.cast(i[8], c.dtype, "fp32", s), init], s)
    final, y = c.op(
        "Scan",
        [init, u, dt, bm, cm],
        s,
        n_out=2,
        body=_step_body(c, s, rate),
        num_scan_inputs=4,
        scan_input_axes=[2] * 4,
        scan_output_axes=[2],
    )  # final (B, D, N); y (B, D, T)
    y = c.op("Add", [y, c.op("Mul", [u, c.op("Unsqueeze", [d, c.const([1])], s)], s)], s)
    y = c.op("Mul", [y, c.op("Mul", [z, c.op("Sigmoid", [z], s)], s)], s)  # the gate silu(z)
    c.final_from_fp32(y, n, [o[0]])
    c.named("Identity", [final], [o[1]], f"{s}/state")
