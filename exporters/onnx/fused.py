"""The fused ONNX lowerings, and the default lowering per provider and family.

- `standard`: opset 23's RMSNormalization, LayerNormalization, RotaryEmbedding (its cos/sin
  computed from `position_ids`, half a head wide; `interleaved` where the RoPE pairs adjacent
  channels, Cohere's) and Attention (past K/V in, present out, GQA by head counts,
  `is_causal`, and a boolean mask: the `attention_mask` bits, and the window of a sliding layer).
- `ort`: onnxruntime's com.microsoft ops. GroupQueryAttention with the rotary embedding fused
  (constant cos/sin caches of the file, one row per position up to max_position_embeddings:
  ROTARY_ROWS_MIN .. ROTARY_ROWS_CAP rows; its CPU kernel rotates heads of a multiple of 16
  only, so other heads, partial rotary and longrope are rotated before it by RotaryEmbedding
  reading the same caches by position_ids; `rotary_interleaved` for adjacent pairs),
  `local_window_size` for windows, `head_sink` for attention sinks (gpt-oss) and the
  padding as an `attention_bias`; SkipSimplifiedLayerNormalization for each residual add and the
  norm after it; MoE for the routed experts (softmax top-k routing; SwiGLU experts, gate and up
  rows interleaved, as its CPU kernel requires; or gpt-oss's biased experts with the clamped
  SwiGLU and the softmax over the router's top k) with a shared expert and its gate as separate
  ops; QuickGelu(alpha=1) for SiLU.

Both compute Q/K/V (and a gated MLP's gate and up) with one MatMul, split after it, and store
every weight they multiply by as (in, out), so no Transpose runs when onnxruntime loads them.
Initializer names: a checkpoint tensor stored as it is keeps its name; `NAME.T` is its
transpose; `<attention scope>.qkv_proj.weight.T` packs Q, K and V (Phi-3's `qkv_proj` itself,
transposed) and `<mlp scope>.gate_up_proj.weight.T` gate and up; `NAME+1` adds a norm's weight
offset (Gemma); `<moe scope>.experts.*.gate_up_interleaved.weight` interleaves each expert's
gate and up rows.

Where `ort` departs from the IR, on purpose: a fused rotary embedding rotates by cache index
(GroupQueryAttention reads `position_ids` for the first token of a prompt only, so it is not
given them). A left-padded row's positions are then its own plus its padding: the same relative
positions, so the same attention and logits, but its `present` keys are rotated by those
positions. Padding queries (no key allowed) attend with the lowest finite bias, so they stay
finite, as in the decomposed lowering. GroupQueryAttention takes several new tokens after a
past for a batch of 1 only (chunked prefill); prefill and decode run at any batch size.

With `--quantize` (graphllm.exporters.onnx.quantize) every weight these lowerings multiply by
but the routed experts is a MatMulNBits: Q/K/V one op of the packed weight, fed packed to
GroupQueryAttention where its rotary is fused and no q/k norm sits between; gate and up two ops
(as onnxruntime-genai's builder writes them: no Split at decode); the MoE router too.

Each fused region is a declared pattern table (graphllm.exporters.onnx.regions), matched at
each node its root can be, and its emitter reads the match's captures; the analysed graph
stays unfused. A
model a lowering cannot express raises LoweringError in one line, the reason the pattern's
mismatch gives: latent attention (MLA) has no fused form, soft-capped scores (Gemma 2) and RoPE
pairs written back first members then second ones (layout 'interleave') neither, `standard`
takes no attention sinks, and `ort` needs SwiGLU experts routed by the top k of a softmax (or
gpt-oss's, by a softmax over the top k).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from graphllm.exporters.onnx.decomposed import allowed_keys, rotary_tables
from graphllm.exporters.onnx.lowering import (
    DECOMPOSED,
    LOWERINGS,
    NP_TYPES,
    OPSET,
    Lower,
    Lowering,
    LoweringError,
    OpSet,
    Region,
    axis_size,
    placed,
    static_shape,
)
from graphllm.exporters.onnx.patterns import Match, Mismatch, Pattern, find, match
from graphllm.exporters.onnx.quantize import nbits_matmul, quantized_linear, unchanged
from graphllm.exporters.onnx.regions import (
    ATTENTION_PATTERN,
    CLAMPED_MOE_PATTERN,
    GATED_MLP_PATTERN,
    MOE_PATTERN,
    SKIP_NORM_PATTERN,
    attention_sinks,
    qkv_projections,
    rope_layout,
)
from graphllm.ir import Graph, Node, Ref
from graphllm.models.families import FAMILY_TABLE

MS = "com.microsoft"


# -- rows: weights stored (in, out), norms as one op ------------------------------------------
def _weight_t(c: Lowering, n: Node, i: list[str]) -> str:
    """The linear's weight as (in, out), stored so: a param, or a view of a weight's rows
    (Mamba2's in_proj read per group), whose rows are then stored in the viewed order."""
    view = c.graph[n.inputs[1].node]
    if view.op == "param":
        return c.transposed(view.name)
    src, index = view.inputs[0].node, np.asarray(view.attrs["index"])
    shape = tuple(reversed(static_shape(view)))
    return c.initializer(f"{view.name}.T", (src,), shape, lambda w: w[index].T)


def _linear(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    if c.quantization is not None:
        quantized_linear(c, n, i, o)
        return
    c.final("MatMul", [i[0], _weight_t(c, n, i)], n, o)  # weight (in, out)


def _linear_bias(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    if c.quantization is not None:
        quantized_linear(c, n, i, o)
        return
    c.final("Add", [c.op("MatMul", [i[0], _weight_t(c, n, i)], n.name), i[2]], n, o)


def _expert_linear(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("MatMul", [i[0], c.transposed(n.inputs[1].node)], n, o)  # (E, slots, out)


def _embedding(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    table = n.inputs[1].node
    if all(u.op == n.op for u in c.graph.users(table)):  # only lookups read the table
        c.final("Gather", [i[1], i[0]], n, o, axis=0)
        return
    # tied: the LM head reads the table as (d, vocab); the embedding gathers its columns
    cols = c.op("Gather", [c.transposed(table), i[0]], n.name, axis=1)  # (d, B, T)
    c.final("Transpose", [cols], n, o, perm=[1, 2, 0])  # (B, T, d)


def _gamma(c: Lowering, norm: Node) -> str:
    """A norm's weight, with Gemma's offset added once at export."""
    w, offset = norm.inputs[1].node, float(norm.attrs.get("weight_offset", 0.0))
    if not offset:
        return w
    add = lambda a: a.astype(np.float32) + np.float32(offset)  # noqa: E731
    return c.initializer(f"{w}+{offset:g}", (w,), c.param_shape(w), add)


def _rmsnorm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    attrs = {"epsilon": float(n.attrs["eps"]), "axis": -1, "stash_type": 1}
    c.final("RMSNormalization", [i[0], _gamma(c, n)], n, o, **attrs)


def _layernorm(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    # weight only (Cohere's): LayerNormalization without its bias input
    attrs = {"epsilon": float(n.attrs["eps"]), "axis": -1, "stash_type": 1}
    c.final("LayerNormalization", [i[0], i[1]], n, o, **attrs)


def _quick_gelu(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    c.final("QuickGelu", [i[0]], n, o, domain=MS, alpha=1.0)  # x * sigmoid(x): SiLU


def _proj_bias(proj: Node) -> str | None:
    """A projection's bias param (its third input), or None."""
    return proj.inputs[2].node if len(proj.inputs) > 2 else None


# -- finding the regions (their pattern tables: graphllm.exporters.onnx.regions) -------------
def _every(g: Graph, pattern: Pattern) -> list[Match]:
    """Every match of a region the lowering needs, or LoweringError saying why one differs."""
    out = []
    for _, m in find(g, pattern):
        if isinstance(m, Mismatch):
            raise LoweringError(m.reason)
        out.append(m)
    return out


def _each(g: Graph, pattern: Pattern) -> list[Match]:
    """The matches of a region the lowering fuses where it can."""
    return [m for _, m in find(g, pattern) if isinstance(m, Match)]


def _region(m: Match, outputs: tuple[Ref, ...], emit: Callable) -> Region:
    return Region(tuple(dict.fromkeys(n.name for n in m.nodes)), outputs, emit)


@dataclass(frozen=True)
class Attn:
    """One attention block from its input x to its merged heads, read from its match."""

    scope: str
    x: Ref
    weights: tuple[str, ...]  # q, k, v (out, in), or Phi-3's one qkv_proj
    biases: tuple[str, ...]
    positions: Ref | None  # None (and rope None): a NoPE layer
    rope: Node | None
    q_norm: Node | None
    k_norm: Node | None
    # Cohere's per-head LayerNorms, each head with its own weight
    q_layernorm: Node | None
    k_layernorm: Node | None
    # OLMo 2's norms over the whole q / k projection, before the head split
    q_wide_norm: Node | None
    k_wide_norm: Node | None
    heads: int
    kv_heads: int
    head_dim: int
    # the rotation pairs adjacent channels (x_2i, x_2i+1), as Cohere's does: the fused ops'
    # `interleaved` / `rotary_interleaved`
    interleaved: bool
    scale: float
    window: int | None
    chunk: int | None  # Llama 4's chunked layers
    sinks: str | None  # gpt-oss's per-head sink logits (a param), or None
    past: tuple[Ref, Ref]
    present: tuple[Ref, Ref]
    out: Ref

    @classmethod
    def of(cls, m: Match) -> Attn:
        projs = qkv_projections(m)
        return cls(
            scope=m["merge"].name.rsplit(".", 1)[0],
            x=m.ref("x"),
            weights=tuple(p.inputs[1].node for p in projs),
            biases=tuple(b for b in map(_proj_bias, projs) if b is not None),
            positions=m.ref("positions") if "q_rope" in m else None,
            rope=m.get("q_rope"),
            q_norm=m.get("q_norm"),
            k_norm=m.get("k_norm"),
            q_layernorm=m.get("q_layernorm"),
            k_layernorm=m.get("k_layernorm"),
            q_wide_norm=m.get("q_wide_norm"),
            k_wide_norm=m.get("k_wide_norm"),
            heads=axis_size(m["q_heads"], "h"),
            kv_heads=axis_size(m["k_heads"], "h"),
            head_dim=axis_size(m["q_heads"], "e"),
            interleaved="q_rope" in m and rope_layout(m["q_rope"]) == "complex",
            scale=float(m["scale"].attrs["value"]),
            window=m["key_mask"].attrs.get("window"),
            chunk=m["key_mask"].attrs.get("chunk"),
            sinks=attention_sinks(m),
            past=(m.ref("past_k"), m.ref("past_v")),
            present=(m.ref("k_cache"), m.ref("v_cache")),
            out=m.ref("merge"),
        )


def _qkv(c: Lowering, a: Attn, x: str) -> str:
    """Q, K and V of every head from one MatMul: (B, T, (h + 2 h_kv) hd)."""
    if c.quantization is not None:
        return _quantized_qkv(c, a, x)
    if len(a.weights) == 1:
        w = c.transposed(a.weights[0])
        b = a.biases[0] if a.biases else None
    else:
        shapes = [c.param_shape(w) for w in a.weights]
        out, d = sum(s[0] for s in shapes), shapes[0][1]
        name = f"{a.scope}.qkv_proj"
        pack = lambda *ws: np.concatenate(ws, axis=0).T  # noqa: E731
        w = c.initializer(f"{name}.weight.T", a.weights, (d, out), pack)
        cat = lambda *bs: np.concatenate(bs)  # noqa: E731
        b = c.initializer(f"{name}.bias", a.biases, (out,), cat) if a.biases else None
    y = c.op("MatMul", [x, w], f"{a.scope}.qkv_proj")
    return c.op("Add", [y, b], f"{a.scope}.qkv_proj") if b else y


def _quantized_qkv(c: Lowering, a: Attn, x: str) -> str:
    """`_qkv` as one MatMulNBits of the packed (out, in) weight, the bias added by the op."""
    shapes = [c.param_shape(w) for w in a.weights]
    out_in = (sum(s[0] for s in shapes), shapes[0][1])
    name = a.weights[0] if len(a.weights) == 1 else f"{a.scope}.qkv_proj.weight"
    b = None
    if len(a.biases) == 1:
        b = a.biases[0]
    elif a.biases:
        cat = lambda *bs: np.concatenate(bs)  # noqa: E731
        b = c.initializer(f"{a.scope}.qkv_proj.bias", a.biases, (out_in[0],), cat)
    stack = lambda *ws: np.concatenate(ws, axis=0)  # noqa: E731
    op, ins, attrs = nbits_matmul(c, x, name, a.weights, out_in, stack, a.scope, b)
    return c.op(op, ins, f"{a.scope}.qkv_proj", **attrs)


def _split_qkv(c: Lowering, a: Attn, qkv: str) -> tuple[str, str, str]:
    dq, dkv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    sizes = c.const([dq, dkv, dkv])
    return tuple(c.op("Split", [qkv, sizes], f"{a.scope}.qkv_split", n_out=3, axis=-1))  # type: ignore[return-value]


def _head_norm(c: Lowering, x: str, norm: Node, heads: int, e: int) -> str:
    """Per-head RMSNorm of (B, T, heads * e) (Qwen3's q_norm / k_norm)."""
    y = c.op("Reshape", [x, c.const([0, 0, heads, e])], norm.name)  # (B, T, heads, e)
    attrs = {"epsilon": float(norm.attrs["eps"]), "axis": -1, "stash_type": 1}
    y = c.op("RMSNormalization", [y, _gamma(c, norm)], norm.name, **attrs)
    return c.op("Reshape", [y, c.const([0, 0, heads * e])], norm.name)


def _head_layernorm(c: Lowering, x: str, norm: Node, heads: int, e: int) -> str:
    """Per-head LayerNorm of (B, T, heads * e), each head with its own weight (Cohere's q_norm /
    k_norm): LayerNormalization's scale is one (e,) row for every head, so it normalises with
    ones and the (heads, e) weight multiplies after."""
    y = c.op("Reshape", [x, c.const([0, 0, heads, e])], norm.name)  # (B, T, heads, e)
    attrs = {"epsilon": float(norm.attrs["eps"]), "axis": -1, "stash_type": 1}
    ones = c.const(np.ones(e), c.dtype, "ones")
    y = c.op("LayerNormalization", [y, ones], norm.name, **attrs)
    y = c.op("Mul", [y, norm.inputs[1].node], norm.name)
    return c.op("Reshape", [y, c.const([0, 0, heads * e])], norm.name)


def _wide_norm(c: Lowering, x: str, norm: Node) -> str:
    """RMSNorm of (B, T, heads * e) over all its channels (OLMo 2's q_norm / k_norm)."""
    attrs = {"epsilon": float(norm.attrs["eps"]), "axis": -1, "stash_type": 1}
    return c.op("RMSNormalization", [x, _gamma(c, norm)], norm.name, **attrs)


def _gated_mlps(g: Graph, rows: dict[str, Lower]) -> list[Region]:
    """Gated MLPs `down(act(gate(x)) * up(x))` whose gate and up are two projections of x: one
    MatMul of both, stored (d, 2 ffn), split in two."""
    return [_region(m, (m.ref("gated"),), _gated(m, rows)) for m in _each(g, GATED_MLP_PATTERN)]


def _gated(m: Match, rows: dict[str, Lower]) -> Callable:
    gate, up, act, mul = m["gate"], m["up"], m["act"], m["gated"]

    def emit(c: Lowering, names: dict[Ref, str]) -> None:
        if c.quantization is not None:
            # gate and up as two MatMulNBits, as onnxruntime-genai's builder has them: no Split
            # (onnxruntime's profile put the 16 Splits at 0.3-0.9 ms of a 12-17 ms int4 step)
            for proj in (gate, up):
                ins = [names[r] for r in proj.inputs]
                quantized_linear(c, proj, ins, [names[Ref(proj.name)]])
            g_out, u_out = names[Ref(gate.name)], names[Ref(up.name)]
        else:
            g_out, u_out = _gate_up(c, mul.name.rsplit(".", 1)[0], names[m.ref("x")])
        rows[act.op](c, act, [g_out], [names[Ref(act.name)]])
        c.final("Mul", [names[Ref(act.name)], u_out], mul, [names[Ref(mul.name)]])

    def _gate_up(c: Lowering, scope: str, x: str) -> tuple[str, str]:
        ws = (gate.inputs[1].node, up.inputs[1].node)
        f, d = c.param_shape(ws[0])
        pack = lambda a, b: np.concatenate([a, b], axis=0).T  # noqa: E731
        w = c.initializer(f"{scope}.gate_up_proj.weight.T", ws, (d, 2 * f), pack)
        y = c.op("MatMul", [x, w], f"{scope}.gate_up_proj")  # (B, T, 2 ffn)
        biases = tuple(b for b in (_proj_bias(gate), _proj_bias(up)) if b is not None)
        if biases:  # both, the pattern checks
            cat = lambda a, b: np.concatenate([a, b])  # noqa: E731
            b = c.initializer(f"{scope}.gate_up_proj.bias", biases, (2 * f,), cat)
            y = c.op("Add", [y, b], scope)
        return tuple(
            c.op("Split", [y, c.const([f, f])], f"{scope}.gate_up_split", n_out=2, axis=-1)
        )  # type: ignore[return-value]

    return emit


# -- standard: RMSNormalization, RotaryEmbedding, Attention ----------------------------------
def _bool_mask(c: Lowering, window: int | None, chunk: int | None = None) -> str:
    """(B, 1, T, S) bool: the attention_mask bits, and a sliding layer's window or a chunked
    layer's chunk."""

    def make() -> str:
        if window or chunk:
            relation = {"causal": False, "window": window, "chunk": chunk}
            return allowed_keys(c, relation)  # (B, 1, T, S)
        s = "model.attention_mask"
        bits = c.op("Unsqueeze", ["attention_mask", c.const([1, 2])], s)  # (B, 1, 1, S)
        bits = c.op("Cast", [bits], s, to=9)
        dims = [c.dim("attention_mask", 0, s), c.const([1]), c.dim("input_ids", 1, s)]
        shape = c.op("Concat", [*dims, c.dim("attention_mask", 1, s)], s, axis=0)
        return c.op("Expand", [bits, shape], s)  # Attention wants the T axis whole

    return c.shared(("bool_mask", window) + ((chunk,) if chunk else ()), make)


def _qkv_heads(
    c: Lowering, a: Attn, names: dict[Ref, str], rotate: bool, constant: bool = False
) -> tuple[str, ...]:
    """Q, K and V (B, T, heads x hd) from one MatMul, Qwen3's per-head RMSNorms or Cohere's
    LayerNorms applied, and with `rotate` Q and K rotated by position_ids (RotaryEmbedding):
    its cos/sin computed from them, or with `constant` read from the file's caches by them."""
    q, k, v = _split_qkv(c, a, _qkv(c, a, names[a.x]))
    if a.q_wide_norm is not None and a.k_wide_norm is not None:
        q, k = (_wide_norm(c, x, n) for x, n in ((q, a.q_wide_norm), (k, a.k_wide_norm)))
    if a.q_norm is not None and a.k_norm is not None:
        q = _head_norm(c, q, a.q_norm, a.heads, a.head_dim)
        k = _head_norm(c, k, a.k_norm, a.kv_heads, a.head_dim)
    if a.q_layernorm is not None and a.k_layernorm is not None:
        q = _head_layernorm(c, q, a.q_layernorm, a.heads, a.head_dim)
        k = _head_layernorm(c, k, a.k_layernorm, a.kv_heads, a.head_dim)
    if rotate and a.rope is not None and a.positions is not None:
        # the tables come from this call's position_ids, so longrope's choice is made per call
        pos = names[a.positions]
        if constant:
            cos, sin = _constant_rotary(c, a.rope)
            tables = [cos, sin, _cache_positions(c, a.rope, pos)]
        else:
            tables = list(rotary_tables(c, pos, a.rope, full=False, head_axis=False))
        part: dict[str, Any] = {}
        rot = 2 * len(a.rope.attrs["inv_freq"])
        if rot < a.head_dim:  # partial rotary: the channels past rot pass through
            part["rotary_embedding_dim"] = rot
        if a.interleaved:  # adjacent pairs, each written back in place
            part["interleaved"] = 1
        q = c.op("RotaryEmbedding", [q, *tables], f"{a.scope}.q_rope", num_heads=a.heads, **part)
        k = c.op("RotaryEmbedding", [k, *tables], f"{a.scope}.k_rope", num_heads=a.kv_heads, **part)
    return q, k, v


def _attention_regions(g: Graph, emitter: Callable[[Attn], Callable]) -> list[Region]:
    """One region per attention block, from its input x to its merged heads and present K/V."""
    _no_mla(g)
    out = []
    for m in _every(g, ATTENTION_PATTERN):
        a = Attn.of(m)
        out.append(_region(m, (a.out, *a.present), emitter(a)))
    return out


def _standard_attention(a: Attn) -> Callable[[Lowering, dict[Ref, str]], None]:
    if a.sinks is not None:
        raise LoweringError(
            f"{a.scope}: attention sinks ({a.sinks}), which opset 23's Attention cannot take "
            "(the ort lowering's GroupQueryAttention takes them as head_sink)"
        )

    def emit(c: Lowering, names: dict[Ref, str]) -> None:
        q, k, v = _qkv_heads(c, a, names, rotate=True)
        attrs: dict[str, Any] = {
            "is_causal": 1,
            "q_num_heads": a.heads,
            "kv_num_heads": a.kv_heads,
            "scale": a.scale,
        }
        if c.dtype != "fp32":
            attrs["softmax_precision"] = 1  # fp32, as transformers does
        ins = [q, k, v, _bool_mask(c, a.window, a.chunk), names[a.past[0]], names[a.past[1]]]
        outs = [names[a.out], names[a.present[0]], names[a.present[1]]]
        c.named("Attention", ins, outs, f"{a.scope}.core", **attrs)

    return emit


def _no_mla(g: Graph) -> None:
    cfg = g.meta.get("config")
    if cfg is not None and cfg.is_mla:
        raise LoweringError(
            "latent attention (MLA) has no fused form (the decomposed lowering has it)"
        )


# -- ort: GroupQueryAttention, SkipSimplifiedLayerNormalization, MoE -------------------------
# GroupQueryAttention's CPU kernel rotates only heads of a multiple of 16 ("head_size shall be a
# multiple of 16"); other heads are rotated before it, by RotaryEmbedding
GQA_ROTARY_MULTIPLE = 16


def _gqa_lengths(c: Lowering) -> tuple[str, str]:
    """seqlens_k (B,) int32 = S - 1 for every row (padding is masked by the bias, not by the
    length), and total_sequence_length, an int32 scalar S."""

    def make() -> tuple[str, str]:
        s = "model.attention_mask"
        n_key = c.dim("attention_mask", 1, s)  # (1,) S
        total = c.op("Cast", [c.scalar(n_key, s)], s, to=6)
        last = c.op("Sub", [n_key, c.const([1], hint="one_vec")], s)
        rows = c.op("Expand", [last, c.dim("attention_mask", 0, s)], s)  # (B,)
        return c.op("Cast", [rows], s, to=6), total

    return c.shared(("gqa_lengths",), make)


def _bias(c: Lowering) -> str:
    """(B, 1, T, S) additive bias: 0 where the attention_mask keeps a key, the dtype's lowest
    finite value at left padding. Only the padding: GroupQueryAttention applies causal order
    (and its local_window_size) itself, so the bias is the mask's row expanded over T (six
    small ops a step, where the causal relation by cache index took about twenty)."""

    def make() -> str:
        s = "model.attention_mask"
        lowest = c.const(np.finfo(NP_TYPES[c.dtype]).min, c.dtype, "lowest")
        zero = c.const(0.0, c.dtype, "zero")
        keep = c.op("Unsqueeze", ["attention_mask", c.const([1, 2])], s)  # (B, 1, 1, S)
        row = c.op("Where", [c.op("Cast", [keep], s, to=9), zero, lowest], s)
        # the kernel wants the bias's T axis whole (it does not broadcast it)
        one = c.const([1], hint="one_vec")
        b, n_key = c.dim("attention_mask", 0, s), c.dim("attention_mask", 1, s)
        shape = c.op("Concat", [b, one, c.dim("input_ids", 1, s), n_key], s, axis=0)
        return c.op("Expand", [row, shape], s)

    return c.shared(("bias",), make)


# The ort lowering's rotary caches are tables of the file, one row per position up to the
# model's max_position_embeddings, at least ROTARY_ROWS_MIN rows (transformers rotates past
# max_position_embeddings too, and a small model's bench runs past its 128) and at most
# ROTARY_ROWS_CAP (128 Ki: Llama 3.1's, Phi-3.5's and gpt-oss's whole context, 64 MB at
# head_dim 128 in fp32, where a 10M-token context would take 5 GB). GroupQueryAttention indexes
# them by cache position and RotaryEmbedding by position_ids, so a decode step reads its rows
# instead of computing cos and sin of every position of the run (six ops, 0.05-0.13 ms a step
# on the int4 benchmark's Llama); a run past the rows is refused in one line
# (graphllm.runtime.session) before onnxruntime sees it.
ROTARY_ROWS_MIN, ROTARY_ROWS_CAP = 1 << 12, 1 << 17


def rotary_rows(c: Lowering) -> int:
    """Positions the rotary caches hold: max_position_embeddings, within the floor and cap."""
    rows = int(c.graph.meta["config"].max_position_embeddings)
    return min(max(rows, ROTARY_ROWS_MIN), ROTARY_ROWS_CAP)


def _constant_rotary(c: Lowering, rope: Node) -> tuple[str, str]:
    """cos and sin (N, rot/2) of positions 0 .. N-1 (N = rotary_rows), scaled by the rope's
    attention_scaling, computed at export in fp32 as the decomposed lowering computes them per
    run. longrope's (N_short + N, rot/2): its short frequencies' rows below long_from, then
    the long frequencies' N rows, which `_cache_positions` selects per call."""
    inv = np.asarray(rope.attrs["inv_freq"], dtype=np.float32)
    scale = float(rope.attrs.get("attention_scaling", 1.0))
    long = rope.attrs.get("long_inv_freq")
    long_key = None if long is None else (np.asarray(long).tobytes(), rope.attrs["long_from"])

    def make() -> tuple[str, str]:
        n = rotary_rows(c)
        pos = np.arange(n, dtype=np.float32)[:, None]
        angles = pos * inv  # (N, rot/2), fp32 as transformers' rotary embedding
        if long is not None:
            short = angles[: min(int(rope.attrs["long_from"]), n)]
            angles = np.concatenate([short, pos * np.asarray(long, dtype=np.float32)])
        k = len(c.tables) // 2  # Gemma 3's local layers have frequencies of their own
        prefix = "model.rotary_emb" + (f".{k}" if k else "")
        out = []
        for fn, name in ((np.cos, "cos_cache"), (np.sin, "sin_cache")):
            t = fn(angles)
            if scale != 1.0:
                t = t * np.float32(scale)
            out.append(c.table(f"{prefix}.{name}", t.astype(NP_TYPES[c.dtype]), n))
        return out[0], out[1]

    return c.shared(("rotary_cache", inv.tobytes(), scale, long_key), make)


def _cache_positions(c: Lowering, rope: Node, pos: str) -> str:
    """The rows of `_constant_rotary`'s caches that position_ids read: the positions, or for
    longrope past its short rows once the call's largest position + 1 passes long_from (the
    choice transformers makes per call)."""
    if rope.attrs.get("long_inv_freq") is None:
        return pos
    start = int(rope.attrs["long_from"])

    def make() -> str:
        s = "model.rotary_emb"
        top = c.op("ReduceMax", [pos], s, keepdims=0)
        long = c.op("Greater", [top, c.const(start - 1)], s)
        rows = min(start, rotary_rows(c))
        offset = c.op("Where", [long, c.const(rows), c.const(0, hint="zero")], s)
        return c.op("Add", [pos, offset], s)

    return c.shared(("cache_positions", pos, start), make)


def _ort_attention(a: Attn) -> Callable[[Lowering, dict[Ref, str]], None]:
    if a.chunk:
        raise LoweringError(
            f"{a.scope}: chunked attention (chunk {a.chunk}); GroupQueryAttention has only a "
            "sliding window (local_window_size)"
        )

    def emit(c: Lowering, names: dict[Ref, str]) -> None:
        # Q, K and V apart: the CPU kernel is slower on a packed QKV input (measured at decode)
        # its caches are indexed by cache position, one table for every call: longrope, which
        # picks its rows per call, and partial rotary are rotated before it instead
        fused = (
            a.rope is not None
            and a.head_dim % GQA_ROTARY_MULTIPLE == 0
            and 2 * len(a.rope.attrs["inv_freq"]) == a.head_dim
            and "long_inv_freq" not in a.rope.attrs
        )
        norms = (a.q_norm, a.k_norm, a.q_wide_norm, a.k_wide_norm)
        if fused and c.quantization is not None and all(n is None for n in norms):
            # packed Q/K/V straight from the MatMulNBits, as onnxruntime-genai's builder feeds
            # it, so no Split runs (float weights keep them apart: packed was slower at fp32)
            ins = [_qkv(c, a, names[a.x]), "", ""]
        else:
            # unfused: rotated first, by RotaryEmbedding reading the same constant caches
            ins = list(_qkv_heads(c, a, names, rotate=not fused, constant=True))
        seqlens, total = _gqa_lengths(c)
        cos, sin = _constant_rotary(c, a.rope) if fused and a.rope is not None else ("", "")
        ins += [names[a.past[0]], names[a.past[1]], seqlens, total, cos, sin, "", _bias(c)]
        ins.append(a.sinks or "")  # head_sink: a logit per head in each softmax's denominator
        while not ins[-1]:
            ins.pop()
        outs = [names[a.out], names[a.present[0]], names[a.present[1]]]
        attrs = {
            "num_heads": a.heads,
            "kv_num_heads": a.kv_heads,
            "scale": a.scale,
            "do_rotary": int(fused),
            "local_window_size": a.window or -1,
        }
        if fused and a.interleaved:  # adjacent pairs, each written back in place
            attrs["rotary_interleaved"] = 1
        c.named("GroupQueryAttention", ins, outs, f"{a.scope}.core", domain=MS, **attrs)

    return emit


@dataclass(frozen=True)
class Moe:
    """A routed-expert block, from its input x to the weighted sum of its experts, read from
    its match."""

    scope: str
    x: Ref
    router: str
    gate: str
    up: str
    down: str
    k: int
    normalize: bool
    out: Ref

    @classmethod
    def of(cls, m: Match) -> Moe:
        return cls(
            scope=m["combine"].name.rsplit(".", 2)[0],
            x=m.ref("x"),
            router=m["router"].inputs[1].node,
            gate=m["gate"].inputs[1].node,
            up=m["up"].inputs[1].node,
            down=m["down"].inputs[1].node,
            k=int(m["top_k"].attrs["k"]),
            normalize="renormalised" in m,
            out=m.ref("combine"),
        )


def _interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """(E, 2 ffn, d): rows gate 0, up 0, gate 1, up 1, ... (the CPU MoE kernel's SwiGLU layout)."""
    e, f, d = gate.shape
    return np.stack([gate, up], axis=2).reshape(e, 2 * f, d)


def _ort_moe(m: Moe) -> Callable[[Lowering, dict[Ref, str]], None]:
    def emit(c: Lowering, names: dict[Ref, str]) -> None:
        x = names[m.x]
        e, f, d = c.param_shape(m.gate)
        s = f"{m.scope}.gate"
        if c.quantization is not None:  # a linear like the others (the decomposed one is too)
            shape = c.param_shape(m.router)
            op, ins, attrs = nbits_matmul(c, x, m.router, (m.router,), shape, unchanged, s)
            logits = c.op(op, ins, s, **attrs)  # (B, T, E)
        else:
            logits = c.op("MatMul", [x, c.transposed(m.router)], s)  # (B, T, E)
        logits = c.op("Reshape", [logits, c.const([-1, e])], s)  # (B*T, E)
        name = f"{m.scope}.experts.*.gate_up_interleaved.weight"
        fc1 = c.initializer(name, (m.gate, m.up), (e, 2 * f, d), _interleave)
        attrs = {
            "k": m.k,
            "normalize_routing_weights": int(m.normalize),
            "activation_type": "swiglu",
            "swiglu_fusion": 1,
            "activation_alpha": 1.0,  # x * sigmoid(1 * x): SiLU
            "activation_beta": 0.0,  # times up, not up + 1
        }
        ins = [x, logits, fc1, "", m.down]  # down: (E, d, ffn) as the checkpoint has it
        c.named("MoE", ins, [names[m.out]], f"{m.scope}.experts", domain=MS, **attrs)

    return emit


def _moe_regions(g: Graph) -> list[Region]:
    """One MoE op per routed-expert block: SwiGLU experts routed by the top k of a softmax, or
    gpt-oss's stacked biased experts with the clamped SwiGLU, routed by a softmax over the
    top k; any other block is a LoweringError with the first pattern's reason."""
    out = []
    for node, m in find(g, MOE_PATTERN):
        if isinstance(m, Match):
            out.append(_region(m, (m.ref("combine"),), _ort_moe(Moe.of(m))))
            continue
        stacked = match(g, CLAMPED_MOE_PATTERN, node)
        if isinstance(stacked, Mismatch):
            raise LoweringError(m.reason)
        out.append(_region(stacked, (stacked.ref("combine"),), _ort_stacked_moe(stacked)))
    return out


def _ort_stacked_moe(m: Match) -> Callable[[Lowering, dict[Ref, str]], None]:
    """gpt-oss's experts as one MoE op: fc1 the interleaved gate_up_proj (E, 2 ffn, d) with its
    bias, fc2 down_proj (E, d, ffn) with its bias, each transposed from the checkpoint's
    (E, in, out) to the (E, N, K) the kernel reads; the clamp and alpha as attributes."""
    router, gate_up, down, act = m["router"], m["gate_up"], m["down"], m["act"]
    scope = m["combine"].name.rsplit(".", 2)[0]

    def emit(c: Lowering, names: dict[Ref, str]) -> None:
        x, w = names[m.ref("x")], router.inputs[1].node
        e = c.param_shape(w)[0]
        s, bias = f"{scope}.router", _proj_bias(router)
        if c.quantization is not None:  # a linear like the others (the decomposed one is too)
            op, ins, attrs = nbits_matmul(c, x, w, (w,), c.param_shape(w), unchanged, s, bias)
            logits = c.op(op, ins, s, **attrs)  # (B, T, E)
        else:
            logits = c.op("MatMul", [x, c.transposed(w)], s)  # (B, T, E)
            logits = c.op("Add", [logits, bias], s) if bias else logits
        logits = c.op("Reshape", [logits, c.const([-1, e])], s)  # (B*T, E)
        attrs: dict[str, Any] = {
            "k": int(m["top_k"].attrs["k"]),
            "normalize_routing_weights": 1,  # the softmax over the k chosen logits
            "activation_type": "swiglu",
            "swiglu_fusion": 1,  # gate and up interleaved, gate the even rows
            "activation_alpha": float(act.attrs["alpha"]),
            "activation_beta": 1.0,  # times (up + 1)
        }
        if act.attrs.get("limit") is not None:
            attrs["swiglu_limit"] = float(act.attrs["limit"])
        fc1, fc2 = (c.transposed(p.inputs[1].node) for p in (gate_up, down))  # (E, N, K)
        ins = [x, logits, fc1, gate_up.inputs[2].node, fc2, down.inputs[2].node]
        c.named("MoE", ins, [names[m.ref("combine")]], f"{scope}.experts", domain=MS, **attrs)

    return emit


def _skip_norm(m: Match) -> Callable[[Lowering, dict[Ref, str]], None]:
    norm, add = m["norm"], m["residual_add"]

    def emit(c: Lowering, names: dict[Ref, str]) -> None:
        outs = [names[Ref(norm.name)], "", "", names[Ref(add.name)]]
        eps = float(norm.attrs["eps"])
        ins = [names[m.ref("residual")], names[m.ref("branch")], _gamma(c, norm)]
        c.named("SkipSimplifiedLayerNormalization", ins, outs, norm.name, domain=MS, epsilon=eps)

    return emit


def _standard_regions(g: Graph) -> list[Region]:
    return _attention_regions(g, _standard_attention) + _gated_mlps(g, STANDARD.rows)


def _ort_regions(g: Graph) -> list[Region]:
    try:
        _no_mla(g)
    except LoweringError as e:  # DeepSeek: say what else the ort ops cannot do, its routing
        for _, routing in find(g, MOE_PATTERN):
            if isinstance(routing, Mismatch):
                raise LoweringError(f"{e}; and {routing.reason}") from None
        raise
    out = _attention_regions(g, _ort_attention)
    out += _moe_regions(g)
    out += _gated_mlps(g, ORT.rows)
    for m in _each(g, SKIP_NORM_PATTERN):
        out.append(_region(m, (m.ref("residual_add"), m.ref("norm")), _skip_norm(m)))
    return out


STANDARD = OpSet(
    "standard",
    rows={
        **DECOMPOSED,
        "linear": _linear,
        "linear_bias": _linear_bias,
        "expert_linear": _expert_linear,
        "embedding": _embedding,
        "rmsnorm": _rmsnorm,
        "layernorm": _layernorm,
    },
    regions=_standard_regions,
)
ORT = OpSet(
    "ort",
    rows={**STANDARD.rows, "silu": _quick_gelu},
    regions=_ort_regions,
    domains=(("", OPSET), (MS, 1)),
)
LOWERINGS.update(standard=STANDARD, ort=ORT)


# -- the default lowering -------------------------------------------------------------------
# provider -> family -> lowerings, fastest first; the first that can express the model is the
# default. CPU, measured on onnxruntime 1.32's CPU provider (2 cores, fp32, batch 1; prefill of
# 128 tokens and 64 decode steps, benchmarks/runtime_vs_transformers.py): `ort` first for every
# family. Its GroupQueryAttention appends to a cache buffer bound as both past and present, so a
# decode step copies no cache and allocates none: 5.52 ms a token against 5.95 for `standard`,
# whose Attention concatenates the whole past into a new present each step (Llama hidden 512,
# 8 layers; the run docs/onnx-and-bench.md quotes); prefill within 7% of `standard`. With routed experts its MoE op also prefills and
# decodes 2-3x faster than the decomposed routing of `standard`. CUDA: not measured (no GPU
# where this was written): `decomposed`, which runs wherever standard ONNX ops do.
_ORDER = ("ort", "standard", "decomposed")
DEFAULT_LOWERINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "cpu": {family: _ORDER for family in FAMILY_TABLE},
    "cuda": {family: ("decomposed",) for family in FAMILY_TABLE},
}


def can_express(ops: str, graph: Graph) -> str | None:
    """None when lowering `ops` can express the graph, else the one-line reason it cannot."""
    try:
        placed(graph, LOWERINGS[ops].regions(graph))
    except LoweringError as e:
        return f"the {ops} lowering cannot express {graph.name}: {e}"
    return None


def default_lowering(graph: Graph, device: str = "cpu") -> str:
    """The fastest exact lowering of `graph` on `device` ('cpu' or 'cuda') that expresses it."""
    config, dtype = graph.meta["config"], graph.meta["act_dtype"]
    table = DEFAULT_LOWERINGS.get(device, DEFAULT_LOWERINGS["cpu"])
    for ops in table.get(config.model_type, ("decomposed",)):
        if ops == "ort" and device == "cpu" and dtype != "fp32" and config.is_moe:
            continue  # the MoE op's CPU kernel is fp32 only
        if can_express(ops, graph) is None:
            return ops
    return "decomposed"
