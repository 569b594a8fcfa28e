"""Routed blocks in ScatterMoE's layout (JetMoE's MoE and its mixture of attention heads),
recorded as graphllm's MoE rows.

ScatterMoE's blocks route with a gating module (`router`: its `layer` the router's linear, `top_k`
choices) that sorts the (token, choice) pairs by expert and hands each expert's count to Python
(`.tolist()`), by which `input_linear` and `output_linear` (E stacked (out, in) matrices) cut the
sorted rows: a trace cannot follow the counts. Such a block is recorded in graphllm's terms
instead, its routing the router's linear, the top k of its logits (fp32) and a softmax over those
k, once its class, run on small random values outside the trace, computes what graphllm's rows
compute:
- an MoE block (its forward on (B, T, d)): the experts' rows (dispatch, `input_linear` as the
  joined gate-up, the gated activation, `output_linear` as down, the weighted combine) and its
  bias (an `experts` event);
- a mixture of attention heads (`map` and `reduce` around the attention): `map` gives each
  (token, choice) pair the query of its expert's `input_linear` (an `experts_map` event: dispatch,
  expert_linear, moe_gather, (B, T, k, h d)); `reduce` takes each pair's attention output through
  its expert's `output_linear`, weighted by the router and summed, and adds the bias (an
  `experts_reduce` event: moe_dispatch_pairs, expert_linear, moe_combine).
A class that computes otherwise runs its own code (and its trace fails at the counts).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir import Dim
from graphllm.ops import OPS
from graphllm.trace.expert_units import rows_reference, shrunk

_ACTS = ("silu", "gelu_tanh")


def routed_units(model: Any) -> dict[str, dict[str, Any]]:
    """Module path -> its form ({"kind": "mlp", "act": ...} or {"kind": "attention"}) for each
    ScatterMoE block that computes graphllm's rows (checked once a class and weight shapes)."""
    known = getattr(model, "_graphllm_routed_units", None)
    if known is not None:
        return known
    checked: dict[tuple, dict[str, Any] | None] = {}
    out = {}
    for path, m in model.named_modules():
        if not _scatter_block(m):
            continue
        key = (type(m), tuple((n, tuple(p.shape)) for n, p in m.named_parameters()))
        if key not in checked:
            checked[key] = _form(m)
        if checked[key] is not None:
            out[path] = checked[key]
    model._graphllm_routed_units = out
    return out


def _scatter_block(m: Any) -> bool:
    router, up, down = (getattr(m, a, None) for a in ("router", "input_linear", "output_linear"))
    layer = getattr(router, "layer", None)
    bias = getattr(m, "bias", None)
    return (
        isinstance(getattr(router, "top_k", None), int)
        and getattr(layer, "bias", 0) is None
        and all(getattr(getattr(x, "weight", None), "dim", lambda: 0)() == 3 for x in (up, down))
        and bias is not None
        and bias.dim() == 1
        and sorted(n for n, _ in m.named_parameters())
        == ["bias", "input_linear.weight", "output_linear.weight", "router.layer.weight"]
    )


def _form(m: Any) -> dict[str, Any] | None:
    d = int(m.router.layer.weight.shape[-1])
    out, inner = int(m.input_linear.weight.shape[1]), int(m.output_linear.weight.shape[-1])
    # checked at a few elements a width (graphllm.trace.expert_units.shrunk): the hidden size,
    # the experts' width, and a joined gate-up's twice that
    sizes = {d: 12, inner: 12 if inner == d else 10}
    sizes.setdefault(out, 2 * sizes[inner] if out == 2 * inner else 14)
    attention = callable(getattr(type(m), "map", None)) and callable(
        getattr(type(m), "reduce", None)
    )
    try:
        real, values = shrunk(m, sizes)
        if attention:
            return {"kind": "attention"} if _attention_matches(real, values) else None
        return next((dict(kind="mlp", act=a) for a in _ACTS if _mlp_matches(real, values, a)), None)
    except Exception:  # a block that fails on them computes something else
        return None


def _route(values: dict[str, np.ndarray], x: np.ndarray, k: int) -> tuple[np.ndarray, ...]:
    logits = x @ values["router.layer.weight"].T
    top, idx = OPS["topk"].impl([logits], {"k": k})  # type: ignore[misc]
    w = np.exp(top - top.max(-1, keepdims=True))
    return idx, (w / w.sum(-1, keepdims=True)).astype(np.float32)


def _inputs(d: int) -> np.ndarray:
    return np.random.default_rng(1).standard_normal((2, 3, d)).astype(np.float32)


def _mlp_matches(real: Any, values: dict[str, np.ndarray], act: str) -> bool:
    import torch

    w_in = values["input_linear.weight"]
    x = _inputs(w_in.shape[-1])
    flat = x.reshape(-1, x.shape[-1])
    idx, w = _route(values, flat, real.router.top_k)
    form = {"experts": w_in.shape[0], "roles": ("gate_up", "down")}
    form |= {"layouts": ("linear", "linear"), "act": act}
    ours = rows_reference(form, [w_in, values["output_linear.weight"]], flat, idx, w)
    with torch.no_grad():
        theirs = real(torch.from_numpy(x))
    theirs = theirs[0] if isinstance(theirs, tuple) else theirs
    return _close(ours.reshape(x.shape) + values["bias"], theirs)


