"""The op table: the one place that knows what each op does.

Each row declares an op as data: its axis signature (graphllm.signature), which axes each output
value reads in full (`reduce`), which letters index the same absolute token position
(`same_position`), its FLOP rule, output dtypes, and a numpy reference implementation. Shape
inference, token mixing, FLOPs and sharding are derived from these rows by generic code; no pass
lists ops by name.

FLOP conventions (per DESIGN.md): a contraction costs 2 x the product of all its distinct axis
sizes (one multiply and one add per term); other ops cost `flops_per_elem` per output element,
the constants below (documented per row); data movement (reshapes, concat, gather, dispatch) is 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphllm import ops_mla
from graphllm.errors import GraphError
from graphllm.ir import Dim, Graph, Node, TensorType
from graphllm.signature import Signature, bind, output_dims, parse

Impl = Callable[[list[np.ndarray], dict[str, Any]], Any]

# categories: sets tested by membership, never by op name
SOURCE = "source"  # graph inputs and weights
CONTRACTION = "contraction"  # sums products over an axis absent from the output
ELEMENTWISE = "elementwise"
REDUCTION = "reduction"  # each output reads a whole axis (norms, softmax)
MOVEMENT = "movement"  # copies values: reshapes, concat, repeat, gather, routing
COMMUNICATION = "communication"  # moves values between devices: collectives, send/recv


@dataclass(frozen=True)
class OpSpec:
    """One op kind. `sig` is parsed once into `signature`."""

    name: str
    sig: str
    category: str
    impl: Impl | None
    doc: str
    reduce: tuple[str, ...] = ()
    same_position: tuple[tuple[str, ...], ...] = ()
    flops_per_elem: float = 0.0
    flops_fn: Callable[[dict[str, float]], float] | None = None
    out_dtypes: tuple[str, ...] = ("same",)  # 'same' (input 0), 'act', 'int64', 'attr'
    check: Callable[[Node, dict[str, Dim]], str | None] | None = None
    # which (query, key) position pairs the op lets through, from its attrs: for query
    # positions t (absolute), the interval [lo(t), hi(t)] of key positions; None: all
    relation: Callable[[dict[str, Any], np.ndarray], tuple[np.ndarray, np.ndarray]] | None = None
    # the contraction is a matrix multiply (what GEMM kernels run and FLOP counters count)
    matmul: bool = False
    # the output is a view of the input: no memory is read or written
    view: bool = False
    # inputs the op appends to where they lie (a KV cache): not read, and not written again
    in_place: tuple[int, ...] = ()
    # groups of inputs in which the output is jointly linear, the other inputs held fixed: a
    # pending sum over devices (a partial) passes through such a group unreduced. None derives
    # them from the category (`linear_groups`); () declares the op nonlinear in every input
    linear: tuple[tuple[int, ...], ...] | None = None
    # pairs of letters cut by one split: a block of one holds a block of the other (the GQA
    # copy's query heads come from their KV heads; MoE slots hold a block of tokens)
    carries: tuple[tuple[str, str], ...] = ()
    # the impl takes the input of every rank of a device group, in rank order, and returns
    # every rank's output (attrs: `mesh`, the mesh axis the group runs along)
    collective: bool = False
    # rewrites the signature's output dims from attrs (a collective changes one axis's size)
    retype: Callable[[Node, tuple[Dim, ...]], tuple[Dim, ...]] | None = None
    # what the backward pass reads, so a training step keeps it: "inputs" or "output"; None:
    # a contraction reads its inputs, any other op nothing (linear in its inputs)
    backward_reads: str | None = None
    # a copy the backward pass redoes from its input rather than keeps (GQA's repeat, a gather)
    backward_redoes: bool = False
    # a collective's bytes one device sends, as a fraction of its per-device share of the
    # payload, for a group of n (ring all-reduce 2(n-1)/n; ring gather/scatter and pairwise
    # all-to-all (n-1)/n; a send the whole)
    wire: Callable[[int], float] | None = None

    @property
    def signature(self) -> Signature:
        return parse(self.sig)

    @property
    def is_contraction(self) -> bool:
        return self.category == CONTRACTION


OPS: dict[str, OpSpec] = {}


def _row(spec: OpSpec) -> None:
    parse(spec.sig)  # fail at import on a malformed signature
    OPS[spec.name] = spec


# -- numpy reference implementations ---------------------------------------------------------
def _f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def _rmsnorm(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, w = _f32(xs[0]), _f32(xs[1])
    var = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(var + np.float32(a["eps"])) * (np.float32(a.get("weight_offset", 0.0)) + w)


def _rope(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x, pos = _f32(xs[0]), xs[1]  # x: (B, heads, T, head_dim); pos: (B, T)
    inv_freq = np.asarray(a["inv_freq"], dtype=np.float32)
    freqs = pos[..., None].astype(np.float32) * inv_freq  # (B, T, head_dim/2)
    emb = np.concatenate([freqs, freqs], axis=-1)[:, None]  # (B, 1, T, head_dim)
    scale = np.float32(a.get("attention_scaling", 1.0))
    cos, sin = np.cos(emb) * scale, np.sin(emb) * scale
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos + rotated * sin


def _embedding(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    ids, table = xs[0], _f32(xs[1])
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


def _mask(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = xs[0]  # (B, H, T, S); queries are the last T of the S key positions
    t, s = x.shape[-2], x.shape[-1]
    shard = a.get("shard", {})  # on a token shard: (first position held, whole axis) per axis
    t0, t_all = shard.get("t", (0, t))
    s0, s_all = shard.get("s", (0, s))
    lo, hi = _mask_relation(a, np.arange(t0, t0 + t) + (s_all - t_all))
    k = np.arange(s0, s0 + s)[None, :]
    allowed = (k >= lo[:, None]) & (k <= hi[:, None])
    return np.where(allowed, x, np.float32(-np.inf))


def _mask_relation(a: dict[str, Any], t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Allowed key positions of query position t: causal s <= t; window W: s > t - W."""
    hi = t.copy() if a.get("causal", True) else np.full_like(t, np.iinfo(np.int64).max // 2)
    lo = t - a["window"] + 1 if a.get("window") else np.zeros_like(t)
    return lo, hi


def _softmax(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = _f32(xs[0])
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1, keepdims=True)


def _gelu_tanh(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    x = _f32(xs[0])
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * x * (1 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


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


def _combine(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    y, w, idx = xs  # y: (E, slots, d); w, idx: (B, T, k)
    slot = _slots(idx, y.shape[0])
    picked = y[idx, slot]  # (B, T, k, d)
    return np.einsum("btk,btkd->btd", _f32(w), picked, dtype=np.float32)


def _kv_concat(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return np.concatenate([_f32(xs[0]), _f32(xs[1])], axis=2)  # (B, kv_heads, P+T, hd)


def _split_check(node: Node, env: dict[str, Dim]) -> str | None:
    axes = node.attrs["axes"]
    parts = [axes[x].size for x in ("f1", "f2", "f3") if x in axes]
    if list(node.attrs["sizes"]) != parts or sum(parts) != env["f"].size:
        return f"parts {parts} do not add up to the split axis {env['f'].size}"
    return None


def _repeat_check(node: Node, env: dict[str, Dim]) -> str | None:
    g, h = env["g"].size, node.attrs["axes"]["h"].size
    return None if g and h and h % g == 0 else f"{h} heads are not a multiple of {g} kv heads"


def _size_one(what: str) -> Callable[[Node, dict[str, Dim]], str | None]:
    """A check that axis `o` has size 1, saying `what` it is."""

    def check(node: Node, env: dict[str, Dim]) -> str | None:
        return None if env["o"].size == 1 else what

    return check


def _einsum(sig: str) -> Callable[[list[np.ndarray], dict[str, Any]], np.ndarray]:
    """An impl that is the row's own signature as an einsum (one-letter axes, no groups)."""
    subscripts = sig.replace(" ", "")
    return lambda xs, a: np.einsum(subscripts, *map(_f32, xs))


def _qk(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return _f32(xs[0]) @ _f32(xs[1]).swapaxes(-1, -2)


def _add(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return _f32(xs[0]) + _f32(xs[1])


def _weighted_values(xs: list[np.ndarray], a: dict[str, Any]) -> np.ndarray:
    return _f32(xs[0]) @ _f32(xs[1])


# -- collectives: each impl gets the input of every rank of the group, in rank order ----------
def _sum(xs: list[np.ndarray]) -> np.ndarray:
    out = _f32(xs[0]).copy()
    for x in xs[1:]:
        out += _f32(x)
    return out


def _all_reduce(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return [_sum(xs)] * len(xs)


def _all_gather(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return [np.concatenate(xs, axis=a["axis"])] * len(xs)


def _reduce_scatter(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return np.split(_sum(xs), len(xs), axis=a["axis"])


def _all_to_all(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    blocks = [np.split(x, len(xs), axis=a["split_axis"]) for x in xs]
    return [np.concatenate([b[j] for b in blocks], axis=a["concat_axis"]) for j in range(len(xs))]


def _recv(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return [xs[a["src"]]] * len(xs)


def _shard_slice(xs: list[np.ndarray], a: dict[str, Any]) -> list[np.ndarray]:
    return [np.split(x, len(xs), axis=a["axis"])[j] for j, x in enumerate(xs)]


def _retype(node: Node, dims: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """The input's dims, those that attrs['axes'] names by position (`@2`: axis 2) replaced."""
    out = list(dims)
    for k, d in node.attrs.get("axes", {}).items():
        out[int(k[1:])] = d
    return tuple(out)


# -- the table ---------------------------------------------------------------------------------
for _spec in [
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
        lambda xs, a: _f32(xs[0]) @ _f32(xs[1]).T,
        "x W^T with W stored (out, in), as HF checkpoints do.",
        matmul=True,
    ),
    OpSpec(
        "linear_bias",
        "... d, f d, f -> ... f",
        CONTRACTION,
        lambda xs, a: _f32(xs[0]) @ _f32(xs[1]).T + _f32(xs[2]),
        "x W^T + b; the bias add costs 1 FLOP per output element on top of the contraction.",
        flops_per_elem=1,
        matmul=True,
    ),
    OpSpec(
        "expert_linear",
        "x c d, x f d -> x c f",
        CONTRACTION,
        lambda xs, a: _f32(xs[0]) @ _f32(xs[1]).transpose(0, 2, 1),
        "Each expert's slots times that expert's weight (E stacked (out, in) matrices).",
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
        "rope",
        "b h t e, b t -> b h t e",
        ELEMENTWISE,
        _rope,
        "Rotate pairs of features by the angle of the position's own index: x cos + rot(x) sin. "
        "3 FLOPs/element (two multiplies, one add); the cos/sin tables are not counted.",
        flops_per_elem=3,
        linear=((0,),),
    ),
    OpSpec(
        "kv_concat",
        "b g p e, b g t e -> b g s e",
        MOVEMENT,
        _kv_concat,
        "Append the new keys/values behind the cached ones; each key position comes from "
        "exactly one source position (absolute positions are kept).",
        same_position=(("s", "p", "t"),),
        check=None,
        in_place=(0,),
    ),
    OpSpec(
        "repeat_kv",
        "b g s e -> b h s e",
        MOVEMENT,
        lambda xs, a: np.repeat(xs[0], a["axes"]["h"].size // xs[0].shape[1], axis=1),
        "Copy each KV head to the query heads of its group (GQA/MQA).",
        check=_repeat_check,
        carries=(("h", "g"),),
        backward_redoes=True,
    ),
    OpSpec(
        "scores",
        "b h t e, b h s e -> b h t s",
        CONTRACTION,
        _qk,
        "Q K^T: every query position against every key position.",
        matmul=True,
    ),
    OpSpec(
        "mul_const",
        "... -> ...",
        ELEMENTWISE,
        lambda xs, a: _f32(xs[0]) * np.float32(a["value"]),
        "Multiply by a constant (attention scale 1/sqrt(d_h), gemma's embedding scale).",
        flops_per_elem=1,
        linear=((0,),),
    ),
    OpSpec(
        "mask",
        "b h t s -> b h t s",
        ELEMENTWISE,
        _mask,
        "Set disallowed (query, key) pairs to -inf: causal s <= t, window t - W < s. "
        "1 FLOP/element (a select).",
        flops_per_elem=1,
        relation=_mask_relation,
    ),
    OpSpec(
        "softmax",
        "... s -> ... s",
        REDUCTION,
        _softmax,
        "Softmax over the last axis, in fp32. 5 FLOPs/element: max, subtract, exp, sum, divide.",
        reduce=("s",),
        flops_per_elem=5,
        backward_reads="output",
    ),
    OpSpec(
        "pv",
        "b h t s, b h s e -> b h t e",
        CONTRACTION,
        _weighted_values,
        "Attention probabilities times V: a weighted sum over key positions.",
        matmul=True,
    ),
    OpSpec(
        "silu",
        "... -> ...",
        ELEMENTWISE,
        lambda xs, a: _f32(xs[0]) / (1 + np.exp(-_f32(xs[0]))),
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
        lambda xs, a: 1 / (1 + np.exp(-_f32(xs[0]))),
        "1 / (1 + exp(-x)). 3 FLOPs/element.",
        flops_per_elem=3,
        backward_reads="inputs",
    ),
    OpSpec(
        "mul",
        "..., ... -> ...",
        ELEMENTWISE,
        lambda xs, a: _f32(xs[0]) * _f32(xs[1]),
        "Elementwise product (the gate of a gated MLP).",
        flops_per_elem=1,
        linear=((0,), (1,)),
        backward_reads="inputs",
    ),
    OpSpec(
        "gate_mul",
        "... d, ... o -> ... d",
        ELEMENTWISE,
        lambda xs, a: _f32(xs[0]) * _f32(xs[1]),
        "Scale each position's vector by its one gate value (shared-expert gate).",
        flops_per_elem=1,
        check=_size_one("the gate axis must have size 1"),
        linear=((0,), (1,)),
        backward_reads="inputs",
    ),
    OpSpec(
        "add",
        "..., ... -> ...",
        ELEMENTWISE,
        _add,
        "Elementwise sum (residual connections, shared + routed experts).",
        flops_per_elem=1,
        linear=((0, 1),),
    ),
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
        lambda xs, a: _f32(xs[0]) / np.sum(_f32(xs[0]), axis=-1, keepdims=True),
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
    # collectives: payload and wire bytes per device come from `comm_bytes`; FLOPs are 0
    OpSpec(
        "all_reduce",
        "... -> ...",
        COMMUNICATION,
        _all_reduce,
        "Sum a tensor held as partial sums over a device group; every rank gets the sum.",
        collective=True,
        wire=lambda n: 2 * (n - 1) / n,
    ),
    OpSpec(
        "all_gather",
        "... -> ...",
        COMMUNICATION,
        _all_gather,
        "Concatenate the group's blocks of axis `axis`; every rank gets the whole axis.",
        collective=True,
        retype=_retype,
        backward_redoes=True,
        wire=lambda n: (n - 1) / n,
    ),
    OpSpec(
        "reduce_scatter",
        "... -> ...",
        COMMUNICATION,
        _reduce_scatter,
        "Sum partial sums over a device group; rank i keeps block i of axis `axis`.",
        collective=True,
        retype=_retype,
        wire=lambda n: (n - 1) / n,
    ),
    OpSpec(
        "all_to_all",
        "... -> ...",
        COMMUNICATION,
        _all_to_all,
        "Rank j sends block i of `split_axis` to rank i and concatenates what it receives "
        "along `concat_axis` (MoE dispatch to the experts' ranks, and back).",
        collective=True,
        retype=_retype,
        wire=lambda n: (n - 1) / n,
    ),
    OpSpec(
        "send",
        "... -> ...",
        COMMUNICATION,
        lambda xs, a: xs[0],
        "Hand an activation to the next pipeline stage (the stage that runs this node).",
        wire=lambda n: 1.0,
    ),
    OpSpec(
        "recv",
        "... -> ...",
        COMMUNICATION,
        _recv,
        "Take the activation that stage `src` sent (the input is its send).",
        collective=True,
    ),
    OpSpec(
        "shard_slice",
        "... -> ...",
        MOVEMENT,
        _shard_slice,
        "Keep this rank's block of axis `axis` of a tensor every rank of the group holds whole "
        "(no communication).",
        collective=True,
        retype=_retype,
        view=True,
        backward_redoes=True,
    ),
]:
    _row(_spec)


def _concat_check(node: Node, env: dict[str, Dim]) -> str | None:
    ok = env["f1"].size + env["f2"].size == node.attrs["axes"]["f"].size  # type: ignore[operator]
    return None if ok else "the parts do not add up to the concatenated axis"


_one_check = _size_one("the latent has a single (shared) head")
_ABSORB_Q = "b h t e, h e f -> b h t f"  # each head's query into latent space
_ABSORB_O = "b h t e, h f e -> b h t f"  # each head's latent output back out


# DeepSeek-V2/V3: MLA and its router (impls in graphllm.ops_mla)
for _spec in [
    OpSpec(
        "rope_pairs",
        "b h t e, b t -> b h t e",
        ELEMENTWISE,
        ops_mla.rope_pairs,
        "RoPE on adjacent pairs (x_2i, x_2i+1), written back interleaved ('complex', "
        "DeepSeek-V2) or first members then second ('interleave', DeepSeek-V3). 3 FLOPs/element.",
        flops_per_elem=3,
        linear=((0,),),
    ),
    OpSpec(
        "concat",
        "... f1, ... f2 -> ... f",
        MOVEMENT,
        ops_mla.concat,
        "Join two feature parts (MLA's no-RoPE and RoPE parts of a query or key; an MTP "
        "module's normed embedding and hidden state).",
        check=_concat_check,
    ),
    OpSpec(
        "latent_heads",
        "b o s (h e) -> b h s e",
        MOVEMENT,
        ops_mla.latent_heads,
        "View the latent's up-projection (one shared row per position) as per-head rows.",
        check=_one_check,
    ),
    OpSpec(
        "split_heads_weight",
        "(h f) r -> h n r, h v r",
        MOVEMENT,
        ops_mla.split_heads_weight,
        "kv_b_proj's weight as per-head key and value blocks (MLA's absorbed form).",
        out_dtypes=("same", "same"),
        view=True,
    ),
    OpSpec(
        "absorb_q",
        _ABSORB_Q,
        CONTRACTION,
        _einsum(_ABSORB_Q),
        "Each head's query times that head's key up-projection (query into latent space).",
        matmul=True,
    ),
    OpSpec(
        "absorb_o",
        _ABSORB_O,
        CONTRACTION,
        _einsum(_ABSORB_O),
        "Each head's latent output times that head's value up-projection.",
        matmul=True,
    ),
    OpSpec(
        "scores_mqa",
        "b h t e, b o s e -> b h t s",
        CONTRACTION,
        _qk,
        "Q K^T against one key head shared by all query heads (absorbed MLA's latent keys).",
        check=_one_check,
        matmul=True,
    ),
    OpSpec(
        "pv_mqa",
        "b h t s, b o s e -> b h t e",
        CONTRACTION,
        _weighted_values,
        "Attention probabilities times one value head shared by all query heads.",
        check=_one_check,
        matmul=True,
    ),
    OpSpec(
        "bias_add",
        "... x, x -> ... x",
        ELEMENTWISE,
        _add,
        "Add a per-expert bias (DeepSeek-V3's e_score_correction_bias). 1 FLOP/element.",
        flops_per_elem=1,
        linear=((0, 1),),
    ),
    OpSpec(
        "group_limit",
        "... x -> ... x",
        REDUCTION,
        ops_mla.group_limit,
        "Keep the experts of the topk_group best of n_group groups (ranked by their best score, "
        "or their two best summed), the rest set to `fill`. 2 FLOPs/element (score, select).",
        reduce=("x",),
        flops_per_elem=2,
        linear=(),
    ),
    OpSpec(
        "gather_k",
        "... x, ... k -> ... k",
        MOVEMENT,
        ops_mla.gather_k,
        "The scores at the chosen expert ids (the unbiased weights of the selected experts).",
    ),
]:
    _row(_spec)


CATEGORIES: dict[str, frozenset[str]] = {
    cat: frozenset(n for n, s in OPS.items() if s.category == cat)
    for cat in (SOURCE, CONTRACTION, ELEMENTWISE, REDUCTION, MOVEMENT, COMMUNICATION)
}


# -- generic rules over the table --------------------------------------------------------------
def bind_node(graph: Graph, node: Node) -> tuple[dict[str, Dim], tuple[Dim, ...]]:
    """Letter -> Dim for a node's signature, and the dims that `...` stands for."""
    spec = OPS[node.op]
    dims_in = [t.dims for t in graph.input_types(node)]
    where = f"{node.name} ({node.op})"
    return bind(spec.signature, dims_in, node.attrs.get("axes", {}), where)


_INFER_CACHE: dict[tuple, tuple[TensorType, ...]] = {}


def infer(graph: Graph, node: Node) -> tuple[TensorType, ...]:
    """Output types of `node` from its op's signature, its inputs and its attrs."""
    spec = OPS.get(node.op)
    if spec is None:
        raise GraphError(f"{node.name}: unknown op {node.op!r}")
    if spec.category == SOURCE:
        t = node.attrs.get("type")
        if not isinstance(t, TensorType):
            raise GraphError(f"{node.name} ({node.op}): needs attrs['type'], a TensorType")
        return (t,)
    # a block's ops repeat N times with the same types: the key holds everything inference reads
    a = node.attrs
    key = (
        node.op,
        tuple(graph.input_types(node)),
        tuple(sorted(a.get("axes", {}).items())),
        tuple(a.get("sizes", ())),
        a.get("dtype"),
        graph.meta.get("act_dtype"),
    )
    hit = _INFER_CACHE.get(key)
    if hit is not None:
        return hit
    if len(_INFER_CACHE) > 50_000:
        _INFER_CACHE.clear()
    _INFER_CACHE[key] = out = _infer(graph, node, spec)
    return out


def _infer(graph: Graph, node: Node, spec: OpSpec) -> tuple[TensorType, ...]:
    where = f"{node.name} ({node.op})"
    env, ell = bind_node(graph, node)
    if spec.check is not None:
        msg = spec.check(node, env)
        if msg:
            raise GraphError(f"{where}: {msg}")
    axes = node.attrs.get("axes", {})
    in_types = graph.input_types(node)
    out = []
    for dims, rule in zip(output_dims(spec.signature, env, ell, axes, where), spec.out_dtypes):
        if rule == "same":
            dt = in_types[0].dtype
        elif rule == "act":
            dt = graph.meta.get("act_dtype", "fp32")
        else:
            dt = rule
        if spec.retype is not None:
            dims = spec.retype(node, dims)
        out.append(TensorType(dims, node.attrs.get("dtype", dt)))
    return tuple(out)


def linear_groups(spec: OpSpec, integer: list[bool]) -> tuple[tuple[int, ...], ...]:
    """Groups of inputs in which the op's output is jointly linear (see OpSpec.linear).

    Derived unless the row says: a contraction is linear in each input that has a contracted
    axis, together with the inputs none of whose axes is contracted (a bias is added once);
    a movement op in all its non-integer inputs together; other ops in none.
    """
    if spec.linear is not None:
        return spec.linear
    sig = spec.signature
    floats = [i for i in range(len(sig.inputs)) if not integer[i]]
    if spec.category == MOVEMENT:
        return (tuple(floats),) if floats else ()
    if spec.category != CONTRACTION:
        return ()
    out = sig.output_letters()
    letters = [
        {x for ax in op for x in (ax if isinstance(ax, tuple) else (ax,))} for op in sig.inputs
    ]
    summands = tuple(i for i in floats if letters[i] <= out)
    return tuple((i, *summands) for i in floats if i not in summands)


def letter_sizes(graph: Graph, node: Node) -> dict[str, float]:
    """Bound size of every letter of the node's signature; `...` dims appear under their names."""
    env, ell = bind_node(graph, node)
    b = graph.bindings
    sizes = {k: (d.size if d.size is not None else b[d.name]) for k, d in env.items()}
    for d in ell:
        sizes["..." + d.name] = d.size if d.size is not None else b[d.name]
    for k, d in node.attrs.get("axes", {}).items():
        if k not in sizes and not k.startswith("("):
            sizes[k] = d.size if d.size is not None else b[d.name]
    return sizes


def node_flops(graph: Graph, node: Node) -> tuple[float, float]:
    """(matmul FLOPs, other FLOPs) of one node under the table's conventions (module docstring)."""
    spec = OPS[node.op]
    if spec.category == SOURCE:
        return 0.0, 0.0
    if spec.flops_fn is not None:
        return 0.0, float(spec.flops_fn(letter_sizes(graph, node)))
    contraction = 2 * math.prod(letter_sizes(graph, node).values()) if spec.is_contraction else 0.0
    other = spec.flops_per_elem * sum(t.numel(graph.bindings) for t in node.outputs)
    if spec.matmul:
        return float(contraction), float(other)
    return 0.0, float(contraction + other)
