"""Complex tensors in a recording, as real pairs.

Llama 4 and DeepSeek-V2 rotate q and k as complex numbers (`torch.polar`, `view_as_complex`,
a complex product, `view_as_real`). graphllm's tensors are real, so a complex64 tensor of shape
(..., n) is recorded as the fp32 tensor (..., n, 2) of its real and imaginary parts, and each op
on one is written as the real ops that compute it: the two views are the same data, polar is
(r cos a, r sin a), a product of two is (ac - bd, ad + bc), a product with a real number scales
both parts. Any other op on a complex tensor is refused by name.
"""

from __future__ import annotations

from typing import Any

from graphllm.errors import ConfigError


def is_complex_op(args: Any, out: Any, torch: Any) -> bool:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    outs = out if isinstance(out, (tuple, list)) else (out,)
    tensors += [o for o in outs if isinstance(o, torch.Tensor)]
    return any(t.is_complex() for t in tensors)


def record_complex(box: Any, op: str, args: tuple, out: Any, torch: Any) -> None:
    """Record `op` on complex tensors as real events of `box` (graphllm.trace.capture._Box)."""
    kind = op.split(".")[1]
    if out is not None and isinstance(out, torch.Tensor) and out.dtype == torch.complex128:
        raise ConfigError(f"{box.scope or 'the model'} computes in complex128")
    if kind in ("view_as_complex", "view_as_real"):  # the same numbers, another view
        box.alias(out, box.val(args[0]))
        return
    if kind == "unsqueeze":
        dim = args[1] if args[1] >= 0 else args[1] - 1  # behind the pair axis
        box.emit("aten.unsqueeze.default", (box.val(args[0]), dim), out)
        return
    if kind == "polar":
        r, angle = (box.val(a) for a in args)
        shape = tuple(args[1].shape)
        cos = box.emit("aten.cos.default", (angle,), shape=shape)
        sin = box.emit("aten.sin.default", (angle,), shape=shape)
        re = box.emit("aten.mul.Tensor", (r, cos), shape=shape)
        im = box.emit("aten.mul.Tensor", (r, sin), shape=shape)
        box.emit("aten.stack.default", ((re, im), -1), out)
        return
    if kind == "mul" and not all(isinstance(a, torch.Tensor) and a.is_complex() for a in args):
        box.emit("aten.mul.Tensor", tuple(box.encode(a, torch) for a in args), out)
        return
    if kind == "mul":
        _product(box, args, out)
        return
    raise ConfigError(
        f"{box.scope or 'the model'} runs {op} on complex numbers, which graphllm does not model"
    )


def _product(box: Any, args: tuple, out: Any) -> None:
    """(a + bi)(c + di) = (ac - bd) + (ad + bc)i, on the pair axis."""
    shape = tuple(out.shape)
    parts = []
    for t in args:
        half = tuple(t.shape)
        parts.append([box.emit("aten.select.int", (box.val(t), -1, i), shape=half) for i in (0, 1)])
    (a, b), (c, d) = parts
    ac, bd = (box.emit("aten.mul.Tensor", p, shape=shape) for p in ((a, c), (b, d)))
    ad, bc = (box.emit("aten.mul.Tensor", p, shape=shape) for p in ((a, d), (b, c)))
    re = box.emit("aten.sub.Tensor", (ac, bd), shape=shape)
    im = box.emit("aten.add.Tensor", (ad, bc), shape=shape)
    box.emit("aten.stack.default", ((re, im), -1), out)