def _attention_matches(real: Any, values: dict[str, np.ndarray]) -> bool:
    import torch

    w_in, w_out = values["input_linear.weight"], values["output_linear.weight"]
    x = _inputs(w_in.shape[-1])
    b, t, d = x.shape
    idx, w = _route(values, x.reshape(-1, d), real.router.top_k)
    k = idx.shape[-1]
    a = np.random.default_rng(2).standard_normal((b, t, k, w_in.shape[1])).astype(np.float32)
    with torch.no_grad():
        q, _, topo = real.map(torch.from_numpy(x))
        out = real.reduce(torch.from_numpy(a), topo)
    query, reduced = rows_attention(w_in, w_out, x, idx.reshape(b, t, k), w.reshape(b, t, k), a)
    return _close(query, q) and _close(reduced + values["bias"], out)


def rows_attention(
    w_in: np.ndarray, w_out: np.ndarray, x: Any, idx: Any, w: Any, a: Any
) -> tuple[np.ndarray, np.ndarray]:
    """What graphllm's rows compute for a mixture of attention heads, (B, T, ...) inputs: each
    pair's query (B, T, k, h d), and the pairs' outputs `a` through their experts, combined."""
    axes = {"x": Dim("e", "expert", w_in.shape[0])}

    def run(op: str, *xs: Any, **attrs: Any) -> Any:
        return OPS[op].impl(list(xs), attrs)  # type: ignore[misc]

    query = run(
        "moe_gather", run("expert_linear", run("moe_dispatch", x, idx, axes=axes), w_in), idx
    )
    slots = run("moe_dispatch_pairs", a, idx, axes=axes)
    return query, run("moe_combine", run("expert_linear", slots, w_out), w, idx)


def _close(ours: np.ndarray, theirs: Any) -> bool:
    import torch

    if not isinstance(theirs, torch.Tensor) or tuple(theirs.shape) != ours.shape:
        return False
    return bool(np.allclose(ours, theirs.float().numpy(), rtol=1e-4, atol=1e-5))


def routed_stand_ins(model: Any, modules: dict[str, Any], box: Any) -> dict[tuple[str, str], Any]:
    """(module path, method) -> the stand-in that records it, for each checked block."""
    out: dict[tuple[str, str], Any] = {}
    for path, form in routed_units(model).items():
        m = modules[path]
        if form["kind"] == "mlp":
            out[(path, "forward")] = _mlp(m, form["act"], box)
        else:
            out[(path, "map")], out[(path, "reduce")] = _map(m, box, path), _reduce(m, box, path)
    return out


def _routing(m: Any, x: Any, box: Any) -> tuple[Any, Any, Any]:
    """The router's top-k choices and weights of the flat tokens, and its logits, as the block's
    own router computes them (the check held it to this)."""
    import torch

    # the router and the experts' stacks never run as modules: their classes give their
    # weights' kinds all the same
    for child in (m.router, m.input_linear, m.output_linear):
        box.rec.modules.setdefault(box.names[id(child)], type(child).__name__)
    logits = m.router.layer(x).float()
    top, idx = logits.topk(m.router.top_k, dim=1)
    return idx, torch.softmax(top, dim=1).type_as(x), logits


def _mlp(m: Any, act: str, box: Any) -> Any:
    attrs = {"act": act, "roles": ("gate_up", "down"), "layouts": ("linear", "linear")}

    def forward(layer_input: Any) -> Any:
        import torch

        idx, w, _ = _routing(m, layer_input.reshape(-1, layer_input.shape[-1]), box)
        with box.quiet():
            out = torch.empty_like(layer_input)
        weights = (m.input_linear.weight, m.output_linear.weight)
        box.unit("experts", (layer_input, idx, w, *weights), dict(attrs), (out,))
        return out + m.bias

    return forward


def _map(m: Any, box: Any, path: str) -> Any:
    def map(layer_input: Any) -> Any:
        import torch

        idx, w, logits = _routing(m, layer_input.reshape(-1, layer_input.shape[-1]), box)
        shape = (*layer_input.shape[:2], idx.shape[-1], m.input_linear.weight.shape[1])
        with box.quiet():
            out = torch.empty(shape, dtype=layer_input.dtype, device=layer_input.device)
        # the block's own scope: its methods are no module calls
        box.unit("experts_map", (layer_input, idx, m.input_linear.weight), {}, (out,), path)
        return out, logits, (idx, w)

    return map


def _reduce(m: Any, box: Any, path: str) -> Any:
    def reduce(layer_input: Any, topo_info: Any) -> Any:
        import torch

        idx, w = topo_info
        shape = (*layer_input.shape[:2], m.output_linear.weight.shape[1])
        with box.quiet():
            out = torch.empty(shape, dtype=layer_input.dtype, device=layer_input.device)
        ins = (layer_input, idx, w, m.output_linear.weight)
        box.unit("experts_reduce", ins, {}, (out,), path)
        return out + m.bias

    return reduce
