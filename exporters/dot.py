"""Graphviz views of a Graph, drawn the way the flow through a decoder is usually explained.

Views (one function each, all returning DOT text):
- `model`: token ids -> embedding -> decoder blocks (runs of identical blocks as one box "× N",
  or every block) -> final norm -> LM head -> logits.
- `block`: the residual stream down the middle, each side path (a child scope of the layer:
  attention, MLP or MoE) as one box after its RMSNorm, and the residual adds.
- `attention`: every op of the layer's attention scope, per head (one lane per head, grouped
  by the K/V head they share; one representative lane for many heads).
- `ffn`: every op of the layer's MLP or MoE scope: router, experts (per expert lane), combine,
  shared expert and its gate.
- `tokens`: one column per token position, every op of the block in each; edges between columns
  only into the inputs that the mixing ops read along the key axis, for the key positions that
  the op table's relations (the causal mask, a window) let each query position see.

Everything is derived from the Graph: which nodes a view holds comes from `graph.meta["scopes"]`,
clusters are scopes, lanes are axes of role head/kv_head/expert, edge labels are tensor types
(`TensorType.format`, batch left out where it is 1), and token-mixing ops are coloured from the
tokens pass's verdicts. Weights are folded into their consumer's label. `--color` shades boxes
by the cost pass (FLOPs, bytes) or the roofline pass (seconds), with a legend.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from graphllm.errors import GraphllmError
from graphllm.ir import TOKEN_ROLES, Dim, Graph, Node, TensorType
from graphllm.ops import COMMUNICATION, CONTRACTION, OPS, SOURCE
from graphllm.passes import meta_result, run
from graphllm.passes.attention_region import core_attention_region
from graphllm.passes.cost import layer_of, layer_scopes, scopes_of
from graphllm.passes.parallel.figures import comm_bytes
from graphllm.passes.parallel.sharding import Mesh, Split
from graphllm.passes.tokens import position_letters, sequence

VIEWS = ("model", "block", "attention", "ffn", "tokens")
COLORS = ("flops", "bytes", "time")
MAX_LANES = 4  # draw every head/expert up to this many, else one representative lane
MAX_TOKENS = 16

FONT = "Helvetica"
MIX_FILL, MIX_LINE = "#fdae61", "#d7301f"
FILL = {CONTRACTION: "#e4ecf7"}  # by op category; others plain
PLAIN, SCOPE_FILL = "#f7f7f7", "#eef3fb"
RAMP = ("#eff3ff", "#c6dbef", "#9ecae1", "#6baed6", "#3182bd", "#08519c")

KIND_TITLE = {
    "layer": "decoder block",
    "attention": "attention",
    "core_attention": "core attention",
    "mlp": "gated MLP",
    "moe": "MoE",
    "router": "router",
    "experts": "experts",
    "shared_expert": "shared expert",
    "norms": "RMSNorm",
    "embedding": "embedding",
    "lm_head": "LM head",
    "mtp": "MTP module",
    "linear_attention": "linear attention (Gated DeltaNet)",  # Qwen3-Next's hybrid layers
    "mamba": "Mamba2",  # Nemotron-H
}
LANE_NOUN = {"head": "head", "kv_head": "kv head", "expert": "expert"}

# display captions, keyed by op: presentation only (analyses never read these)
CAPTIONS: dict[str, Callable[[Node], str]] = {
    "embedding": lambda n: "row lookup",
    "split_heads": lambda n: "split into heads",
    "merge_heads": lambda n: "concat heads",
    "repeat_kv": lambda n: "share K/V heads",
    "kv_concat": lambda n: "append to KV cache",
    "rope": lambda n: "RoPE",
    "scores": lambda n: "Q Kᵀ",
    "mul_const": lambda n: f"× {n.attrs['value']:.4g}",
    # Gemma 2 and 3's logit softcap
    "softcap": lambda n: f"{n.attrs['cap']:.4g}·tanh(x / {n.attrs['cap']:.4g})",
    "mask": lambda n: ", ".join(
        (["causal"] if n.attrs.get("causal") else [])
        + ([f"window {n.attrs['window']}"] if n.attrs.get("window") else [])
        + ([f"chunked {n.attrs['chunk']}"] if n.attrs.get("chunk") else [])  # Llama 4 layers
    ),
    # Llama 4's weightless QK-norm and its NoPE layers' query temperature
    "l2norm": lambda n: "L2 norm (no weight)",
    "attn_temperature": lambda n: (
        f"× log(⌊(i + 1) / {n.attrs['floor_scale']}⌋ + 1) · {n.attrs['attn_scale']:.4g} + 1"
    ),
    "pv": lambda n: "P V",
    # the hybrid layers' rows and Gated DeltaNet's
    "causal_conv1d": lambda n: f"causal conv, {n.attrs['kernel']} taps per channel",
    "causal_conv1d_bias": lambda n: f"causal conv, {n.attrs['kernel']} taps per channel + b",
    "state_concat": lambda n: "after the conv state",
    "conv_state": lambda n: "last K-1 inputs: the conv state",
    "zero_padding": lambda n: "padded positions to 0",
    "select_blocked": lambda n: "regroup channels by key-head group",
    "select_rows": lambda n: "regroup the weight's rows",
    "l2normalize": lambda n: "L2 norm (no weight)",
    "delta_decay": lambda n: "g = −exp(A_log)·softplus(a + dt_bias)",
    "gated_delta_chunked": lambda n: f"gated delta rule, chunks of {n.attrs['chunk']}",
    "gated_delta_chunked_state": lambda n: (
        f"gated delta rule from the state, chunks of {n.attrs['chunk']}"
    ),
    "gated_delta_step": lambda n: "gated delta rule, token by token from the state",
    "kda_chunked": lambda n: f"KDA (decay per key channel), chunks of {n.attrs['chunk']}",
    "kda_chunked_state": lambda n: f"KDA from the state, chunks of {n.attrs['chunk']}",
    "kda_step": lambda n: "KDA, token by token from the state",
    "wkv4_scan": lambda n: "WKV (RWKV-4), token by token",
    "wkv4_scan_state": lambda n: "WKV (RWKV-4), token by token from the state",
    # RecurrentGemma's RG-LRU and its conv's dispatch
    "linear_recurrence": lambda n: "h = a·h + x, token by token",
    "linear_recurrence_state": lambda n: "h = a·h + x, token by token from the state",
    "one_token_state": lambda n: "the conv state for one new token, zeros for more",
    "gated_rmsnorm": lambda n: "RMSNorm · silu(z)",
    "mul": lambda n: "elementwise ×",
    "add": lambda n: "+",
    "gate_mul": lambda n: "× gate",
    "topk": lambda n: f"top-{n.attrs['k']}",
    "normalize": lambda n: "weights sum to 1",
    "moe_dispatch": lambda n: "route to experts",
    "moe_combine": lambda n: "weighted combine",
    "moe_dispatch_pairs": lambda n: "route each choice's own vector to its expert",
    "moe_gather": lambda n: "each choice's expert output, uncombined",
    "moe_scale_slots": lambda n: "× router weight (input)",
    "moe_sum": lambda n: "sum of experts",
    # gpt-oss's sinks, interleaved gate/up and clamped SwiGLU
    "softmax_sink": lambda n: "softmax with a sink logit per head",
    "split_interleaved": lambda n: "gate = even, up = odd channels",
    "clamped_swiglu": lambda n: (
        f"(clamp(up, ±{n.attrs['limit']:.4g}) + 1) · g·σ({n.attrs['alpha']:.4g}·g), "
        f"g = min(gate, {n.attrs['limit']:.4g})"
    ),
}


# -- the drawing: boxes, edges, nested clusters -> DOT text ------------------------------------
@dataclass
class Box:
    id: str
    lines: list[str]
    cluster: tuple[str, ...] = ()  # keys of the clusters it sits in, outermost first
    members: tuple[Node, ...] = ()  # graph nodes it stands for
    share: float = 1.0  # of the members' cost it stands for (one lane of several)
    role: str = "op"  # op | scope (a collapsed scope) | io (inputs, outputs, boundary) | note
    attrs: dict[str, str] = field(default_factory=dict)


@dataclass
class Drawing:
    title: str
    boxes: dict[str, Box] = field(default_factory=dict)
    edges: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict)
    clusters: dict[str, dict[str, str]] = field(default_factory=dict)  # key -> attrs
    orders: list[list[str]] = field(default_factory=list)  # boxes kept left to right on a rank
    legend: list[str] = field(default_factory=list)  # HTML table cells under the title

    def box(self, box: Box) -> Box:
        return self.boxes.setdefault(box.id, box)

    def edge(self, src: str, dst: str, label: str = "", **attrs: str) -> None:
        if src == dst:
            return
        e = self.edges.get((src, dst))
        if e is None:
            self.edges[(src, dst)] = {"label": label, **attrs} if label else dict(attrs)
        elif label and label not in e.get("label", "").split(", "):
            e["label"] = f"{e['label']}, {label}" if e.get("label") else label

    def cluster(self, key: str, label: str, **attrs: str) -> None:
        self.clusters.setdefault(key, {"label": label, **attrs})

    def to_dot(self) -> str:
        label = _q(self.title)
        if self.legend:
            label = (
                '<<table border="0" cellspacing="3" cellpadding="3">'
                f'<tr><td colspan="{len(self.legend)}"><b>{_html(self.title)}</b></td></tr>'
                f"<tr>{''.join(self.legend)}</tr></table>>"
            )
        out = [
            f"digraph {_q(self.title)} {{",
            f'  graph [fontname="{FONT}", fontsize=12, labelloc=t, label={label}, '
            "nodesep=0.3, ranksep=0.35, newrank=true];",
            f'  node [fontname="{FONT}", fontsize=11, shape=box, style="rounded,filled", '
            f'fillcolor="{PLAIN}", margin="0.12,0.05"];',
            f'  edge [fontname="{FONT}", fontsize=10, arrowsize=0.7];',
        ]
        tree: dict[tuple[str, ...], list[Box]] = {}
        for b in self.boxes.values():
            tree.setdefault(b.cluster, []).append(b)
        # frames in the order their first box was drawn (a stable picture from run to run)
        paths = list(dict.fromkeys(p[:i] for p in tree for i in range(1, len(p) + 1)))
        counter = iter(range(1, 1 << 30))

        def emit(path: tuple[str, ...], indent: str) -> None:
            for b in tree.get(path, []):
                out.append(f"{indent}{_q(b.id)} [{_attrs({'label': _text(b.lines), **b.attrs})}];")
            for child in (p for p in paths if p[:-1] == path):
                attrs = self.clusters.get(child[-1], {"label": child[-1]})
                out.append(f"{indent}subgraph cluster_{next(counter)} {{")
                out.append(f"{indent}  graph [{_attrs(attrs)}];")
                emit(child, indent + "  ")
                out.append(f"{indent}}}")

        emit((), "  ")
        orders = list(self.orders)
        for group in self._rank_groups():
            out.append("  { rank=same; " + " ".join(f"{_q(x)};" for x in group) + " }")
            if len({self.boxes[x].cluster for x in group}) == 1:
                orders.append(group)  # siblings in one frame keep the graph's order: Q, K, V
        for k, seq in enumerate(orders):
            # flat edges between clusters do not order them; anchors outside all clusters do
            anchors = [f"order{k}:{i}" for i in range(len(seq))]
            for a, x in zip(anchors, seq):
                out.append(f'  {_q(a)} [style=invis, shape=point, width=0, height=0, label=""];')
                out.append(f"  {_q(a)} -> {_q(x)} [style=invis];")
            chain = " -> ".join(_q(a) for a in anchors)
            out.append(f"  {{ rank=same; {chain} [style=invis]; }}")
        for (src, dst), attrs in self.edges.items():
            tail = f" [{_attrs(attrs)}]" if attrs else ""
            out.append(f"  {_q(src)} -> {_q(dst)}{tail};")
        out.append("}")
        return "\n".join(out) + "\n"

    def _rank_groups(self) -> list[list[str]]:
        """Ops of one kind at the same depth share a rank: Q, K and V side by side, the heads
        and the token columns aligned."""
        preds: dict[str, list[str]] = {}
        for (src, dst), attrs in self.edges.items():
            if attrs.get("style") != "invis":
                preds.setdefault(dst, []).append(src)
        depth: dict[str, int] = {}
        for box_id in self.boxes:  # iterative longest path (a 126-block chain is deep)
            stack = [box_id]
            while stack:
                x = stack[-1]
                todo = [p for p in preds.get(x, []) if p not in depth]
                if todo:
                    stack += todo
                    continue
                stack.pop()
                depth[x] = 1 + max((depth[p] for p in preds.get(x, [])), default=-1)
        groups: dict[tuple[str, int], list[str]] = {}
        for b in self.boxes.values():
            if b.role == "op" and b.members:
                groups.setdefault((b.members[0].op, depth[b.id]), []).append(b.id)
        return [g for g in groups.values() if len(g) > 1]


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _text(lines: Iterable[str]) -> str:
    return "\n".join(x for x in lines if x)


def _attrs(attrs: dict[str, str]) -> str:
    return ", ".join(f"{k}={_q(str(v))}" for k, v in attrs.items())


# -- what every view needs from the graph ----------------------------------------------------
class _Ctx:
    def __init__(self, graph: Graph) -> None:
        self.g = graph
        self.scopes: dict[str, str] = graph.meta.get("scopes", {})
        self.verdicts = run(graph, ["tokens"])["tokens"].verdicts
        # shapes with whole sizes only: the MoE slot count C (T*k/E) stays a letter
        self.bindings = {k: v for k, v in graph.bindings.items() if float(v).is_integer()}

    def fmt(self, t: TensorType, drop: Iterable[str] = ()) -> str:
        dims = tuple(d for d in t.dims if d.role not in set(drop))
        return TensorType(dims, t.dtype).format(self.bindings, drop_unit_batch=True)

    def fmt_row(self, t: TensorType) -> str:
        """The part of a tensor one token position holds (its first token axis left out)."""
        k = next((i for i, d in enumerate(t.dims) if d.role == "token"), None)
        dims = t.dims if k is None else t.dims[:k] + t.dims[k + 1 :]
        return TensorType(dims, t.dtype).format(self.bindings, drop_unit_batch=True)

    def short(self, name: str) -> str:
        """`name` inside the innermost scope that strictly contains it."""
        inner = [p for p, _ in scopes_of(self.g, name) if p != name]
        return name[len(inner[-1]) + 1 :] if inner else name

    def mixes(self, name: str) -> bool:
        v = self.verdicts.get(name)
        return bool(v and v.mixes)

    def layers(self) -> list[str]:
        return layer_scopes(self.g)

    def layer(self, i: int) -> str:
        """Layer i's scope; past the main model's layers, the MTP modules (layer 61 of
        DeepSeek-V3 with --mtp), whose block views draw their block in place."""
        mtp = [p for p, k in self.scopes.items() if k == "mtp"]
        # an MTP module's own decoder block (Qwen3-Next's mtp.layers.0) is not another module
        mtp = [p for p in mtp if not any(p.startswith(q + ".") for q in mtp)]
        main = self.layers()
        layers = main + mtp
        if not 0 <= i < len(layers):
            n = len(main)
            has = f"{n} layer{'s' * (n != 1)}"
            has += f" and {len(mtp)} MTP module{'s' * (len(mtp) != 1)}" if mtp else ""
            raise GraphllmError(f"--layer {i}: the model has {has} (0-{len(layers) - 1})")
        return layers[i]

    def child_scopes(self, prefix: str) -> list[str]:
        """Scopes directly under `prefix` (no other scope between)."""
        under = [p for p in self.scopes if p.startswith(prefix + ".")]
        direct = [p for p in under if not any(p.startswith(q + ".") for q in under if q != p)]
        # Qwen3-Next's MTP scope `mtp` holds its decoder block `mtp.layers.0` (an
        # MTP scope too), whose attention and MoE are drawn as DeepSeek's block's are: in place
        nested = [p for p in direct if self.scopes.get(prefix) == self.scopes[p] == "mtp"]
        return [c for p in direct for c in (self.child_scopes(p) if p in nested else [p])]

    def computing(self, prefix: str) -> list[Node]:
        return [n for n in self.g.scope(prefix) if OPS[n.op].category != SOURCE]

    def lines(self, n: Node) -> list[str]:
        """Name and op (once where they are the same word), and what the op does."""
        short, cap = self.short(n.name), CAPTIONS.get(n.op, lambda _: "")(n)
        # a traced model's generic row by its aten op alone: its signature is for the passes
        shown = n.op.split("[", 1)[0]
        op = shown if shown not in (short, f"aten.{short}") else ""
        return [short, f"{op} · {cap}" if op and cap else op or cap]

    def operand_lines(self, n: Node, drop: Iterable[str] = ()) -> list[str]:
        """Weights and secondary graph inputs, folded into the consumer's label."""
        lines = []
        for i, r in enumerate(n.inputs):
            src = self.g[r.node]
            if src.op == "param":
                tag = {"weight": "W", "bias": "b"}.get(src.name.rsplit(".", 1)[-1], "param")
                users = [u.name for u in self.g.users(src) if u is not n]
                tied = f" (shared with {users[0]})" if users else ""
                lines.append(f"{tag} {self.fmt(src.out, drop)}{tied}")
            elif src.op == "input" and i > 0:
                lines.append(f"+ {src.name}")
        return lines

    def summary(self, members: Iterable[Node]) -> str:
        """What a collapsed scope holds, from the roles of its axes."""
        sizes: dict[str, int] = {}
        windows, kinds, chunks = set(), set(), set()
        for n in members:
            kinds |= {k for _, k in scopes_of(self.g, n.name)}
            for t in n.outputs:
                for d in t.dims:
                    if d.size is not None:
                        sizes.setdefault(d.role, d.size)
            if OPS[n.op].relation is not None and n.attrs.get("window"):
                windows.add(n.attrs["window"])
            if OPS[n.op].relation is not None and n.attrs.get("chunk") and "causal" in n.attrs:
                chunks.add(n.attrs["chunk"])  # a chunked mask, not a chunked recurrence
        parts = []
        members = list(members)
        recurrent = _recurrence(self.g, members)
        scans = _MAMBA1_SCANS + _LRU_SCANS
        channels = {_channels(n.out.dims) for n in members if n.op in scans}
        if ("linear_attention" in kinds or channels) and recurrent:
            # a Gated DeltaNet layer says its own heads, not attention's; a Mamba-1 mixer its
            # channels, which the trace names by the config's intermediate_size (ffn) where
            # they are as many (a Jamba block's MLP keeps its own ffn)
            drop = ("head", "kv_head", "head_dim")
            sizes = {k: v for k, v in sizes.items() if k not in drop}
            if sizes.get("ffn") in channels:
                del sizes["ffn"]
            parts.append(recurrent)
        if "head" in sizes:
            kv = sizes.get("kv_head")
            parts.append(f"{sizes['head']} heads" + (f" / {kv} kv heads" if kv else ""))
            if "head_dim" in sizes:
                parts.append(f"d_h {sizes['head_dim']}")
        if "expert" in sizes:
            parts.append(f"{sizes['expert']} experts, top-{sizes.get('topk', '?')}")
            if "shared_expert" in kinds:
                parts.append("shared expert")
        elif "ffn" in sizes:
            parts.append(f"ffn {sizes['ffn']}")
        parts += [f"window {w}" for w in sorted(windows)]
        parts += [f"chunked {c}" for c in sorted(chunks)]
        return ", ".join(parts)


