"""Op rows of mixture-of-experts routing: top-k, weight normalisation, dispatch into expert slots and the weighted combine."""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.ir.opspec import (
    CONTRACTION,
    ELEMENTWISE,
    MOVEMENT,
    REDUCTION,
    OpSpec,
    register,
)
from graphllm.ops.common import f32


def _topk(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    x, k = xs[0], a["k"]
    idx = np.argsort(-x, axis=-1, kind="stable")[..., :k]
    return np.take_along_axis(x, idx, axis=-1), idx.astype(np.int64)


def _slots(idx: np.ndarray, n_experts: int) -> np.ndarray:
    """Slot of each (token, choice) pair inside its expert: pairs in (b, t, k) order."""
    flat = idx.reshape(-1)
    onehot = flat[:, None] == np.arange(n_experts)[None, :]
    return (np.cumsum(onehot, axis=0)[np.arange(flat.size), flat] - 1).reshape(idx.shape)


def _dispatch(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, idx = xs  # x: (B, T, d); idx: (B, T, k)
    n_exp = a["axes"]["x"].size
    slot = _slots(idx, n_exp)
    # every expert gets room for all B*T tokens (top-k picks distinct experts), so the padded
    # shape never depends on the routing and each row computes the same bits whatever the others do
    cap = idx.shape[0] * idx.shape[1]
    out = np.zeros((n_exp, cap, x.shape[-1]), dtype=np.float32)  # (E, B*T, d), zero-padded
    b, t, _ = np.indices(idx.shape)
    out[idx, slot] = x[b, t]
    return out


def _dispatch_pairs(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, idx = xs  # x: (B, T, k, d), a vector each (token, choice) pair; idx: (B, T, k)
    n_exp = a["axes"]["x"].size
    slot = _slots(idx, n_exp)
    out = np.zeros((n_exp, idx.shape[0] * idx.shape[1], x.shape[-1]), dtype=np.float32)
    out[idx, slot] = x
    return out


def _gather_pairs(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    y, idx = xs  # y: (E, slots, f); idx: (B, T, k)
    return f32(y)[idx, _slots(idx, y.shape[0])]  # (B, T, k, f)


def _combine(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    y, w, idx = xs  # y: (E, slots, d); w, idx: (B, T, k)
    slot = _slots(idx, y.shape[0])
    picked = y[idx, slot]  # (B, T, k, d)
    return np.einsum("btk,btkd->btd", f32(w), picked, dtype=np.float32)


def _scale_slots(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    y, w, idx = xs  # y: (E, slots, d); w, idx: (B, T, k)
    slot = _slots(idx, y.shape[0])
    out = f32(y).copy()
    out[idx, slot] = out[idx, slot] * f32(w)[..., None]  # distinct (expert, slot) per pair
    return out


def _sum_slots(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    y, idx = xs  # y: (E, slots, d); idx: (B, T, k)
    slot = _slots(idx, y.shape[0])
    return np.sum(f32(y)[idx, slot], axis=2, dtype=np.float32)


register(
    OpSpec(
        "topk",
        "... x -> ... k, ... k",
        MOVEMENT,
        _topk,
        "The k largest router scores and their expert ids, largest first. Comparisons, 0 FLOPs.",
        out_dtypes=("same", "int64"),
        linear=(),
    ),
    OpSpec(
        "normalize",
        "... k -> ... k",
        REDUCTION,
        lambda xs, a: f32(xs[0]) / np.sum(f32(xs[0]), axis=-1, keepdims=True),
        "Divide by the sum over the last axis (top-k weight renormalisation). 2 FLOPs/element.",
        reduce=("k",),
        flops_per_elem=2,
        backward_reads="inputs",
    ),
    OpSpec(
        "moe_dispatch",
        "b t d, b t k -> x c d",
        MOVEMENT,
        _dispatch,
        "Copy each token to the slots of the k experts it chose. A slot holds one token, so "
        "the slot axis carries that token's position.",
        same_position=(("c", "t"),),
        carries=(("c", "t"), ("c", "b")),
    ),
    OpSpec(
        "moe_combine",
        "x c d, b t k, b t k -> b t d",
        CONTRACTION,
        _combine,
        "Each token sums its k expert outputs weighted by the router: 2 FLOPs per "
        "(token, choice, feature).",
        same_position=(("c", "t"),),
        carries=(("c", "t"), ("c", "b")),
        flops_fn=lambda s: 2 * s["b"] * s["t"] * s["k"] * s["d"],
    ),
    # a mixture of attention heads (JetMoE): each (token, choice) pair its own vector into
    # its expert, and each pair's expert output back, uncombined
    OpSpec(
        "moe_dispatch_pairs",
        "b t k d, b t k -> x c d",
        MOVEMENT,
        _dispatch_pairs,
        "Copy each (token, choice) pair's own vector to its expert's slot (a mixture of "
        "attention heads: a pair's attention output into its expert's output projection).",
        same_position=(("c", "t"),),
        carries=(("c", "t"), ("c", "b")),
    ),
    OpSpec(
        "moe_gather",
        "x c f, b t k -> b t k f",
        MOVEMENT,
        _gather_pairs,
        "Each (token, choice) pair's expert output, read back from its slot without combining "
        "(a mixture of attention heads: a query a chosen expert).",
        same_position=(("c", "t"),),
        carries=(("c", "t"), ("c", "b")),
    ),
    # Llama 4: the router weight scales the expert's input, so the combine is a plain sum
    OpSpec(
        "moe_scale_slots",
        "x c d, b t k, b t k -> x c d",
        ELEMENTWISE,
        _scale_slots,
        "Scale each expert slot's token by the router weight of its (token, choice) pair, before "
        "the expert (Llama 4); empty slots stay zero. 1 FLOP per (token, choice, feature).",
        same_position=(("c", "t"),),
        carries=(("c", "t"), ("c", "b")),
        flops_fn=lambda s: s["b"] * s["t"] * s["k"] * s["d"],
    ),
    OpSpec(
        "moe_sum",
        "x c d, b t k -> b t d",
        CONTRACTION,
        _sum_slots,
        "Each token sums its k expert outputs unweighted (their inputs were weighted): k - 1 "
        "adds per (token, feature).",
        same_position=(("c", "t"),),
        carries=(("c", "t"), ("c", "b")),
        flops_fn=lambda s: s["b"] * s["t"] * (s["k"] - 1) * s["d"],
    ),
)


# -- gpt-oss's experts: stacked (E, in, out) with biases, a clamped SwiGLU ------------
def _expert_linear_bias(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, w, b = f32(xs[0]), f32(xs[1]), f32(xs[2])  # (E, C, in), (E, in, out), (E, out)
    return x @ w + b[:, None, :]


def _split_interleaved(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    return xs[0][..., ::2], xs[0][..., 1::2]


def _clamped_swiglu(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    limit = np.float32(a["limit"])
    gate = np.minimum(f32(xs[0]), limit)
    up = np.clip(f32(xs[1]), -limit, limit)
    glu = gate / (1 + np.exp(-gate * np.float32(a["alpha"])))
    return (up + np.float32(1.0)) * glu


register(
    OpSpec(
        "expert_linear_bias",
        "x c d, x d f, x f -> x c f",
        CONTRACTION,
        _expert_linear_bias,
        "Each expert's slots times that expert's (in, out) matrix plus its bias (gpt-oss's "
        "stacked experts). 2 FLOPs per multiply-add, 1 per bias element.",
        flops_per_elem=1,
        matmul=True,
    ),
    OpSpec(
        "split_interleaved",
        "... f -> ... f1, ... f2",
        MOVEMENT,
        _split_interleaved,
        "The even and the odd channels of the last axis (gpt-oss's gate_up_proj interleaves "
        "gate and up).",
        out_dtypes=("same", "same"),
    ),
    OpSpec(
        "clamped_swiglu",
        "... f, ... f -> ... f",
        ELEMENTWISE,
        _clamped_swiglu,
        "gpt-oss's SwiGLU: gate clamped above at limit, up to [-limit, limit], then "
        "(up + 1) * gate * sigmoid(alpha * gate). 11 FLOPs/element: three clamps, the alpha "
        "multiply, four for the sigmoid, the gate multiply, the + 1 and the product.",
        flops_per_elem=11,
        backward_reads="inputs",
    ),
)
