"""The `cost` pass: FLOPs and bytes moved per op, rolled up by scope and by op kind.

Conventions (docs/costs.md):
- FLOPs come from the op table (graphllm.ops.node_flops): a contraction costs 2 x the product of
  its axis sizes; other ops a per-element constant. `matmul` counts the GEMMs (projections, experts,
  Q K^T and P V over the full T x S score matrix, the LM head over every position it computes), as
  a kernel without mask skipping does and as torch's FlopCounterMode counts; `matmul_causal` counts
  only the (query, key) pairs the mask allows; `total` is every op. MoE experts count exactly the
  B*T*k routed token-expert pairs. Training adds the backward pass: 2x forward for matmuls (input
  and weight gradients), 1x for the other ops. Bytes are the forward pass's; the roofline of a
  training step takes 3x them (the backward pass reads weights and saved activations again and
  writes gradients, about twice the forward traffic) — an estimate, and labelled as one.
- Bytes: each op reads its inputs and writes its outputs at their storage dtypes. Views (reshapes)
  move nothing. A weight read by a movement op is gathered (the embedding reads B*T rows); routed
  expert weights are read for the experts that B*T tokens touch under uniform routing,
  E * (1 - (1 - k/E)^(B*T)). The KV cache is written where new keys/values enter it and read by
  attention. `attention="naive"` materialises every op of core attention, the score matrix
  included; `"flash"` (the default) fuses it: Q, K and V are read once (K/V only at the key
  positions some query may see, and before any GQA head copy), the output written once, nothing of
  size T x S touches memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from graphllm.build.kinds import LAYER, SCOPE_KINDS
from graphllm.ir import TOKEN_ROLES, Graph, Node, TensorType
from graphllm.models.workload import ATTENTION_FORMS, nbytes
from graphllm.ops import MOVEMENT, OPS, SOURCE, node_flops
from graphllm.passes.attention_region import core_attention_region
from graphllm.passes.memory import cache_bytes
from graphllm.passes.registry import register
from graphllm.passes.stored import param_bytes
from graphllm.passes.tokens import position_letters


@dataclass(frozen=True)
class OpCost:
    """One node's cost; left in `node.meta["cost"]`."""

    # FLOPs are exact counts: ints, or a Fraction where balanced routing splits B*T*k pairs over
    # E experts unevenly (node_flops); bytes are floats (expected expert reads are fractional)
    flops: Any  # matmul + other (forward, or forward + backward when training)
    matmul: Any
    matmul_causal: Any
    bytes_read: float
    bytes_written: float
    weight_bytes: float  # of bytes_read: weights
    kv_bytes: float  # of bytes_read + bytes_written: KV cache

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved (inf when nothing moves)."""
        return self.flops / self.bytes if self.bytes else float("inf")


ZERO = OpCost(0, 0, 0, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class CostReport:
    attention: str
    training: bool
    flops: dict[str, Any]
    bytes: dict[str, Any]
    per_layer: list[dict[str, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Costing:
    """Costs nodes one at a time; knows the fused-attention region and the KV cache tensors."""

    def __init__(self, graph: Graph, attention: str, training: bool) -> None:
        if attention not in ATTENTION_FORMS:
            choices = " or ".join(repr(a) for a in ATTENTION_FORMS)
            raise ValueError(f"attention must be {choices}, got {attention!r}")
        self.g, self.flash, self.training = graph, attention == "flash", training
        self.b = graph.bindings
        appends = [n for n in graph.nodes() if OPS[n.op].in_place]
        # the cache: what in-place ops append to, and what they return
        self.kv_tensors = {n.name for n in appends} | {
            n.inputs[i].node for n in appends for i in OPS[n.op].in_place
        }
        # prefill: present K/V enter the cache where they are produced
        self.cache_writes = {r.node for r in graph.cache_outputs().values()} - self.kv_tensors
        self.region = core_attention_region(graph)
        self.pairs = self.region.pairs
        self.fused = self.region.copies if self.flash else frozenset()
        self._allowed_memo: dict = {}
        self._flops_memo: dict = {}

    def _attends(self, name: str) -> bool:
        return self.region.attends(name)

    def _relation_node(self, n: Node) -> Node | None:
        """The mask-like node (a row with a `relation`) on the pair-tensor chain of `n`."""
        seen, todo = set(), [n]
        while todo:
            m = todo.pop()
            if m.name in seen:
                continue
            seen.add(m.name)
            if OPS[m.op].relation is not None:
                return m
            nbrs = [self.g[r.node] for r in m.inputs] + self.g.users(m)
            # a boolean pair tensor is a selection of keys that another chain's scores made
            # (DSA's indexer), not these scores
            todo += [x for x in nbrs if x.name in self.pairs and x.out.dtype != "bool"]
        return None

    def _allowed(self, n: Node) -> tuple[float, float]:
        """(share of (query, key) pairs allowed, share of key positions some query may see)."""
        rel = self._relation_node(n)
        key = (rel.op, repr(sorted(rel.attrs.items())), n.out) if rel is not None else None
        if key is not None and key in self._allowed_memo:
            return self._allowed_memo[key]
        self._allowed_memo[key] = out = self._allowed_uncached(n, rel)
        return out

    def _allowed_uncached(self, n: Node, rel: Node | None) -> tuple[float, float]:
        pair_t = (
            n.out
            if n.name in self.pairs
            else next(self.g.type_of(r) for r in n.inputs if r.node in self.pairs)
        )
        query_dim, *_, key_dim = [d for d in pair_t.dims if d.role in TOKEN_ROLES]
        if rel is None:
            return 1, 1.0
        p, s = query_dim.position_range(self.b)
        n_keys = int(key_dim.size or self.b[key_dim.name])
        last_key = key_dim.position_range(self.b)[1] - 1
        first_key = last_key + 1 - n_keys  # a rolling cache holds the last positions only
        lo, hi = OPS[rel.op].relation(rel.attrs, np.arange(p, s))
        lo, hi = np.maximum(lo, first_key), np.minimum(hi, last_key)
        allowed = np.clip(hi - lo + 1, 0, None)
        if rel.attrs.get("topk"):  # selected keys: at most k of the allowed ones a query
            allowed = np.minimum(allowed, int(rel.attrs["topk"]))
        # a Fraction: the causal count, matmul x pairs, is then the exact allowed-pair count
        pairs = Fraction(int(allowed.sum()), int((s - p) * n_keys))
        keys = max(int(hi.max()) - int(lo.min()) + 1, 0) / n_keys
        return pairs, keys

    def _experts_touched(self, n: Node, weight: TensorType) -> float:
        """Expected share of the experts held here that their tokens touch, uniform top-k routing.

        The tokens come from the slots `n` computes on: this rank's (token, expert) pairs spread
        over the experts it holds, so on a partitioned graph (experts split, or tokens split) the
        count is the rank's own. N tokens choosing k of E experts leave one untouched with
        probability (1 - k/E)^N."""
        cfg = self.g.meta["config"]
        k, e = cfg.num_experts_per_tok, cfg.num_experts
        slots = self.g.type_of(n.inputs[0])
        last = slots.dims[-1]
        pairs = slots.numel(self.b) / float(last.size or self.b[last.name])
        held = float(weight.dims[0].size or self.b[weight.dims[0].name])
        tokens = pairs * e / (held * k)  # the tokens whose choices can land on these experts
        return 1.0 - (1.0 - k / e) ** tokens

    def read(self, n: Node, i: int, key_share: float) -> tuple[float, float, float]:
        """(bytes, weight bytes, kv bytes) that node `n` reads through its input `i`."""
        ref = n.inputs[i]
        fused = self.flash and self._attends(n.name)
        if fused:
            ref = self.region.source(self.g, ref)
        src, t = self.g[ref.node], self.g.type_of(ref)
        numel = t.numel(self.b)
        if OPS[src.op].view and len(src.inputs) == 1 and self.g[src.inputs[0].node].op == "param":
            src = self.g[src.inputs[0].node]  # a view of a weight (its rows regrouped) reads it
        if src.op == "param":
            if OPS[n.op].category == MOVEMENT:  # a gather: only the rows the output holds
                numel = n.out.numel(self.b)
            elif src.attrs.get("stacked") == "expert":
                numel *= self._experts_touched(n, t)
            b = param_bytes(src, self.b, numel)
            return b, b, 0.0
        if fused and i in self._key_inputs(n):
            numel *= key_share  # a fused kernel skips keys no query may see
        b = nbytes(t.dtype, numel)
        return b, 0.0, b if ref.node in self.kv_tensors else 0.0

    def _key_inputs(self, n: Node) -> set[int]:
        """Inputs of a core-attention node that run along the key axis (K of Q K^T, V of P V)."""
        ins, outs = position_letters(self.g, n)
        if n.name in self.pairs:
            col = outs[0][1]
            return {i for i, x in enumerate(ins) if x == [col]}
        out = set(outs[0])
        return {i for i, x in enumerate(ins) if len(x) == 1 and x[0] not in out}

    def cost(self, n: Node) -> OpCost:
        spec = OPS[n.op]
        if spec.category == SOURCE:
            return ZERO
        key: tuple = (n.op, tuple(self.g.input_types(n)), n.outputs, repr(n.attrs.get("axes")))
        if spec.flops_attrs_fn is not None:  # its count reads attrs the types do not carry
            key += (n.name,)
        flops = self._flops_memo.get(key)
        if flops is None:  # the same op on the same types recurs in every layer
            flops = self._flops_memo[key] = node_flops(self.g, n)
        matmul, other = flops
        pairs, keys = 1, 1.0
        if self._attends(n.name):
            pairs, keys = self._allowed(n)
        causal = matmul * pairs
        if self.training:
            matmul, causal, other = 3 * matmul, 3 * causal, 2 * other
        matmul, causal, other = whole(matmul), whole(causal), whole(other)
        flops = matmul + other
        # prefill: present K/V enter the cache where they are produced (a view included)
        cache = 0.0
        if n.name in self.cache_writes:
            cache = cache_bytes(self.g, n.out)
        if spec.view or n.name in self.fused:
            return OpCost(flops, matmul, causal, 0.0, cache, 0.0, cache)
        rd = wt = kv = 0.0
        for i, ref in enumerate(n.inputs):
            if i in spec.in_place or (self.flash and ref.node in self.pairs):
                continue  # appended to where it lies / a pair tensor kept on chip
            b, w, k = self.read(n, i, keys)
            rd, wt, kv = rd + b, wt + w, kv + k
        wr = 0.0
        if not (self.flash and n.name in self.pairs):
            for t in n.outputs:
                numel = t.numel(self.b)
                numel -= sum(self.g.type_of(n.inputs[i]).numel(self.b) for i in spec.in_place)
                wr += nbytes(t.dtype, numel)
            if n.name in self.kv_tensors:
                kv += wr
        return OpCost(flops, matmul, causal, rd, wr + cache, wt, kv + cache)


def whole(x: Any) -> Any:
    """An exact count as an int where it is whole; a Fraction only where it is an expectation
    (one rank's share of balanced routing's B*T*k/E slots)."""
    if type(x) is int:  # most counts: Fraction's isinstance goes through its ABC's check
        return x
    return int(x) if isinstance(x, Fraction) and x.denominator == 1 else x


def _whole_values(d: dict[str, Any]) -> dict[str, Any]:
    return {k: whole(v) for k, v in d.items()}


def scopes_of(graph: Graph, name: str) -> list[tuple[str, str]]:
    """(prefix, kind) of every declared scope that contains node `name`."""
    cache = _names_cache(graph)[0]
    hit = cache.get(name)
    if hit is None:
        scopes = graph.meta.get("scopes", {})
        parts = name.split(".")
        hit = []
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            kind = scopes.get(prefix)
            if kind is not None:
                hit.append((prefix, kind))
        cache[name] = hit
    return hit


# name -> its scopes, per distinct scopes table: a name's scopes depend on the table alone, and
# plan's hundreds of rank programs (and a graph after each change) share one table's names
_Names = tuple[dict[str, list[tuple[str, str]]], dict[str, str]]  # scopes_of's, layer_of's
_BY_TABLE: dict[tuple, _Names] = {}
_TABLES_KEPT = 8


def _names_cache(graph: Graph) -> _Names:
    """The caches of names of the graph's scopes table, found again while the graph is as it
    was (its version)."""
    cached = graph.meta.get("_scopes_of")
    if cached is not None and cached[0] == graph.version:
        return cached[1]
    table = tuple(graph.meta.get("scopes", {}).items())
    caches = _BY_TABLE.get(table)
    if caches is None:
        if len(_BY_TABLE) >= _TABLES_KEPT:  # the oldest goes: a process may build many models
            del _BY_TABLE[next(iter(_BY_TABLE))]
        caches = _BY_TABLE[table] = ({}, {})
    graph.meta["_scopes_of"] = (graph.version, caches)
    return caches


def layer_of(graph: Graph, name: str) -> str:
    """The layer scope holding node `name`; '' outside every layer (embedding, final norm, LM
    head)."""
    cache = _names_cache(graph)[1]
    hit = cache.get(name)
    if hit is None:
        hit = cache[name] = next((p for p, k in scopes_of(graph, name) if k == LAYER), "")
    return hit


def layer_scopes(graph: Graph) -> list[str]:
    """The layer scopes, in order."""
    return [p for p, k in graph.meta.get("scopes", {}).items() if k == LAYER]


def layer_slots(graph: Graph) -> dict[str, int]:
    """Where each node that is not a source runs among the layers: slot i + 1 in layer i (of
    `layer_scopes`), 0 before the first layer's nodes (the embedding), len(layers) + 1 after
    (final norm, LM head)."""
    index = {p: i + 1 for i, p in enumerate(layer_scopes(graph))}
    after = len(index) + 1
    out: dict[str, int] = {}
    seen_layer = False
    for n in graph.nodes():
        if OPS[n.op].category == SOURCE:
            continue
        lay = layer_of(graph, n.name)
        seen_layer |= bool(lay)
        out[n.name] = index[lay] if lay else after if seen_layer else 0
    return out


@register("cost", requires=("verify",), options=("attention", "training"), writes=("cost",))
def cost_pass(
    graph: Graph,
    results: dict[str, Any] | None = None,
    attention: str = "flash",
    training: bool = False,
) -> CostReport:
    """Cost every node (into node.meta['cost']) and roll the totals up."""
    cost_nodes(graph, attention, training)
    costs = ((n.name, n.op, n.meta["cost"]) for n in graph.nodes())
    return roll_up(costs, lambda name: scopes_of(graph, name), attention, training)


def cost_nodes(graph: Graph, attention: str = "flash", training: bool = False) -> None:
    """Cost every node into node.meta['cost'], without the totals: for a caller that reads
    the nodes' costs alone (plan, on hundreds of rank programs)."""
    c = _Costing(graph, attention, training)
    for n in graph.nodes():
        n.meta["cost"] = c.cost(n)