_MAMBA1_SCANS = ("selective_scan", "selective_state_update")
_WKV_SCANS = ("wkv4_scan", "wkv4_scan_state")  # RWKV's
_LRU_SCANS = ("linear_recurrence", "linear_recurrence_state")


def kind_title(kind: str, members: Iterable[Node]) -> str:
    """A scope's title by its kind; a Mamba mixer's by its scan (Mamba-1's selective scan, a
    traced Mamba or Jamba, or Mamba2's chunked one), a linear attention's by its recurrence
    (RWKV's WKV, Gated DeltaNet's rule, or the RG-LRU of Griffin's recurrent block, a traced
    RecurrentGemma's)."""
    title = KIND_TITLE.get(kind, kind)
    ops = {n.op for n in members}
    if title == "Mamba2" and ops & set(_MAMBA1_SCANS):
        return "Mamba"
    if kind == "linear_attention" and ops & set(_WKV_SCANS):
        return "linear attention (RWKV-4 WKV)"
    if kind == "linear_attention" and ops & set(_LRU_SCANS):
        return "recurrent block (RG-LRU)"
    return title


def _recurrence(g: Graph, members: Iterable[Node]) -> str:
    """A linear-attention layer's key and value heads and widths, the chunk of its
    recurrence and its conv's taps, read off the ops that read the tokens in order (a row with
    a relation and one position axis out)."""
    lines, kernel = [], None
    for n in members:
        if OPS[n.op].relation is None or sum(d.role in TOKEN_ROLES for d in n.out.dims) != 1:
            continue
        if "kernel" in n.attrs:
            kernel = n.attrs["kernel"]
            continue
        if "shift" in n.attrs:  # a token shift (RWKV's) is no recurrence of its own
            continue
        q, out = g.type_of(n.inputs[0]).dims, n.out.dims  # (B, T, key heads, d_k), value heads
        if len(q) != 4 or len(out) != 4:  # a scan over channels (Mamba-1's: B, D, T)
            lines.append(f"{_channels(out)} channels")
            continue
        lines.append(f"{q[2].size} key / {out[2].size} value heads, d_k {q[3].size}")
        lines.append(f"d_v {out[3].size}")
        if "chunk" in n.attrs:
            lines.append(f"chunks of {n.attrs['chunk']}")
    return ", ".join(lines + ([f"conv {kernel}"] if kernel is not None else []))


