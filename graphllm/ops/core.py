"""Op rows of the dense path: sources, embedding, linear layers, RMSNorm and LayerNorm, splits and head reshapes, activations, products and sums."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphllm.ir import Dim, Node
from graphllm.ir.opspec import (
    CONTRACTION,
    ELEMENTWISE,
    MOVEMENT,
    REDUCTION,
    SOURCE,
    OpSpec,
    register,
)
from graphllm.ops.common import add_impl, f32, size_one


def _rmsnorm(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, w = f32(xs[0]), f32(xs[1])
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + np.float32(a["eps"])) * (np.float32(a.get("weight_offset", 0.0)) + w)


def _embedding(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    ids, table = xs[0], f32(xs[1])
    shard = a.get("shard", {}).get("v")  # a vocab-parallel shard: (its first row, all rows)
    if shard is None:
        return table[ids]
    local = ids - shard[0]
    held = (local >= 0) & (local < table.shape[0])  # other rows are other ranks' (zeros here)
    return np.where(held[..., None], table[np.where(held, local, 0)], np.float32(0))


def _split(xs: list[np.ndarray], a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    cuts = np.cumsum(a["sizes"])[:-1]
    return tuple(np.split(xs[0], cuts, axis=-1))


def _split_heads(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]
    b, t, _ = x.shape
    return x.reshape(b, t, a["axes"]["h"].size, -1).transpose(0, 2, 1, 3)  # (B, heads, T, hd)


def _merge_heads(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]
    b, h, t, e = x.shape
    return x.transpose(0, 2, 1, 3).reshape(b, t, h * e)  # (B, T, heads*hd)


def _gelu_tanh(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = f32(xs[0])
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def _split_check(node: Node, env: dict[str, Dim]) -> str | None:
    axes = node.attrs["axes"]
    parts = [axes[x].size for x in ("f1", "f2", "f3") if x in axes]
    if list(node.attrs["sizes"]) != parts or sum(parts) != env["f"].size:
        return f"parts {parts} do not add up to the split axis {env['f'].size}"
    return None


register(
    OpSpec("input", "-> ...", SOURCE, None, "A graph input (token ids, positions, past K/V)."),
    OpSpec("param", "-> ...", SOURCE, None, "A weight, named like its checkpoint tensor."),
    OpSpec(
        "embedding",
        "b t, v d -> b t d",
        MOVEMENT,
        _embedding,
        "Row lookup: each position reads the row of its own token id.",
        out_dtypes=("act",),
    ),
    OpSpec(
        "linear",
        "... d, f d -> ... f",
        CONTRACTION,
        lambda xs, a: f32(xs[0]) @ f32(xs[1]).T,
        "x W^T with W stored (out, in), as HF checkpoints do.",
        matmul=True,
    ),
    OpSpec(
        "linear_bias",
        "... d, f d, f -> ... f",
        CONTRACTION,
        lambda xs, a: f32(xs[0]) @ f32(xs[1]).T + f32(xs[2]),
        "x W^T + b; the bias add costs 1 FLOP per output element on top of the contraction.",
        flops_per_elem=1,
        matmul=True,
    ),
    OpSpec(
        "expert_linear",
        "x c d, x f d -> x c f",
        CONTRACTION,
        lambda xs, a: f32(xs[0]) @ f32(xs[1]).transpose(0, 2, 1),
        "Each expert's slots times that expert's weight (E stacked (out, in) matrices).",
        matmul=True,
    ),
    # Llama 4: experts stored as one (E, in, out) tensor (Llama4TextExperts' bmm)
    OpSpec(
        "expert_matmul",
        "x c d, x d f -> x c f",
        CONTRACTION,
        lambda xs, a: f32(xs[0]) @ f32(xs[1]),
        "Each expert's slots times that expert's (in, out) matrix (E stacked, fused layout).",
        matmul=True,
    ),
    OpSpec(
        "rmsnorm",
        "... d, d -> ... d",
        REDUCTION,
        _rmsnorm,
        "x / sqrt(mean(x^2) + eps) * (offset + w), in fp32. 4 FLOPs/element: square, sum, "
        "scale by the reciprocal root, multiply by the weight.",
        reduce=("d",),
        flops_per_elem=4,
        backward_reads="inputs",
    ),
    OpSpec(
        "split",
        "... f -> ... f1, ... f2",
        MOVEMENT,
        _split,
        "Cut the last axis into two parts (phi3's fused gate_up).",
        check=_split_check,
        out_dtypes=("same", "same"),
        view=True,
    ),
    OpSpec(
        "split3",
        "... f -> ... f1, ... f2, ... f3",
        MOVEMENT,
        _split,
        "Cut the last axis into three parts (phi3's fused qkv).",
        check=_split_check,
        out_dtypes=("same", "same", "same"),
        view=True,
    ),
    OpSpec(
        "split_heads",
        "b t (h e) -> b h t e",
        MOVEMENT,
        _split_heads,
        "View the projection as heads and move heads before tokens.",
        view=True,
    ),
    OpSpec(
        "merge_heads",
        "b h t e -> b t (h e)",
        MOVEMENT,
        _merge_heads,
        "Concatenate the heads back into one feature axis.",
    ),
    OpSpec(
        "last_position",
        "b t d -> b l d",
        MOVEMENT,
        lambda xs, a: xs[0][:, -1:],
        "Keep the last position only (a server computes logits for it alone).",
        same_position=(("l", "t"),),
    ),
    OpSpec(
        "silu",
        "... -> ...",
        ELEMENTWISE,
        lambda xs, a: f32(xs[0]) / (1 + np.exp(-f32(xs[0]))),
        "x * sigmoid(x). 4 FLOPs/element: negate, exp, add, divide.",
        flops_per_elem=4,
        backward_reads="inputs",
    ),
    OpSpec(
        "gelu_tanh",
        "... -> ...",
        ELEMENTWISE,
        _gelu_tanh,
        "GELU, tanh approximation. 8 FLOPs/element (cube, fma, scale, tanh, add, two muls).",
        flops_per_elem=8,
        backward_reads="inputs",
    ),
    OpSpec(
        "sigmoid",
        "... -> ...",
        ELEMENTWISE,
        lambda xs, a: 1 / (1 + np.exp(-f32(xs[0]))),
        "1 / (1 + exp(-x)). 3 FLOPs/element.",
        flops_per_elem=3,
        backward_reads="inputs",
    ),
    OpSpec(
        "mul",
        "..., ... -> ...",
        ELEMENTWISE,
        lambda xs, a: f32(xs[0]) * f32(xs[1]),
        "Elementwise product (the gate of a gated MLP).",
        flops_per_elem=1,
        linear=((0,), (1,)),
        backward_reads="inputs",
    ),
    OpSpec(
        "gate_mul",
        "... d, ... o -> ... d",
        ELEMENTWISE,
        lambda xs, a: f32(xs[0]) * f32(xs[1]),
        "Scale each position's vector by its one gate value (shared-expert gate).",
        flops_per_elem=1,
        check=size_one("the gate axis must have size 1"),
        linear=((0,), (1,)),
        backward_reads="inputs",
    ),
    OpSpec(
        "add",
        "..., ... -> ...",
        ELEMENTWISE,
        add_impl,
        "Elementwise sum (residual connections, shared + routed experts).",
        flops_per_elem=1,
        linear=((0, 1),),
    ),
)


# -- Cohere's LayerNorm (mean-centred, a weight and no bias) -------------------------
def _layernorm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    x = f32(x)
    centred = x - np.mean(x, axis=-1, keepdims=True)
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + np.float32(eps)) * f32(w)


register(
    OpSpec(
        "layernorm",
        "... d, d -> ... d",
        REDUCTION,
        lambda xs, a: _layernorm(xs[0], xs[1], a["eps"]),
        "(x - mean(x)) / sqrt(var(x) + eps) * w, in fp32, no bias (Cohere). 6 FLOPs/element: "
        "sum, subtract the mean, square, sum, scale by the reciprocal root, multiply by the "
        "weight.",
        reduce=("d",),
        flops_per_elem=6,
        backward_reads="inputs",
    ),
    OpSpec(
        "head_layernorm",
        "b h t e, h e -> b h t e",
        REDUCTION,
        # each head its own weight row: (h, e) broadcast over the batch and positions
        lambda xs, a: _layernorm(xs[0], f32(xs[1])[:, None, :], a["eps"]),
        "LayerNorm of each head's e channels with that head's own weight (Cohere's q/k norm, "
        "weight (heads, head_dim)); 6 FLOPs/element as layernorm.",
        reduce=("e",),
        flops_per_elem=6,
        backward_reads="inputs",
    ),
)
