"""Modules recorded whole as one of graphllm's rows: RMSNorm here; eager experts modules
(graphllm.trace.expert_units) and ScatterMoE blocks (graphllm.trace.routed_blocks) through
`lifting_experts`.

transformers tags its norms for kernel swapping (`use_kernel_forward_from_hub("RMSNorm")`), a
promise that the module computes what the kernel does; graphllm holds it to that. Each norm
class is run once on small random values outside the trace and compared with the `rmsnorm`
row's reference (weight x or (1 + weight) x, the offset found so); a class that matches
neither is traced op by op. A lifted norm is one `rmsnorm` event: one read and one write, as
a fused kernel, rather than the squares, means and casts of the reference code.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from graphllm.ops.core import _rmsnorm
from graphllm.trace.expert_units import experts_stand_ins
from graphllm.trace.routed_blocks import routed_stand_ins

_EPS_ATTRS = ("variance_epsilon", "eps", "epsilon")


def norm_units(model: Any) -> dict[str, dict[str, float]]:
    """Module path -> the rmsnorm row's attrs, for each RMSNorm module that computes the row
    (checked once a class and a shape)."""
    known = getattr(model, "_graphllm_norm_units", None)
    if known is not None:
        return known
    checked: dict[tuple, dict[str, float] | None] = {}
    out = {}
    for path, m in model.named_modules():
        if not type(m).__name__.endswith("RMSNorm") or not _plain_norm(m):
            continue
        eps = next(float(getattr(m, a)) for a in _EPS_ATTRS if hasattr(m, a))
        key = (type(m), tuple(m.weight.shape), eps)
        if key not in checked:
            checked[key] = _row_attrs(m, eps)
        if checked[key] is not None:
            out[path] = checked[key]
    model._graphllm_norm_units = out
    return out


def _plain_norm(m: Any) -> bool:
    params = dict(m.named_parameters())
    return (
        set(params) == {"weight"}
        and params["weight"].dim() == 1
        and not list(m.named_buffers())
        and any(isinstance(getattr(m, a, None), float) for a in _EPS_ATTRS)
    )


def _row_attrs(m: Any, eps: float) -> dict[str, float] | None:
    import torch

    d = int(m.weight.shape[0])
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, d, generator=gen)
    w = torch.randn(d, generator=gen)
    with torch.no_grad():
        y = torch.func.functional_call(m, {"weight": w}, (x,)).float().numpy()
    for offset in (0.0, 1.0):
        attrs = {"eps": eps, "weight_offset": offset}
        if np.allclose(_rmsnorm([x.numpy(), w.numpy()], attrs), y, rtol=1e-5, atol=1e-5):
            return attrs
    return None


@contextmanager
def lifting(model: Any, box: Any) -> Iterator[None]:
    """Within the block, each lifted norm's forward is one `rmsnorm` event."""
    units = norm_units(model)
    modules = dict(model.named_modules())
    handles = []
    for path, attrs in units.items():
        handles += _lift(modules[path], attrs, box, path)
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _lift(module: Any, attrs: dict[str, float], box: Any, path: str) -> list[Any]:
    def pre(mod: Any, args: Any) -> None:
        box.silent += 1

    def post(mod: Any, args: Any, out: Any) -> None:
        box.silent -= 1
        # the norm's own scope: the global hooks that keep the scope stack ran first
        box.unit("rmsnorm", (args[0], mod.weight), dict(attrs), (out,), scope=path)

    return [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]


@contextmanager
def lifting_experts(model: Any, box: Any) -> Iterator[None]:
    """Within the block, each checked experts module's and ScatterMoE block's methods are
    their stand-ins, which record MoE events."""
    modules = dict(model.named_modules())
    swaps = experts_stand_ins(model, modules, box) | routed_stand_ins(model, modules, box)
    kept = {(p, a): modules[p].__dict__.get(a) for p, a in swaps}
    for (path, attr), fn in swaps.items():
        setattr(modules[path], attr, fn)
    try:
        yield
    finally:
        for (path, attr), own in kept.items():
            if own is None:
                delattr(modules[path], attr)
            else:
                setattr(modules[path], attr, own)