def _channels(dims: tuple) -> int:
    """The entries a position of a scan's output holds: its axes other than batch and tokens."""
    return math.prod(d.size or 1 for d in dims if d.role not in TOKEN_ROLES and d.role != "batch")


# -- lanes: per head / per expert -------------------------------------------------------------
class _Lanes:
    """A node whose output has a lane axis (roles[0], or the grouped roles[1]) is drawn per lane."""

    def __init__(self, roles: tuple[str, ...], nodes: Iterable[Node], max_lanes: int) -> None:
        self.roles, self.max = roles, max_lanes
        self.dims: dict[str, Dim] = {}
        for n in nodes:
            d = self.dim(n)
            if d is not None:
                self.dims.setdefault(d.role, d)
        self.main = self.dims.get(roles[0])
        self.group = self.dims.get(roles[1]) if len(roles) > 1 else None

    def dim(self, n: Node) -> Dim | None:
        """The lane axis of `n`'s output: never the innermost axis, which holds features (the
        router's expert logits are one vector per token, not one lane per expert)."""
        return next((d for d in n.out.dims[:-1] if d.role in self.roles and d.size), None)

    def drawn(self, d: Dim) -> list[int]:
        return list(range(d.size)) if d.size <= self.max else [0]  # type: ignore[operator]

    def source(self, src: Dim, dst: Dim, j: int) -> int:
        """The lane of `src` that lane j of `dst` reads: the same, or its group (GQA)."""
        return j if src == dst else j * src.size // dst.size  # type: ignore[operator]

    def path(self, d: Dim, j: int) -> list[tuple[str, str]]:
        """(key, label) of the lane clusters of lane j of axis d, outermost first."""
        if self.group is not None and self.main is not None:
            if d == self.main:
                g = self.source(self.group, self.main, j)
                return [self._group(g), (f"lane:{d.role}{j}", self._label(d, j))]
            return [self._group(j)]
        return [(f"lane:{d.role}{j}", self._label(d, j))]

    def _group(self, g: int) -> tuple[str, str]:
        assert self.main is not None and self.group is not None
        n = self.main.size // self.group.size  # type: ignore[operator]
        label = f"kv head {g} · query heads {g * n}-{g * n + n - 1}"
        if len(self.drawn(self.group)) < self.group.size:  # type: ignore[operator]
            label += f" (1 of {self.group.size} groups)"
        return f"lane:{self.group.role}{g}", label

    def _label(self, d: Dim, j: int) -> str:
        noun = LANE_NOUN.get(d.role, d.role)
        if len(self.drawn(d)) < d.size:  # type: ignore[operator]
            return f"{noun} {j} (1 of {d.size}, the others alike)"
        return f"{noun} {j}"

    def note(self, extra: str = "") -> str | None:
        """The sharing note: which query heads share which K/V head."""
        if self.main is None:
            return None
        h = self.main.size
        noun = LANE_NOUN.get(self.main.role, self.main.role)
        lines = [f"{h} {noun}s" + (f", {len(self.drawn(self.main))} drawn" if h > self.max else "")]
        if self.group is None and self.main.role == "head":
            lines.append("MHA: each head has its own K and V")
        if self.group is not None:
            g = self.group.size
            n = h // g  # type: ignore[operator]
            if g == 1:
                lines.append(f"MQA: all {h} query heads share kv head 0")
            else:
                groups = [f"heads {i * n}-{i * n + n - 1} share kv head {i}" for i in range(g)]
                if g > 4:
                    groups = [*groups[:2], "…", groups[-1]]
                lines.append("GQA: " + ", ".join(groups[:2]) + ("," if len(groups) > 2 else ""))
                lines += [", ".join(groups[2:])] if len(groups) > 2 else []
        if extra:
            lines.append(extra)
        return "\n".join(lines)


