"""Experts modules that compute in eager code of their own, recorded whole as graphllm's MoE rows.

An experts module behind transformers' `use_experts_implementation` calls the experts function
graphllm registers (graphllm.trace.capture). One that is not runs its own code: DBRX's loops over
the experts its tokens hit (`nonzero`), which reads the routing's values, so no trace follows
it. A module whose forward takes (hidden, top-k index, top-k weights) is held to computing what
graphllm's rows compute (dispatch into slots, gate and up, the gated activation, down, the
weighted combine): each class is run once on small random values outside the trace, beside the
rows' numpy references for every way its weights can be read (which tensor is the gate, the up
and the down projection, or a gate and up joined; each matrix (out, in) or (in, out); stacked
(E, rows, cols) or flat (E * rows, cols)). The one form that matches is recorded as an `experts`
event; a class that matches none runs its own code, traced op by op.
"""

from __future__ import annotations

import copy
import inspect
import itertools
from collections.abc import Iterator
from functools import reduce
from typing import Any

import numpy as np

from graphllm.ir import Dim
from graphllm.ops import OPS

# where an experts module keeps its count of experts
_EXPERT_COUNTS = ("num_experts", "num_local_experts", "moe_num_experts", "n_routed_experts")
# the gated activations graphllm has rows for
_ACTS = ("silu", "gelu_tanh")
_TOKENS = 6  # tokens of the random check, two choices each


def experts_units(model: Any) -> dict[str, dict[str, Any]]:
    """Module path -> its form (the `experts` event's attrs and the weights it reads, by their
    path in the module), for each eager experts module that computes graphllm's rows (checked
    once a class, expert count and weight shapes)."""
    known = getattr(model, "_graphllm_experts_units", None)
    if known is not None:
        return known
    checked: dict[tuple, dict[str, Any] | None] = {}
    out = {}
    for path, m in model.named_modules():
        experts = _candidate(m)
        if experts is None:
            continue
        shapes = tuple((n, tuple(p.shape)) for n, p in m.named_parameters())
        key = (type(m), experts, shapes)
        if key not in checked:
            checked[key] = _form(m, experts)
        if checked[key] is not None:
            out[path] = checked[key]
    model._graphllm_experts_units = out
    return out


def _candidate(m: Any) -> int | None:
    """The expert count of an experts module that runs its own code on (hidden, top-k index,
    top-k weights); None for any other module."""
    if hasattr(m, "has_gate"):  # behind transformers' experts interface: graphllm's function
        return None
    try:
        takes = list(inspect.signature(type(m).forward).parameters.values())[1:]
    except (TypeError, ValueError):
        return None
    names = [p.name for p in takes]
    if len(names) != 3 or "index" not in names[1] or "weight" not in names[2]:
        return None
    count = next((getattr(m, a) for a in _EXPERT_COUNTS if isinstance(getattr(m, a, None), int)), 0)
    return count or None


def _form(m: Any, experts: int) -> dict[str, Any] | None:
    params = {n: tuple(p.shape) for n, p in m.named_parameters()}
    forms = list(_forms(params, experts))
    matched = []
    for rank in (2, 3):
        # by (hidden, width): the module at small widths, its weights and output (None where
        # it fails)
        runs: dict[tuple[int, int], Any] = {}
        for form in forms:
            key = (form["hidden"], form["width"])
            if key not in runs:
                runs[key] = _run(m, _small_widths(*key, experts), experts, rank)
            values, y = runs[key]
            if y is not None and _matches(form, values, y, experts):
                matched.append((rank, form))
                break
    if not matched:
        return None
    form = dict(matched[0][1], ranks=sorted({r for r, f in matched if f == matched[0][1]}))
    del form["hidden"], form["width"]
    return form


def _small_widths(d: int, f: int, experts: int) -> dict[int, int]:
    """The widths a class is checked at: the hidden size d and the experts' width f (and the
    2f of a joined gate-up, the E*f rows of a flat stack) a few elements each."""
    small = {d: 12, f: 12 if f == d else 10}
    for big, to in ((2 * f, 2 * small[f]), (experts * f, experts * small[f])):
        small.setdefault(big, to)
    return small


def shrunk(m: Any, sizes: dict[int, int]) -> tuple[Any, dict[str, np.ndarray]]:
    """A copy of module `m` on the CPU at the widths `sizes` maps (every int attribute of it
    and its submodules of a mapped value, every weight axis), its weights random, and those
    weights: a class's code is checked at a few elements a width, not at the model's size. A
    class whose code reads a width from elsewhere fails or computes otherwise, and is not
    lifted."""
    import torch

    small = copy.deepcopy(m)
    for sub in small.modules():
        for k, v in list(vars(sub).items()):
            if type(v) is int and v in sizes:
                setattr(sub, k, sizes[v])
    gen = np.random.default_rng(0)
    values = {}
    for name, p in list(small.named_parameters()):
        shape = tuple(sizes.get(int(n), int(n)) for n in p.shape)
        values[name] = (gen.standard_normal(shape) * 0.5).astype(np.float32)
        owner, _, attr = name.rpartition(".")
        held = small.get_submodule(owner) if owner else small
        held._parameters[attr] = torch.nn.Parameter(torch.from_numpy(values[name]), False)
    return small, values


def _matrices(shape: tuple[int, ...], experts: int) -> tuple[int, int, bool] | None:
    """A weight's per-expert matrix (rows, cols) and whether it is stored flat (E * rows,
    cols); None where it holds no matrix an expert."""
    if len(shape) == 3 and shape[0] == experts:
        return shape[1], shape[2], False
    if len(shape) == 2 and shape[0] % experts == 0 and shape[0] > experts:
        return shape[0] // experts, shape[1], True
    return None


