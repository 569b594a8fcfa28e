"""A traced `experts` event -> graphllm's MoE rows, as the builder emits them: the tokens into
expert slots (moe_dispatch), each expert's gate-up and down matmuls on its slots, the gated
activation, and the router-weighted combine back to the tokens.

transformers hands its experts the tokens flattened, (B*T, d), with the router's top-k choices
and weights (B*T, k); the rows take them per batch and position, so views regroup them on the
way in and out (an eager experts module, DBRX's, takes them per position already). The slots of
an expert are balanced routing's B*T*k/E (the binding C), so FLOPs count exactly the routed
pairs and bytes the experts the tokens touch. A mixture of attention heads (JetMoE's `map` and
`reduce`) routes each (token, choice) pair's own vector: `experts_map` reads each pair's query
back from its slot uncombined (moe_gather), `experts_reduce` dispatches each pair's attention
output (moe_dispatch_pairs) and combines the experts' outputs as the MLP's do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction
from typing import Any

from graphllm.ir import Dim, Graph, Ref, TensorType
from graphllm.ops.generic import generic_row

SLOTS = Dim("C", "slot", positions=("P", "P+T"))


def lower_experts(
    g: Graph, p: str, ins: list[Ref], attrs: dict[str, Any], const_dim: Callable[[int], Dim]
) -> Ref:
    """The experts of scope `p` on (hidden, top-k index, top-k weights, *weights) refs, the
    weights read as `attrs` say (`roles`: gate_up and down, or gate, up and down; `layouts`:
    each (out, in), `linear`, or (in, out), `matmul`; `flat`: stored (E * rows, cols), DBRX's
    w1, v1 and w2); returns the output in the hidden states' shape: (B*T, d) as transformers'
    experts interface hands them, or (B, T, d)."""
    hidden, index, weights, *stacks = ins
    given = g.type_of(hidden)
    x = _per_position(g, f"{p}.unflatten", hidden)
    idx = _per_position(g, f"{p}.unflatten_index", index)
    w = _per_position(g, f"{p}.unflatten_weights", weights)
    flat = attrs.get("flat", (False,) * len(stacks))
    first = g.type_of(stacks[0]).dims[0]
    n_exp = Dim("e", "expert", attrs["experts"]) if flat[0] else first
    mats = {
        role: _per_expert(g, f"{p}.{role}_per_expert", r, n_exp, const_dim) if f else r
        for role, r, f in zip(attrs["roles"], stacks, flat, strict=True)
    }
    layout = dict(zip(attrs["roles"], attrs["layouts"], strict=True))
    slots = _dispatch(g, f"{p}.dispatch", "moe_dispatch", x, idx, n_exp)

    def matmul(name: str, role: str, s: Any) -> Ref:
        op = "expert_linear" if layout[role] == "linear" else "expert_matmul"
        return Ref(g.add(op, f"{p}.{name}", (s, mats[role])).name)

    if "gate_up" in mats:
        gu = matmul("gate_up", "gate_up", slots)
        # gate and up: each the width the down projection takes in
        half = g.type_of(mats["down"]).dims[-1 if layout["down"] == "linear" else 1]
        gate_up_parts = {"sizes": [half.size, half.size], "axes": {"f1": half, "f2": half}}
        split = g.add("split", f"{p}.chunk", (gu,), gate_up_parts)
        gate, up = Ref(split.name, 0), Ref(split.name, 1)
    else:
        gate, up = matmul("gate", "gate", slots), matmul("up", "up", slots)
    m = g.add("mul", f"{p}.mul", (g.add(attrs["act"], f"{p}.act_fn", (gate,)), up))
    y = matmul("down", "down", m)
    out = Ref(g.add("moe_combine", f"{p}.combine", (y, w, idx)).name)
    return out if given.rank == 3 else _regroup(g, f"{p}.flatten", out, given.dims)


def lower_experts_map(g: Graph, p: str, ins: list[Ref]) -> Ref:
    """A mixture of attention heads' query projections on (hidden (B, T, d), top-k index,
    input stack) refs: each (token, choice) pair's query from its expert, (B, T, k, f)."""
    hidden, index, stack = ins
    idx = _per_position(g, f"{p}.unflatten_index", index)
    slots = _dispatch(g, f"{p}.dispatch", "moe_dispatch", hidden, idx, g.type_of(stack).dims[0])
    y = g.add("expert_linear", f"{p}.input_linear", (slots, stack))
    return Ref(g.add("moe_gather", f"{p}.gather", (y, idx)).name)