# -- the generic builder: nodes of a scope, collapsed groups, lanes --------------------------
class _View:
    def __init__(
        self,
        ctx: _Ctx,
        title: str,
        keep: list[Node],
        root: str | None,
        collapse: dict[str, str] | None = None,
        lanes: _Lanes | None = None,
        describe: Callable[[str, list[Node]], list[str]] | None = None,
    ) -> None:
        self.ctx, self.g = ctx, ctx.g
        self.d = Drawing(title)
        self.keep = {n.name for n in keep}
        self.nodes = keep
        self.root = root
        self.collapse = collapse or {}
        self.lanes = lanes
        self.describe = describe or self.scope_lines
        self.raw_paths: dict[str, list[tuple[str, str]]] = {}
        self.canon = self._merge_siblings()

    def _merge_siblings(self) -> dict[str, str]:
        """Sibling scopes of one kind that an edge joins share a frame (the router's gate
        linear and its softmax/top-k scope are one router)."""
        scopes, canon, joined = self.ctx.scopes, {}, set()

        def inner(name: str) -> str | None:
            found = scopes_of(self.g, name)
            return found[-1][0] if found else None

        def parent(p: str) -> str | None:
            above = [q for q, _ in scopes_of(self.g, p) if q != p]
            return above[-1] if above else None

        def find(p: str) -> str:
            while canon.get(p, p) != p:
                p = canon[p]
            return p

        for n in self.nodes:
            b = inner(n.name)
            for r in n.inputs:
                a = inner(r.node) if r.node in self.keep else None
                if a is None or b is None or a == b or scopes[a] != scopes[b]:
                    continue
                if parent(a) == parent(b):
                    joined |= {a, b}
                    ra, rb = find(a), find(b)
                    if ra != rb:
                        canon[rb] = ra
        return {p: find(p) for p in joined}

    # node instances: one box per lane, or the node itself
    def lane_dim(self, n: Node) -> Dim | None:
        return self.lanes.dim(n) if self.lanes else None

    def ids(self, n: Node) -> list[tuple[str, int | None]]:
        if n.name in self.collapse:
            return [(self.collapse[n.name], None)]
        d = self.lane_dim(n)
        if d is None:
            return [(n.name, None)]
        return [(f"{n.name}#{j}", j) for j in self.lanes.drawn(d)]  # type: ignore[union-attr]

    def scope_path(self, name: str) -> list[tuple[str, str]]:
        """The scope clusters that hold `name`, from the view's root inward."""
        if self.root is None:
            return []
        out: list[tuple[str, str]] = []
        for p, kind in scopes_of(self.g, name):
            if p == self.root or p.startswith(self.root + "."):
                title = KIND_TITLE.get(kind, kind)
                if p in self.canon:  # merged with its siblings
                    out.append((self.canon[p], title))
                    continue
                short = self.ctx.short(p) if p != self.root else p
                out.append((p, title if short == title else f"{title} · {short}"))
        return out

    def build(self) -> Drawing:
        ctx, lanes = self.ctx, self.lanes
        groups: dict[str, list[Node]] = {}
        for n in self.nodes:
            if n.name in self.collapse:
                groups.setdefault(self.collapse[n.name], []).append(n)
                continue
            d = self.lane_dim(n)
            drop = tuple(lanes.roles) if lanes and d is not None else ()  # one lane's weight
            path = self.scope_path(n.name)
            for box_id, j in self.ids(n):
                full = list(path)
                if d is not None and j is not None:
                    full = self._insert_lanes(full, lanes.path(d, j))  # type: ignore[union-attr]
                lines = [*ctx.lines(n), *ctx.operand_lines(n, drop)]
                share = 1.0 / d.size if d is not None else 1.0  # type: ignore[operator]
                self.raw_paths[box_id] = full
                self.d.box(Box(box_id, lines, (), (n,), share))
        for key, members in groups.items():
            self.raw_paths[key] = self.scope_path(key)[:1]
            self.d.box(Box(key, self.describe(key, members), (), tuple(members), role="scope"))
        self._edges()
        self._clusters()
        for n in self.nodes:  # lanes left to right: head 0, head 1, ...
            if self.lane_dim(n) is not None and len(self.ids(n)) > 1:
                self.d.orders.append([box_id for box_id, _ in self.ids(n)])
        return self.d

    def scope_lines(self, key: str, members: list[Node]) -> list[str]:
        kind = self.ctx.scopes.get(key, "")
        return [kind_title(kind, members), self.ctx.short(key), self.ctx.summary(members)]

    def _insert_lanes(self, path: list[tuple[str, str]], lane: list[tuple[str, str]]) -> list:
        """Lane clusters go right under the deepest scope that holds every lane node."""
        k = len([p for p in path if p[0] in self._lane_home])
        return path[:k] + lane + path[k:]

    @cached_property
    def _lane_home(self) -> set[str]:
        sets = [{p for p, _ in self.scope_path(n.name)} for n in self.nodes if self.lane_dim(n)]
        return set.intersection(*sets) if sets else set()

    def edge_label(self, src: Node, index: int) -> str:
        drop = tuple(self.lanes.roles) if self.lanes and self.lane_dim(src) else ()
        label = self.ctx.fmt(src.outputs[index], drop)
        return label + (f" [{index}]" if len(src.outputs) > 1 else "")

    def _sources(self, src: Node, index: int) -> tuple[list[tuple[str, int | None]], Dim | None]:
        """The boxes that stand for tensor `src`[index], and their lane axis."""
        if src.op == "input":
            return self._io_in(src), self.lane_dim(src)
        if src.name not in self.keep:
            return [(self._boundary_in(src, index), None)], None
        return self.ids(src), self.lane_dim(src)

    def _edges(self) -> None:
        g, lanes = self.g, self.lanes
        for n in self.nodes:
            for i, r in enumerate(n.inputs):
                src = g[r.node]
                if src.op == "param" or (src.op == "input" and (i > 0 or n.name in self.collapse)):
                    continue  # folded into the label (or hidden inside a collapsed box)
                label = self.edge_label(src, r.index)
                src_ids, sd = self._sources(src, r.index)
                dd = self.lane_dim(n)
                for box_id, j in self.ids(n):
                    picks = [s for s, _ in src_ids]
                    if lanes is not None and sd is not None and dd is not None and j is not None:
                        want = lanes.source(sd, dd, j)  # lane to lane, or a head to its kv head
                        picks = [s for s, k in src_ids if k == want]
                    for s in picks:
                        self.d.edge(s, box_id, label)
        for n in self.nodes:
            outside = [u for u in g.users(n) if u.name not in self.keep]
            if outside:
                out = self._boundary_out(n, outside)
                for s, _ in self.ids(n):
                    self.d.edge(s, out, self.edge_label(n, 0))
        for out_name, r in g.outputs.items():
            if r.node in self.keep and r.node not in self.collapse:
                src = g[r.node]
                # a side output (the K/V a cache keeps) is dashed; the model's result is not
                side = any(u.name in self.keep for u in g.users(src))
                io = self.d.box(Box(f"out:{out_name}", [out_name], role="io"))
                io.attrs.update(shape="ellipse", style="dashed" if side else "solid")
                for s, _ in self.ids(src):
                    style = {"style": "dashed"} if side else {}
                    self.d.edge(s, io.id, self.edge_label(src, r.index), **style)

    def _io_in(self, src: Node) -> list[tuple[str, int | None]]:
        d = self.lane_dim(src)
        out = []
        for box_id, j in self.ids(src):
            lines = [src.name] + ([LANE_NOUN.get(d.role, d.role) + f" {j}"] if d else [])
            b = self.d.box(Box(f"in:{box_id}", lines, role="io"))
            b.attrs.update(shape="ellipse", style="filled", fillcolor="white")
            out.append((b.id, j))
        return out

    def _boundary_in(self, src: Node, index: int) -> str:
        b = self.d.box(Box(f"from:{src.name}:{index}", [f"from {src.name}", src.op], role="io"))
        b.attrs.update(shape="box", style="dashed,rounded", group="stream")
        return b.id

    def _boundary_out(self, n: Node, users: list[Node]) -> str:
        more = f" (+{len(users) - 1})" if len(users) > 1 else ""
        b = self.d.box(Box(f"to:{n.name}", [f"to {users[0].name}{more}"], role="io"))
        b.attrs.update(shape="box", style="dashed,rounded", group="stream")
        return b.id

    def _clusters(self) -> None:
        count: dict[str, int] = {}
        for path in self.raw_paths.values():
            for i in range(len(path)):
                key = "|".join(k for k, _ in path[: i + 1])
                count[key] = count.get(key, 0) + 1
        for box_id, path in self.raw_paths.items():
            keys = []
            for i, (_, label) in enumerate(path):
                key = "|".join(k for k, _ in path[: i + 1])
                is_lane = path[i][0].startswith("lane:")
                if count[key] < 2 and not is_lane and i > 0:
                    continue  # a scope of one box (a norm) is not worth a frame
                keys.append(key)
                kind = self.ctx.scopes.get(path[i][0], "")
                style = "rounded,dashed" if kind == "shared_expert" else "rounded"
                self.d.cluster(key, label, style=style, color="#888888")
            self.d.boxes[box_id].cluster = tuple(keys)


