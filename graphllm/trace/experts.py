"""A traced `experts` event -> graphllm's MoE rows, as the builder emits them: the tokens into
expert slots (moe_dispatch), each expert's gate-up and down matmuls on its slots, the gated
activation, and the router-weighted combine back to the tokens.

transformers hands its experts the tokens flattened, (B*T, d), with the router's top-k choices
and weights (B*T, k); the rows take them per batch and position, so views regroup them on the
way in and out. The slots of an expert are balanced routing's B*T*k/E (the binding C), so FLOPs
count exactly the routed pairs and bytes the experts the tokens touch.
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction
from typing import Any

from graphllm.ir import Dim, Graph, Ref, TensorType
from graphllm.ops.generic import generic_row

SLOTS = Dim("C", "slot", positions=("P", "P+T"))


def lower_experts(g: Graph, p: str, ins: list[Ref], act: str, transposed: bool) -> Ref:
    """The experts of scope `p` on (hidden, top-k index, top-k weights, gate_up, down) refs;
    returns the (B*T, d) output."""
    hidden, index, weights, gate_up, down = ins
    flat = g.type_of(hidden)
    b, t = _batch_and_tokens(g)
    x = _regroup(g, f"{p}.unflatten", hidden, (b, t, flat.dims[-1]))
    idx = _regroup(g, f"{p}.unflatten_index", index, (b, t, g.type_of(index).dims[-1]))
    w = _regroup(g, f"{p}.unflatten_weights", weights, (b, t, g.type_of(weights).dims[-1]))
    n_exp = g.type_of(gate_up).dims[0]
    k = g.type_of(index).dims[-1]
    _note_routing(g, int(n_exp.size), int(k.size))  # type: ignore[arg-type]
    pairs = int(g.bindings["B"] * g.bindings["T"]) * int(k.size)  # type: ignore[arg-type]
    e = int(n_exp.size)  # type: ignore[arg-type]
    g.bindings["C"] = pairs // e if pairs % e == 0 else Fraction(pairs, e)
    slots = g.add("moe_dispatch", f"{p}.dispatch", (x, idx), {"axes": {"x": n_exp, "c": SLOTS}})
    matmul = "expert_matmul" if transposed else "expert_linear"
    gu = g.add(matmul, f"{p}.gate_up", (slots, gate_up))
    # gate and up: each the width the down projection takes in
    half = g.type_of(down).dims[1 if transposed else -1]
    gate_up_parts = {"sizes": [half.size, half.size], "axes": {"f1": half, "f2": half}}
    split = g.add("split", f"{p}.chunk", (gu,), gate_up_parts)
    gate = g.add(act, f"{p}.act_fn", (Ref(split.name, 0),))
    m = g.add("mul", f"{p}.mul", (gate, Ref(split.name, 1)))
    y = g.add(matmul, f"{p}.down", (m, down))
    out = g.add("moe_combine", f"{p}.combine", (y, w, idx))
    return _regroup(g, f"{p}.flatten", Ref(out.name), flat.dims)


def _note_routing(g: Graph, experts: int, k: int) -> None:
    """The experts and choices the graph routes over, into its config where that names them
    otherwise (Aria's moe_num_experts, moe_topk): the costs' expected reads use them."""
    cfg = g.meta.get("config")
    if cfg is not None and (cfg.num_experts, cfg.num_experts_per_tok) != (experts, k):
        g.meta["config"] = replace(cfg, num_experts=experts, num_experts_per_tok=k)


def _batch_and_tokens(g: Graph) -> tuple[Dim, Dim]:
    dims = g["input_ids"].out.dims
    return dims[0], dims[1]


def _regroup(g: Graph, name: str, x: Ref, dims: tuple[Dim, ...]) -> Ref:
    """A view of x as `dims`: (B*T, ...) <-> (B, T, ...), the tokens' positions kept."""
    src = g.type_of(x)
    shape = tuple(int(s) for s in TensorType(dims, src.dtype).shape(g.bindings))
    # a cut of the batch (dp, ep) is a cut of the flat tokens' outer factor, and back; of one
    # sequence, a cut of its positions
    one = g.bindings["B"] == 1
    if len(dims) > src.rank:  # unflatten: a -> (c d)
        sig, same, carries = "a b -> c d b", (("d", "a"),), (("a", "d" if one else "c"),)
        axes = {"c": dims[0], "d": dims[1]}
    else:  # flatten: (a b) -> c
        sig, same, carries = "a b c -> d c", (("d", "b"),), (("b" if one else "a", "d"),)
        axes = {"d": dims[0]}
    op = generic_row("view", sig, same, carries=carries)
    attrs: dict[str, Any] = {"args": (None, shape), "sym_args": (None, shape), "kwargs": {}}
    attrs |= {"aten": "view", "dtypes": [src.dtype], "shape": shape, "shapes": [shape]}
    attrs["axes"] = axes
    return Ref(g.add(op, name, (x,), attrs).name)