def _forms(params: dict[str, tuple[int, ...]], experts: int) -> Iterator[dict[str, Any]]:
    """Every reading of the weights as gate, up and down (or gate_up and down) whose sizes
    chain, with each activation."""
    mats = {n: _matrices(s, experts) for n, s in params.items()}
    if len(params) not in (2, 3) or any(v is None for v in mats.values()):
        return
    roles = ("gate", "up", "down") if len(params) == 3 else ("gate_up", "down")
    for names in itertools.permutations(params):
        for layouts in itertools.product(("linear", "matmul"), repeat=len(names)):
            # (in, out) of each matrix as it is read
            io = [
                (c, r) if lay == "linear" else (r, c)
                for (r, c, _), lay in zip((mats[n] for n in names), layouts, strict=True)
            ]
            d, f = io[-1][1], io[-1][0]
            width = [f] * (len(io) - 1) if len(io) == 3 else [2 * f]
            if any(i != d or o != w for (i, o), w in zip(io[:-1], width, strict=True)):
                continue
            for act in _ACTS:
                yield {
                    "act": act,
                    "roles": roles,
                    "weights": names,
                    "layouts": layouts,
                    "flat": tuple(mats[n][2] for n in names),  # type: ignore[index]
                    "experts": experts,
                    "hidden": d,
                    "width": f,
                }


def _inputs(d: int, experts: int, rank: int) -> tuple[np.ndarray, ...]:
    gen = np.random.default_rng(1)
    x = gen.standard_normal((_TOKENS, d)).astype(np.float32)
    k = min(2, experts)
    idx = np.stack([gen.permutation(experts)[:k] for _ in range(_TOKENS)]).astype(np.int64)
    w = gen.random((_TOKENS, k)).astype(np.float32)
    return (x if rank == 2 else x.reshape(2, _TOKENS // 2, d)), idx, w


def _run(m: Any, sizes: dict[int, int], experts: int, rank: int) -> tuple[dict, Any]:
    """The module at small widths: its weights, and its output on the random inputs (None where
    it fails or changes the hidden states' shape)."""
    import torch

    try:
        small, values = shrunk(m, sizes)
        x, idx, w = _inputs(next(iter(sizes.values())), experts, rank)
        with torch.no_grad():
            y = small(torch.from_numpy(x), torch.from_numpy(idx), torch.from_numpy(w))
    except Exception:  # a module that fails on them computes something else
        return {}, None
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != x.shape:
        return values, None
    return values, y.float().numpy()


def _matches(form: dict[str, Any], values: dict[str, np.ndarray], y: Any, experts: int) -> bool:
    x, idx, w = _inputs(y.shape[-1], experts, y.ndim)
    ours = rows_reference(form, [values[n] for n in form["weights"]], x, idx, w)
    return bool(np.allclose(ours.reshape(y.shape), y, rtol=1e-4, atol=1e-5))


def rows_reference(
    form: dict[str, Any], weights: list[np.ndarray], x: Any, idx: Any, w: Any
) -> np.ndarray:
    """What graphllm's rows compute for experts of `form` (tokens (N, d), top-k (N, k)): the
    op table's own references, row by row."""
    e = form["experts"]
    mats = dict(zip(form["roles"], weights, strict=True))
    layout = dict(zip(form["roles"], form["layouts"], strict=True))

    def run(op: str, *xs: Any, **attrs: Any) -> Any:
        return OPS[op].impl(list(xs), attrs)  # type: ignore[misc]

    def matmul(s: Any, role: str) -> Any:
        m = mats[role].reshape(e, -1, mats[role].shape[-1])
        return run("expert_linear" if layout[role] == "linear" else "expert_matmul", s, m)

    xb, ib, wb = x.reshape(1, -1, x.shape[-1]), idx[None], w[None]
    slots = run("moe_dispatch", xb, ib, axes={"x": Dim("e", "expert", e)})
    if "gate_up" in mats:
        gate, up = np.split(matmul(slots, "gate_up"), 2, axis=-1)
    else:
        gate, up = matmul(slots, "gate"), matmul(slots, "up")
    y = matmul(run("mul", run(form["act"], gate), up), "down")
    return run("moe_combine", y, wb, ib)[0]


def experts_stand_ins(model: Any, modules: dict[str, Any], box: Any) -> dict[tuple[str, str], Any]:
    """(module path, "forward") -> the stand-in that records it, for each lifted experts module:
    an `experts` event for the hidden states' ranks its check passed, its own code for any
    other."""
    return {
        (path, "forward"): _stand_in(modules[path], form, box, modules[path].forward)
        for path, form in experts_units(model).items()
    }


def _stand_in(m: Any, form: dict[str, Any], box: Any, own: Any) -> Any:
    attrs = {k: form[k] for k in ("act", "roles", "layouts", "flat", "experts")}

    def forward(hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
        import torch

        if hidden.dim() not in form["ranks"]:
            return own(hidden, top_k_index, top_k_weights)
        with box.quiet():
            out = torch.empty_like(hidden)
        # read at call time: the tensors the traced forward swapped in
        weights = tuple(reduce(getattr, n.split("."), m) for n in form["weights"])
        box.unit("experts", (hidden, top_k_index, top_k_weights, *weights), dict(attrs), (out,))
        return out

    return forward