# -- the views ---------------------------------------------------------------------------------
def model_view(ctx: _Ctx, layer: int, all_layers: bool) -> Drawing:
    """Token ids -> embedding -> blocks -> final norm -> LM head -> logits."""
    g = ctx.g
    layers = ctx.layers()
    ctx.layer(layer)  # range check
    of_layer, runs = _layer_runs(g, layers, all_layers)
    run_key = {layers[i]: f"blocks:{r[0]}" for r in runs for i in r}
    collapse = {name: run_key[lay] for name, lay in of_layer.items()}
    # an MTP module's decoder block is one box; its norms, projection and head stay drawn
    mtp = {f"mtp:{m['prefix']}": m for m in g.meta.get("mtp", [])}
    collapse |= {name: key for key, m in mtp.items() for name in m["block"]}
    keep = [n for n in g.nodes() if OPS[n.op].category != SOURCE]
    runs_by_key = {f"blocks:{r[0]}": r for r in runs}

    def lines(key: str, members: list[Node]) -> list[str]:
        if key in mtp:
            return _mtp_lines(ctx, mtp[key], members)
        r = runs_by_key[key]
        kinds = [ctx.scopes[c] for c in ctx.child_scopes(layers[r[0]]) if ctx.scopes[c] != "norms"]
        head = f"decoder block × {len(r)}" if len(r) > 1 else f"decoder block {r[0]}"
        where = f"layers {r[0]}-{r[-1]}" if len(r) > 1 else layers[r[0]]
        per = [m for m in members if of_layer[m.name] == layers[r[0]]]
        body = " + ".join(kind_title(k, per) for k in kinds)
        summary = _rope_note(g, r[0], "attention" in kinds, ctx.summary(per))
        return [head, where, body, summary]

    cfg = g.meta.get("config")
    title = f"{g.name}: model"
    if cfg is not None and cfg.text_decoder_of:
        title += f" (the text decoder of {cfg.text_decoder_of}; its vision tower is not modelled)"
    d = _View(ctx, title, keep, None, collapse, describe=lines).build()
    for key, r in runs_by_key.items():
        if layer in r and len(runs) > 1:
            d.boxes[key].attrs.update(penwidth="2.5")
    return d


def _layer_runs(
    g: Graph, layers: list[str], all_layers: bool
) -> tuple[dict[str, str], list[list[int]]]:
    """Each layer node's layer scope, and the runs of consecutive alike layers (the same ops,
    names and scalar attrs) that one box draws; with `all_layers`, one box a layer."""
    of_layer: dict[str, str] = {}
    signature: dict[str, list] = {p: [] for p in layers}
    for n in g.nodes():
        if OPS[n.op].category == SOURCE:
            continue
        lay = layer_of(g, n.name)
        if lay:
            of_layer[n.name] = lay
            simple = {k: v for k, v in n.attrs.items() if isinstance(v, int | float | str)}
            signature[lay].append((n.name[len(lay) :], n.op, sorted(simple.items())))
    runs: list[list[int]] = []
    for i, p in enumerate(layers):
        same = runs and signature[layers[runs[-1][-1]]] == signature[p]
        if same and not all_layers:
            runs[-1].append(i)
        else:
            runs.append([i])
    return of_layer, runs


def _mtp_lines(ctx: _Ctx, m: dict[str, Any], members: list[Node]) -> list[str]:
    """The box of an MTP module's decoder block: its depth, scope, sub-layers and summary."""
    p = m["prefix"]
    kinds = [ctx.scopes[c] for c in ctx.child_scopes(p) if ctx.scopes[c] != "norms"]
    body = " + ".join(KIND_TITLE.get(k, k) for k in kinds)
    return [f"MTP depth {m['depth']}: decoder block", p, body, ctx.summary(members)]