def lower_experts_reduce(g: Graph, p: str, ins: list[Ref]) -> Ref:
    """A mixture of attention heads' output projections on (each pair's output (B, T, k, f),
    top-k index, top-k weights, output stack) refs: the pairs through their experts, weighted
    and summed, (B, T, d)."""
    pairs, index, weights, stack = ins
    idx = _per_position(g, f"{p}.unflatten_pairs_index", index)
    w = _per_position(g, f"{p}.unflatten_weights", weights)
    n_exp = g.type_of(stack).dims[0]
    slots = _dispatch(g, f"{p}.dispatch_pairs", "moe_dispatch_pairs", pairs, idx, n_exp)
    y = g.add("expert_linear", f"{p}.output_linear", (slots, stack))
    return Ref(g.add("moe_combine", f"{p}.combine", (y, w, idx)).name)


def _dispatch(g: Graph, name: str, op: str, x: Ref, idx: Ref, n_exp: Dim) -> Ref:
    """x into the experts' slots: balanced routing's B*T*k/E an expert (the binding C)."""
    k = g.type_of(idx).dims[-1]
    _note_routing(g, int(n_exp.size), int(k.size))  # type: ignore[arg-type]
    pairs = int(g.bindings["B"] * g.bindings["T"]) * int(k.size)  # type: ignore[arg-type]
    e = int(n_exp.size)  # type: ignore[arg-type]
    g.bindings["C"] = pairs // e if pairs % e == 0 else Fraction(pairs, e)
    return Ref(g.add(op, name, (x, idx), {"axes": {"x": n_exp, "c": SLOTS}}).name)


def _per_position(g: Graph, name: str, x: Ref) -> Ref:
    """A (B*T, ...) tensor of the flat tokens as (B, T, ...); one per position already as is."""
    src = g.type_of(x)
    if src.rank == 3:
        return x
    b, t = _batch_and_tokens(g)
    return _regroup(g, name, x, (b, t, src.dims[-1]))


def _per_expert(g: Graph, name: str, x: Ref, n_exp: Dim, const_dim: Callable[[int], Dim]) -> Ref:
    """A flat stack of the experts' matrices (E * rows, cols) as (E, rows, cols); the weight
    notes how many experts its rows hold, which its active count reads."""
    src = g.type_of(x)
    rows = const_dim(int(src.dims[0].size) // int(n_exp.size))  # type: ignore[arg-type]
    g[x.node].attrs["experts"] = n_exp.size
    dims = (n_exp, rows, src.dims[1])
    # an ep cut of the flat rows is a cut of the experts
    return _view(g, name, x, dims, "a b -> c d b", (), (("a", "c"),), {"c": n_exp, "d": rows})


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
    # a cut of the batch (dp, ep) is a cut of the flat tokens' outer factor, and back; of one
    # sequence, a cut of its positions
    one = g.bindings["B"] == 1
    if len(dims) > src.rank:  # unflatten: a -> (c d)
        sig, same, carries = "a b -> c d b", (("d", "a"),), (("a", "d" if one else "c"),)
        axes = {"c": dims[0], "d": dims[1]}
    else:  # flatten: (a b) -> c
        sig, same, carries = "a b c -> d c", (("d", "b"),), (("b" if one else "a", "d"),)
        axes = {"d": dims[0]}
    return _view(g, name, x, dims, sig, same, carries, axes)


def _view(
    g: Graph,
    name: str,
    x: Ref,
    dims: tuple[Dim, ...],
    sig: str,
    same: tuple[tuple[str, str], ...],
    carries: tuple[tuple[str, str], ...],
    axes: dict[str, Dim],
) -> Ref:
    src = g.type_of(x)
    shape = tuple(int(s) for s in TensorType(dims, src.dtype).shape(g.bindings))
    op = generic_row("view", sig, same, carries=carries)
    attrs: dict[str, Any] = {"args": (None, shape), "sym_args": (None, shape), "kwargs": {}}
    attrs |= {"aten": "view", "dtypes": [src.dtype], "shape": shape, "shapes": [shape]}
    attrs["axes"] = axes
    return Ref(g.add(op, name, (x,), attrs).name)
