"""Decomposed ONNX lowerings of the linear recurrence rows (graphllm.ops.lru, the RG-LRU's
scan).

`linear_recurrence` and `linear_recurrence_state` are one Scan over the new tokens, the state
(B, D) carried in fp32, as Mamba-1's rows lower (exporters/onnx/mamba1.py): each step is a
multiply and an add. The state row starts from its state input at any length, as transformers'
RG-LRU does after a past (one token or several).

`one_token_state` is a Where on the step's length: the carried conv inputs for one new token,
zeros (the state less itself, of its shape and dtype) for several.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from graphllm.exporters.onnx.lowering import Lowering, lowers
from graphllm.ir import Node


def _step_body(s: str) -> object:
    """The Scan body: state (B, D) and one token's x, a (B, D) -> the next state, twice (the
    carried one and the token's y)."""
    decayed = f"{s}/scan/decayed"
    nodes = [
        helper.make_node("Mul", ["a_t", "state_in"], [decayed], name=decayed),
        helper.make_node("Add", [decayed, "x_t"], ["state_out"], name=f"{s}/scan/state"),
        helper.make_node("Identity", ["state_out"], ["y_t"], name=f"{s}/scan/y"),
    ]

    def vi(name: str) -> object:
        return helper.make_tensor_value_info(name, TensorProto.FLOAT, None)

    ins = [vi(x) for x in ("state_in", "x_t", "a_t")]
    return helper.make_graph(nodes, f"{s}/scan_body", ins, [vi("state_out"), vi("y_t")])


@lowers("linear_recurrence", "linear_recurrence_state")
def _linear_recurrence(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    dtypes = [c.graph.type_of(r).dtype for r in n.inputs]  # type: ignore[arg-type]
    x, a, *state = (c.cast(v, c.dtype if t is None else t, "fp32", s) for v, t in zip(i, dtypes))
    if state:
        init = state[0]
    else:
        zero = helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0])
        shape = c.op("Concat", [c.dim(i[0], 0, s), c.dim(i[0], 2, s)], s, axis=0)
        init = c.op("ConstantOfShape", [shape], s, value=zero)  # (B, D)
    final, y = c.op(
        "Scan",
        [init, x, a],
        s,
        n_out=2,
        body=_step_body(s),
        num_scan_inputs=2,
        scan_input_axes=[1, 1],
        scan_output_axes=[1],
    )  # final (B, D); y (B, T, D)
    c.final_from_fp32(y, n, [o[0]])
    c.named("Identity", [final], [o[1]], f"{s}/state")


@lowers("one_token_state")
def _one_token_state(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    s = n.name
    one = c.op("Equal", [c.dim(i[1], 2, s), c.const([1])], s)
    zeros = c.op("Sub", [i[0], i[0]], s)  # of the state's shape and dtype
    c.final("Where", [one, i[0], zeros], n, o)