def _rope_note(g: Graph, first: int, attends: bool, summary: str) -> str:
    """A run's summary with its position encoding where the model has more than one kind: NoPE
    on an attention layer that does not rotate, or each RoPE of a model that has two."""
    cfg = g.meta.get("config")
    # a Mamba2, MLP or MoE layer has no RoPE to lack
    if cfg is not None and first < cfg.num_hidden_layers and not cfg.rotates(first) and attends:
        # a run is of alike blocks, so of NoPE layers only or of RoPE ones only
        return ", ".join(filter(None, (summary, "NoPE")))
    if cfg is not None and first < cfg.num_hidden_layers and cfg.sliding_rope is not None:
        # two RoPEs in the model (Gemma 3's local and global layers): each run says its own
        rope = cfg.rope_of(first)
        scaled = f" {rope.type} ×{rope.factor:g}" if rope.type != "default" else ""
        return ", ".join(filter(None, (summary, f"RoPE θ {rope.theta:,.0f}{scaled}")))
    return summary


def block_view(ctx: _Ctx, layer: int) -> Drawing:
    """The residual stream down the middle, each side path collapsed to one box.

    On a partitioned graph (graphllm.passes.partition) the collectives are drawn in place, as
    their own boxes, and each side path says which shard of it a rank holds.
    """
    p = ctx.layer(layer)
    keep = ctx.computing(p)
    plan = ctx.g.meta.get("partition")
    collapse = {}
    for child in ctx.child_scopes(p):
        nodes = ctx.computing(child)
        members = [n for n in nodes if OPS[n.op].category != COMMUNICATION]
        if len(members) >= 2:
            collapse.update({n.name: child for n in members})
            inner = {n.name for n in members}
            for n in nodes:  # a collective between two ops of the path stays inside its box
                internal = n.inputs and n.inputs[0].node in inner
                if (
                    n.name not in inner
                    and internal
                    and any(u.name in inner for u in ctx.g.users(n))
                ):
                    collapse[n.name] = child
    title = f"{ctx.g.name}: block {layer}"
    if plan is not None:
        title += f", one rank of {plan.strategy.devices} ({plan.strategy.describe()})"
    view = _View(ctx, title, keep, p, collapse)
    d = view.build()
    if plan is not None:
        _shards(d, ctx, plan)
    for box_id, path in view.raw_paths.items():
        box = d.boxes[box_id]
        if box.role == "op" and len(path) == 1:  # at the layer's own level: the residual adds
            box.attrs.update(group="stream")
    for (src, dst), attrs in d.edges.items():
        if d.boxes[src].attrs.get("group") == "stream" == d.boxes[dst].attrs.get("group"):
            attrs.update(weight="8", penwidth="2")
    return d


COMM_FILL, COMM_LINE = "#c7e9c0", "#238b45"


def _shards(d: Drawing, ctx: _Ctx, plan: Any) -> None:
    """Collectives as green hexagons with their group and payload; shard notes on side paths."""
    for b in d.boxes.values():
        if b.role == "op" and b.members and OPS[b.members[0].op].category == COMMUNICATION:
            _collective_box(b, ctx)
        elif b.role == "scope":
            b.lines += _shard_lines(_held_axes(b.members), plan.mesh)
            inside = Counter(
                f"{m.op} over {m.attrs['mesh']}"
                for m in b.members
                if OPS[m.op].category == COMMUNICATION
            )
            b.lines += [f"inside: {k} x {v}" for k, v in inside.items()]
    d.legend.append(_cell("collective (partition pass)", bgcolor=COMM_FILL, color=COMM_LINE))


def _collective_box(b: Box, ctx: _Ctx) -> None:
    n = b.members[0]
    payload = comm_bytes(ctx.g, n)[0]
    b.lines = [
        ctx.short(n.name),
        f"{n.op} over {n.attrs['mesh']} ({n.attrs['group']} ranks)",
        f"payload {si(payload, 'B')}",
    ]
    b.attrs.update(shape="hexagon", fillcolor=COMM_FILL, color=COMM_LINE, penwidth="1.5")


@dataclass(frozen=True)
class _HeldAxis:
    """A tensor axis as one rank holds it: its local dim (`h/8`), the splits that cut it (from
    the node's `meta["sharding"]`), and the roles of the tensor's axes."""

    local: Dim
    splits: tuple[Split, ...]
    roles: frozenset[str]

    @property
    def meshes(self) -> tuple[str, ...]:
        return tuple(m for m, _ in self.splits)

    def blocks(self, meshes: tuple[str, ...]) -> int:
        return math.prod(b for m, b in self.splits if m in meshes)


SHARD_ROLES = ("head", "kv_head", "expert", "ffn", "token")


def _held_axes(members: Iterable[Node]) -> dict[str, _HeldAxis]:
    """Per role of SHARD_ROLES, the first axis of that role the scope's ops hold split (in graph
    order), else the first they hold whole."""
    found: dict[str, _HeldAxis] = {}
    for axis in _computed_axes(members):
        old = found.get(axis.local.role)
        if axis.local.role in SHARD_ROLES and (old is None or (axis.splits and not old.splits)):
            found[axis.local.role] = axis
    return found


def _computed_axes(members: Iterable[Node]) -> Iterator[_HeldAxis]:
    """Every axis of every tensor the rank computes (collectives only move them)."""
    for n in members:
        if OPS[n.op].category == COMMUNICATION:
            continue
        for t, sh in zip(n.outputs, n.meta.get("sharding", ())):
            roles = frozenset(d.role for d in t.dims)
            yield from (_HeldAxis(d, splits, roles) for d, splits in zip(t.dims, sh.axes))


def _shard_lines(axes: dict[str, _HeldAxis], mesh: Mesh) -> list[str]:
    """Which shard of a side path rank r holds (r: its index on the mesh axes that split it)."""
    out = []
    head = axes.get("head")
    if head is not None and head.splits:
        out.append(f"{head.local.name} per rank: rank r holds {_held('head', head, mesh)}")
        kv = axes.get("kv_head", head)  # MHA: the keys and values have the query heads' axis
        held = _held("kv head", kv, mesh, head.meshes)
        out.append(f"and {held}" if _share(kv, mesh, head.meshes) == 1 else held)
    expert = axes.get("expert")
    if expert is not None and expert.splits:
        out.append(f"{expert.local.name} per rank: rank r holds {_held('expert', expert, mesh)}")
    ffn = axes.get("ffn")
    if ffn is not None and ffn.splits:
        if "expert" in ffn.roles:
            per = " x ".join(ffn.meshes)
            out.append(f"each expert's ffn/{ffn.blocks(ffn.meshes)} per {per} rank")
        else:
            out.append(f"{ffn.local.name} per rank: rank r holds {_held('column', ffn, mesh)}")
    token = axes.get("token")
    if token is not None and token.splits:
        out.append(f"tokens {token.local.name} per {' x '.join(token.meshes)} rank")
    return out


def _held(noun: str, axis: _HeldAxis, mesh: Mesh, over: tuple[str, ...] = ()) -> str:
    """Rank r's block of `axis` over the mesh axes `over` (by default those that split it):
    `heads 8r..8r+7`, `head r`, or `kv head r//2 (each on 2 ranks)` where ranks share a block."""
    share = _share(axis, mesh, over)
    r = "r" if share == 1 else f"r//{share}"
    per = int(axis.local.size)  # type: ignore[arg-type]
    if per > 1:
        at = r if share == 1 else f"({r})"
        noun, r = f"{noun}s", f"{per}{at}..{per}{at}+{per - 1}"
    return f"{noun} {r}" if share == 1 else f"{noun} {r} (each on {share} ranks)"