def roll_up(
    costs: Iterable[tuple[str, str, OpCost]],
    scopes: Callable[[str], list[tuple[str, str]]],
    attention: str,
    training: bool,
) -> CostReport:
    """The cost report of (node name, op, cost) in graph order; `scopes`: a name's scopes."""
    tally = CostTally()
    for name, op, oc in costs:
        tally.add(op, oc, scopes(name))
    return tally.report(attention, training)


@dataclass
class CostTally:
    """The sums a cost report is made of, over a run of ops. Counts are exact; each float sum is
    kept as its addends and added by math.fsum, correctly rounded, so that it does not depend
    on their order: one layer's tally stands for every layer of its kind (report/reuse.py)
    and its report is the full graph's to the last bit."""

    counts: list[Any] = field(default_factory=lambda: [0, 0, 0])  # flops, matmul, causal
    floats: list[list[float]] = field(default_factory=lambda: [[], [], [], []])  # r, w, wt, kv
    by_op: dict[str, Any] = field(default_factory=dict)
    by_scope: dict[str, Any] = field(default_factory=dict)
    bytes_by_scope: dict[str, list[float]] = field(default_factory=dict)
    layers: dict[str, tuple[list[Any], list[float]]] = field(default_factory=dict)
    # by the scopes' list (a module's ops share one): its layers and other kinds, the list
    # held beside them so that its id is not reused while the tally lives
    _split: dict[int, tuple[list, list[str], tuple[str, ...]]] = field(default_factory=dict)

    def add(self, op: str, oc: OpCost, sc: list[tuple[str, str]]) -> None:
        if oc is ZERO:
            return
        c, f = self.counts, self.floats
        c[0] += oc.flops
        c[1] += oc.matmul
        c[2] += oc.matmul_causal
        f[0].append(oc.bytes_read)
        f[1].append(oc.bytes_written)
        f[2].append(oc.weight_bytes)
        f[3].append(oc.kv_bytes)
        self.by_op[op] = self.by_op.get(op, 0) + oc.flops
        hit = self._split.get(id(sc))
        if hit is None:
            lays = [prefix for prefix, kind in sc if kind == LAYER]
            hit = self._split[id(sc)] = (sc, lays, tuple({k for _, k in sc if k != LAYER}))
        moved = oc.bytes
        for prefix in hit[1]:
            lay = self.layers.get(prefix)
            if lay is None:
                lay = self.layers[prefix] = ([0], [])
            lay[0][0] += oc.flops
            lay[1].append(moved)
        for kind in hit[2]:
            self.by_scope[kind] = self.by_scope.get(kind, 0) + oc.flops
            self.bytes_by_scope.setdefault(kind, []).append(moved)

    def extend(self, other: CostTally, layer: Callable[[str], str] | None = None) -> None:
        """Add `other`'s ops after this tally's, its layer scopes renamed by `layer`."""
        for i in range(3):
            self.counts[i] += other.counts[i]
        for mine, theirs in zip(self.floats, other.floats, strict=True):
            mine.extend(theirs)
        for op, x in other.by_op.items():
            self.by_op[op] = self.by_op.get(op, 0) + x
        for kind, x in other.by_scope.items():
            self.by_scope[kind] = self.by_scope.get(kind, 0) + x
            self.bytes_by_scope.setdefault(kind, []).extend(other.bytes_by_scope[kind])
        for prefix, (flops, moved) in other.layers.items():
            name = layer(prefix) if layer is not None else prefix
            lay = self.layers.get(name)
            if lay is None:
                lay = self.layers[name] = ([0], [])
            lay[0][0] += flops[0]
            lay[1].extend(moved)

    def report(self, attention: str, training: bool) -> CostReport:
        read, written, weights, kv = (math.fsum(x) for x in self.floats)
        total_bytes = read + written
        flops = {
            "total": whole(self.counts[0]),
            "matmul": whole(self.counts[1]),
            "matmul_causal": whole(self.counts[2]),
            "by_scope": _whole_values(
                {k: self.by_scope[k] for k in SCOPE_KINDS if k in self.by_scope}
            ),
            "by_op": _whole_values(dict(sorted(self.by_op.items(), key=lambda kv: -kv[1]))),
        }
        by_scope = self.bytes_by_scope
        nbytes = {
            "total": total_bytes,
            "weights": weights,
            "kv_cache": kv,
            "activations": total_bytes - weights - kv,
            "by_scope": {k: math.fsum(by_scope[k]) for k in SCOPE_KINDS if k in by_scope},
            "pass": "forward",  # also under training (the roofline scales them, see above)
        }
        per_layer = [
            {"layer": i, **_whole_values({"flops": f[0], "bytes": math.fsum(b)})}
            for i, (f, b) in enumerate(self.layers.values())
        ]
        return CostReport(attention, training, flops, nbytes, per_layer)
