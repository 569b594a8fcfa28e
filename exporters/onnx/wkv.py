"""Decomposed ONNX lowerings of RWKV's WKV rows (graphllm.ops.wkv).

`wkv4_scan` and `wkv4_scan_state` are one Scan over the new tokens, the state (num, den, max;
each (B, D)) carried in fp32, as the Mamba-1 and delta-rule rows lower. Why not a loop-free
form: the running maximum that keeps the exponentials finite is itself a recurrence (each
token's depends on the last), so no cumulative sum over the tokens gives the same values. The
body is transformers' loop step for step; w = -exp(time_decay) is computed once outside it.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from graphllm.exporters.onnx.lowering import Lowering, lowers
from graphllm.ir import Node
from graphllm.ops.wkv import NO_MAX


def _step_body(c: Lowering, s: str, decay: str, first: str) -> object:
    """The Scan body: num, den, max (B, D) and one token's k, v (B, D) -> the next state and
    the token's output."""
    nodes = []

    def op(kind: str, ins: list[str], name: str, out: str | None = None) -> str:
        out = out or f"{s}/scan/{name}"
        nodes.append(helper.make_node(kind, ins, [out], name=f"{s}/scan/{name}"))
        return out

    def mix(scale_old: str, scale_new: str, tag: str) -> tuple[str, str, str]:
        """e^(old - m) num + e^(new - m) v and e^(old - m) den + e^(new - m), m the larger."""
        top = op("Max", [scale_old, scale_new], f"{tag}_max")
        e1 = op("Exp", [op("Sub", [scale_old, top], f"{tag}_d1")], f"{tag}_e1")
        e2 = op("Exp", [op("Sub", [scale_new, top], f"{tag}_d2")], f"{tag}_e2")
        old_num, new_num = op("Mul", [e1, "num_in"], f"{tag}_a"), op("Mul", [e2, "v_t"], f"{tag}_b")
        num = op("Add", [old_num, new_num], f"{tag}_num")
        den = op("Add", [op("Mul", [e1, "den_in"], f"{tag}_c"), e2], f"{tag}_den")
        return num, den, top

    num, den, _ = mix("max_in", op("Add", ["k_t", first], "uk"), "out")
    op("Div", [num, den], "y", "y_t")
    num, den, top = mix(op("Add", ["max_in", decay], "pw"), "k_t", "state")
    for src, dst in ((num, "num_out"), (den, "den_out"), (top, "max_out")):
        op("Identity", [src], dst, dst)

    def vi(name: str) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    ins = [vi(x) for x in ("num_in", "den_in", "max_in", "k_t", "v_t")]
    outs = [vi(x) for x in ("num_out", "den_out", "max_out", "y_t")]
    return helper.make_graph(nodes, f"{s}/scan_body", ins, outs)


@lowers("wkv4_scan", "wkv4_scan_state")
def _wkv4(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    k, v, decay, first = (c.cast(x, c.dtype, "fp32", s) for x in i[:4])
    decay = c.op("Neg", [c.op("Exp", [decay], s)], s)  # w = -exp(time_decay)
    # the body reads u from the outer graph: a node of it reads the weight (an initializer is
    # written for what the outer graph's nodes read)
    first = c.op("Identity", [first], s)
    if len(i) > 4:
        state = [c.cast(x, c.dtype, "fp32", s) for x in i[4:7]]
    else:  # transformers' default: num = den = 0, max = -1e38, each (B, D)
        channels = int(c.graph.type_of(n.inputs[2]).dims[0].size)  # type: ignore[arg-type]
        shape = c.op("Concat", [c.dim(i[0], 0, s), c.const([channels])], s, axis=0)
        fills = [helper.make_tensor("fill", TensorProto.FLOAT, [1], [x]) for x in (0, 0, NO_MAX)]
        state = [c.op("ConstantOfShape", [shape], s, value=fill) for fill in fills]
    num, den, top, y = c.op(
        "Scan",
        [*state, k, v],
        s,
        n_out=4,
        body=_step_body(c, s, decay, first),
        num_scan_inputs=2,
        scan_input_axes=[1, 1],
        scan_output_axes=[1],
    )  # the final num, den, max (B, D); y (B, T, D)
    c.final_from_fp32(y, n, [o[0]])
    for src, dst, tag in ((num, o[1], "num"), (den, o[2], "den"), (top, o[3], "max")):
        c.named("Identity", [src], [dst], f"{s}/{tag}")