def _share(axis: _HeldAxis, mesh: Mesh, over: tuple[str, ...] = ()) -> int:
    """How many ranks along the mesh axes `over` hold each block of `axis` (1: each its own)."""
    over = over or axis.meshes
    return math.prod(mesh.size(m) for m in over) // axis.blocks(over)


def _side_scope(ctx: _Ctx, layer: int, kinds: tuple[str, ...], what: str) -> str:
    p = ctx.layer(layer)
    found = [c for c in ctx.child_scopes(p) if ctx.scopes[c] in kinds]
    if not found:
        raise GraphllmError(f"layer {layer} has no {what} scope to draw")
    return found[0]


def attention_view(ctx: _Ctx, layer: int, max_lanes: int = MAX_LANES) -> Drawing:
    """Q/K/V projections, heads, RoPE, core attention per head, concat, output projection; or
    the layer's other token mixer drawn in its place: Gated DeltaNet, or a Mamba2
    mixer's in_proj, conv, scan per head, gated norm and out_proj."""
    kinds = ("attention", "linear_attention", "mamba")
    root = _side_scope(ctx, layer, kinds, "attention")
    keep = ctx.computing(root)
    lanes = _Lanes(("head", "kv_head"), keep, max_lanes)
    kind = KIND_TITLE[ctx.scopes[root]]
    view = _View(ctx, f"{ctx.g.name}: {kind}, block {layer}", keep, root, lanes=lanes)
    d = view.build()
    note = lanes.note()
    if note:
        d.box(Box("note:lanes", note.split("\n"), (root,), role="note", attrs={"shape": "note"}))
    return d


def ffn_view(ctx: _Ctx, layer: int, max_lanes: int = MAX_LANES) -> Drawing:
    """The gated MLP, or the MoE: router, experts, weighted combine, shared expert and gate."""
    root = _side_scope(ctx, layer, ("mlp", "moe"), "MLP or MoE")
    keep = ctx.computing(root)
    lanes = _Lanes(("expert",), keep, max_lanes)
    kind = KIND_TITLE[ctx.scopes[root]]
    view = _View(ctx, f"{ctx.g.name}: {kind}, block {layer}", keep, root, lanes=lanes)
    d = view.build()
    if lanes.main is not None:
        extra = []
        topk = next((n.attrs["k"] for n in keep if "k" in n.attrs), None)
        if topk is not None:
            extra.append(f"each token goes to its top-{topk}")
        slot = next((x for n in keep for x in n.out.dims if x.role == "slot"), None)
        if slot is not None and slot.name in ctx.g.bindings:
            c = ctx.g.bindings[slot.name]
            extra.append(f"{slot.name} = {float(c):g} token slots per expert (balanced routing)")
        note = lanes.note("\n".join(extra))
        d.box(Box("note:lanes", note.split("\n"), (root,), role="note", attrs={"shape": "note"}))
    return d


def allowed_keys(graph: Graph, node: Node, n: int) -> tuple[np.ndarray, np.ndarray]:
    """[lo, hi] of key positions each query position 0..n-1 of a core-attention node may see:
    the relations (causal mask, window) of the (query, key) pair tensors it is chained with."""
    region = core_attention_region(graph)
    own = OPS[node.op].relation
    if own is not None and not region.attends(node.name):
        # an op that reads the tokens in order on its own (a causal conv's window of
        # K positions, a recurrence's prefix)
        return own(node.attrs, np.arange(n))
    todo = [node.name] + [r.node for r in node.inputs if r.node in region.pairs]
    seen: set[str] = set()
    lo, hi = np.zeros(n, np.int64), np.full(n, n - 1, np.int64)
    while todo:
        name = todo.pop()
        if name in seen or name not in region.pairs | region.consumers:
            continue
        seen.add(name)
        m = graph[name]
        rel = OPS[m.op].relation
        if rel is not None:
            rlo, rhi = rel(m.attrs, np.arange(n))
            lo, hi = np.maximum(lo, rlo), np.minimum(hi, rhi)
        todo += [r.node for r in m.inputs if r.node in region.pairs]
        todo += [u.name for u in graph.users(m) if u.name in region.pairs | region.consumers]
    return lo, hi


def tokens_view(ctx: _Ctx, layer: int) -> Drawing:
    """One column per token position; edges between columns only where mixing ops gather."""
    past, n = sequence(ctx.g)
    if past:
        raise GraphllmError("the tokens view draws a prefill: leave --past-len at 0")
    if not 1 <= n <= MAX_TOKENS:
        raise GraphllmError(f"the tokens view draws 1 to {MAX_TOKENS} tokens, not {n}")
    columns = _Columns(ctx, layer, n)
    for x in columns.keep:
        columns.inputs_of(x)
    columns.outputs()
    return columns.d


class _Columns:
    """The tokens view's drawing: every op of a block once per token column."""

    def __init__(self, ctx: _Ctx, layer: int, n: int) -> None:
        self.ctx, self.g, self.n = ctx, ctx.g, n
        self.keep = ctx.computing(ctx.layer(layer))
        self.names = {x.name for x in self.keep}
        self.d = Drawing(f"{self.g.name}: tokens through block {layer}")
        outside = [r.node for x in self.keep for r in x.inputs if r.node not in self.names]
        outside = [x for x in dict.fromkeys(outside) if OPS[self.g[x].op].category != SOURCE]
        for t in range(n):
            self.d.cluster(f"col{t}", f"token {t + 1}", style="rounded", color="#888888")
            for x in outside:
                self.io(t, f"from:{x}", f"token {t + 1} in, from {ctx.short(x)}")
            for x in self.keep:
                self.d.box(Box(self.at(t, x.name), ctx.lines(x), (f"col{t}",), (x,), 1 / n))
        if n > 1 and outside:
            self.d.orders.append([self.at(t, f"from:{outside[0]}") for t in range(n)])

    @staticmethod
    def at(t: int, name: str) -> str:
        return f"t{t + 1}:{name}"

    def io(self, t: int, name: str, text: str) -> str:
        b = self.d.box(Box(self.at(t, name), [text], (f"col{t}",), role="io"))
        b.attrs.update(style="dashed,rounded")
        return b.id

    def inputs_of(self, x: Node) -> None:
        """Edges into op `x`: within each column, or across them for an input read along the
        key axis of a mixing op."""
        ins, outs = position_letters(self.g, x)
        row = outs[0][0] if outs and outs[0] else None
        keys = allowed_keys(self.g, x, self.n) if self.ctx.mixes(x.name) else None
        for i, r in enumerate(x.inputs):
            src = self.g[r.node]
            if OPS[src.op].category == SOURCE:
                continue  # weights, and position ids (each position reads its own)
            name = r.node if r.node in self.names else f"from:{r.node}"
            label = self.ctx.fmt_row(src.outputs[r.index])
            if keys is not None and len(ins[i]) == 1 and ins[i][0] != row:
                self.gather(name, x, label, *keys)
                continue
            for t in range(self.n):
                self.d.edge(self.at(t, name), self.at(t, x.name), label)

    def gather(self, name: str, x: Node, label: str, lo: np.ndarray, hi: np.ndarray) -> None:
        """Query t of `x` gathers the keys it may see, from the columns that hold them."""
        for t in range(self.n):
            for k in range(max(int(lo[t]), 0), min(int(hi[t]), self.n - 1) + 1):
                attrs = {"color": MIX_LINE, "class": "gather"}
                if k != t:
                    attrs.update(constraint="false", penwidth="1.5")
                self.d.edge(self.at(k, name), self.at(t, x.name), label if k == t else "", **attrs)

    def outputs(self) -> None:
        """Each op read outside the block leaves every column."""
        for x in self.keep:
            if all(u.name in self.names for u in self.g.users(x)):
                continue
            for t in range(self.n):
                out = self.io(t, f"to:{x.name}", f"token {t + 1} out")
                self.d.edge(self.at(t, x.name), out, self.ctx.fmt_row(x.out))


# -- colour: mixing from the tokens pass, cost from the cost/roofline passes -------------------
def _metric(n: Node, color: str) -> float:
    if color == "time":
        return meta_result(n, "time").seconds
    c = meta_result(n, "cost")
    return c.flops if color == "flops" else c.bytes


UNITS = {"flops": "FLOP", "bytes": "B", "time": "s"}


def si(v: float, unit: str) -> str:
    """1.2 GFLOP, 340 MB, 12 µs."""
    if v == 0:
        return f"0 {unit}"
    if unit == "s":
        for scale, p in ((1, ""), (1e-3, "m"), (1e-6, "µ"), (1e-9, "n")):
            if v >= scale:
                return f"{v / scale:.3g} {p}s"
        return f"{v / 1e-12:.3g} ps"
    for scale, p in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.3g} {p}{unit}"
    return f"{v:.3g} {unit}"


def _style(d: Drawing, ctx: _Ctx, color: str | None) -> None:
    """Fill mixing boxes (or frame them, when cost fills), shade by cost, write the legend."""
    values: dict[str, float] = {}
    for b in d.boxes.values():
        if b.role == "note":
            b.attrs.update(fillcolor="#fffff0", style="filled")
        if b.role not in ("op", "scope"):
            continue
        if color:
            values[b.id] = sum(_metric(m, color) for m in b.members) * b.share
        _mark_mixing(b, ctx, filled=color is None)
    mix = {"bgcolor": MIX_FILL} if color is None else {"color": MIX_LINE, "border": "3"}
    cells = [_cell("mixes tokens (tokens pass)", **mix)]
    if color:
        cells += _shade(d, values, color)
    d.legend = cells + d.legend  # a view's own cells (collectives) after the shared ones


def _mark_mixing(b: Box, ctx: _Ctx, filled: bool) -> None:
    """A box holding mixing ops: filled (or, when cost fills the boxes, framed) in the mixing
    colour, with the tokens pass's reason as its tooltip; other boxes get their plain fill."""
    mixing = [m for m in b.members if ctx.mixes(m.name)]
    if mixing:
        b.attrs.update({"class": "mixing", "tooltip": ctx.verdicts[mixing[0].name].reason})
        if b.role == "scope":
            b.lines.append("mixes tokens: " + ", ".join(dict.fromkeys(m.op for m in mixing)))
    if not filled:
        if mixing:
            b.attrs.update(color=MIX_LINE, penwidth="3")
    elif mixing:
        b.attrs.update(fillcolor=MIX_FILL, color=MIX_LINE, penwidth="1.5")
    elif b.role == "scope":
        b.attrs.setdefault("fillcolor", SCOPE_FILL)
    elif b.members:
        b.attrs.setdefault("fillcolor", FILL.get(OPS[b.members[0].op].category, PLAIN))


def _shade(d: Drawing, values: dict[str, float], color: str) -> list[str]:
    """Boxes filled on a log ramp of their cost, the figure under their label; the ramp's
    legend cells."""
    positive = [v for v in values.values() if v > 0]
    lo, hi = (min(positive), max(positive)) if positive else (1.0, 1.0)
    unit, steps = UNITS[color], len(RAMP)

    def level(v: float) -> int:
        if v <= 0:
            return -1
        if hi <= lo:
            return steps - 1
        x = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
        return min(int(x * steps), steps - 1)

    for box_id, v in values.items():
        b, k = d.boxes[box_id], level(v)
        b.attrs["fillcolor"] = RAMP[k] if k >= 0 else "white"
        if k >= steps - 2:
            b.attrs["fontcolor"] = "white"
        b.lines.append(si(v, unit))
    cells = [_cell(f"{COLOR_TITLE[color]}:"), _cell(f"0 {unit}", bgcolor="white")]
    for k, c in enumerate(RAMP):
        edge = lo * (hi / lo) ** (k / steps)
        cells.append(_cell(f"from {si(edge, unit)}", bgcolor=c, white=k >= steps - 2))
    return cells


COLOR_TITLE = {"flops": "FLOPs", "bytes": "bytes moved", "time": "roofline time"}


def _cell(text: str, white: bool = False, **attrs: str) -> str:
    body = _html(text)
    if white:
        body = f'<font color="white">{body}</font>'
    if "bgcolor" in attrs or "color" in attrs:
        attrs.setdefault("border", "1")
    extra = "".join(f' {k}="{v}"' for k, v in attrs.items())
    return f"<td{extra}>{body}</td>"


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- entry point ---------------------------------------------------------------------------------
def view_dot(
    graph: Graph,
    view: str,
    *,
    layer: int = 0,
    all_layers: bool = False,
    color: str | None = None,
    hardware: Any = None,
    attention: str = "flash",
    max_lanes: int = MAX_LANES,
) -> str:
    """DOT text of one view of `graph` (the tokens view draws one column per token T)."""
    if view not in VIEWS:
        raise GraphllmError(f"unknown view {view!r}; the views are {', '.join(VIEWS)}")
    if color is not None and color not in COLORS:
        raise GraphllmError(f"--color {color!r}: use one of {', '.join(COLORS)}")
    ctx = _Ctx(graph)
    if color == "time":
        if hardware is None:
            raise GraphllmError("--color time needs a device: --hardware NAME")
        run(graph, ["roofline"], hardware=hardware, attention=attention)
    elif color:
        run(graph, ["cost"], attention=attention)
    if view == "model":
        d = model_view(ctx, layer, all_layers)
    elif view == "block":
        d = block_view(ctx, layer)
    elif view == "attention":
        d = attention_view(ctx, layer, max_lanes)
    elif view == "ffn":
        d = ffn_view(ctx, layer, max_lanes)
    else:
        d = tokens_view(ctx, layer)
    _style(d, ctx, color)
    return d.to_dot()


def _rope_caption(n: Node) -> str:
    """RoPE, and where it differs from the whole-head rotation: partial rotary, longrope."""
    parts = ["RoPE"]
    rot, width = 2 * len(n.attrs["inv_freq"]), n.out.dims[-1].size
    if rot != width:
        parts.append(f"on {rot} of {width} channels")
    if "long_inv_freq" in n.attrs:
        parts.append(f"longrope: long factors from position {n.attrs['long_from']}")
    return ", ".join(parts)


# partial rotary and longrope (Phi-4-mini, Phi-3.5-mini): shown on the RoPE boxes
CAPTIONS["rope"] = _rope_caption


# DeepSeek-V2/V3 (MLA and its router): captions for their ops
CAPTIONS.update(
    {
        "rope_pairs": lambda n: f"RoPE (pairs, {n.attrs['layout']})",
        "concat": lambda n: f"concat [{', '.join(n.attrs.get('parts', ()))}]",
        "latent_heads": lambda n: "latent → per-head K/V",
        "split_heads_weight": lambda n: "kv_b_proj → per-head W_uk, W_uv",
        "absorb_q": lambda n: "q · W_uk (into latent)",
        "absorb_o": lambda n: "· W_uv (out of latent)",
        "scores_mqa": lambda n: "Q Kᵀ (shared latent key)",
        "pv_mqa": lambda n: "P V (shared latent)",
        "bias_add": lambda n: "+ correction bias (choice only)",
        "group_limit": lambda n: f"best {n.attrs['topk_group']} of {n.attrs['n_group']} groups",
        "gather_k": lambda n: "unbiased weights of the chosen",
    }
)
