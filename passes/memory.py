"""The `memory` pass: bytes held on the device for weights, the KV cache and activations.

- weights: every stored tensor at its dtype (int4 with its group scales), or in the format its
  checkpoint's quantization_config stores it in (passes/stored.py); `active` is what one
  token touches (k of E routed experts).
- kv_cache: the present K/V of every layer at the KV dtype: B x (P + T) positions for a full
  attention layer, fewer for one that keeps a window; `kv_cache_full` is what the same cache
  would hold with full attention on every layer (their difference: what the windows save).
  `kv_cache_kept` is what stays held for the next step: a window (chunk) layer keeps its last
  W - 1 (C - 1) positions, as transformers' cache does, where a prefill attended over all T.
- activations: the peak of a liveness walk over the graph in its topological order: a tensor is
  held from the op that writes it until its last reader runs; views share their source's memory;
  with fused (flash) attention the (query, key) score tensors are never held.
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from graphllm.ir import TOKEN_ROLES, Graph, Node, TensorType
from graphllm.models.workload import nbytes
from graphllm.ops import OPS, SOURCE
from graphllm.passes.attention_region import core_attention_region
from graphllm.passes.registry import register
from graphllm.passes.stored import param_bytes


@dataclass(frozen=True)
class MemoryReport:
    weights: float
    weights_active: float
    weights_by_dtype: dict[str, float]
    kv_cache: float
    activations: float  # peak live activation bytes
    peak_at: str  # the node during which the peak occurs
    kv_cache_full: float = 0.0  # the cache with every layer holding all P + T positions
    kv_cache_kept: float = 0.0  # what the next step reads back: windows keep W - 1 positions
    # the conv and recurrent states of linear-attention / Mamba layers, constant in
    # the sequence length (kv_cache_full prices those layers as full attention too)
    state: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.kv_cache + self.state + self.activations

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"total": self.total}


@register("memory", requires=("verify",), options=("attention",))
def memory_pass(
    graph: Graph, results: dict[str, Any] | None = None, attention: str = "flash"
) -> MemoryReport:
    b = graph.bindings
    cfg = graph.meta.get("config")
    weights = active = 0.0
    by_dtype: dict[str, float] = {}
    for n in graph.params():
        nb = param_bytes(n, b)
        weights += nb
        by_dtype[n.out.dtype] = by_dtype.get(n.out.dtype, 0.0) + nb
        experts = n.attrs.get("stacked") == "expert"  # routed experts, one slice each
        active += nb * cfg.num_experts_per_tok / cfg.num_experts if experts and cfg else nb
    presents = set(graph.cache_outputs().values())
    kv = sum(cache_bytes(graph, graph.type_of(r)) for r in presents)
    full = sum(_full_attention_bytes(graph, graph.type_of(r)) for r in presents)
    kept = sum(_kept_bytes(graph, name, r) for name, r in graph.cache_outputs().items())
    peak, at = peak_activations(graph, attention)
    states = graph.state_outputs().values()
    state = sum(nbytes(graph.type_of(r).dtype, graph.type_of(r).numel(b)) for r in states)
    full += _stateful_as_attention(graph)
    return MemoryReport(weights, active, by_dtype, kv, peak, at, full, kept, state)


def _stateful_as_attention(graph: Graph, count: int | None = None) -> float:
    """What the layers that carry state instead of keys and values (graph.meta['state_layers'],
    or `count` of them) would cache as full attention layers of the model's own K/V shape over
    all S positions."""
    cfg, b = graph.meta.get("config"), graph.bindings
    layers = len(graph.meta.get("state_layers", ())) if count is None else count
    if not layers or cfg is None:
        return 0.0
    per_layer = 2 * b["B"] * b["S"] * cfg.num_key_value_heads * cfg.head_dim
    return layers * nbytes(graph.meta.get("kv_dtype") or "fp32", per_layer)


def _kept_bytes(graph: Graph, name: str, ref: Any) -> float:
    """`cache_bytes` of the cache output `name` cut to the positions the next step reads back
    (graph.meta['cache_keeps']: a window or chunk layer's span - 1)."""
    t = graph.type_of(ref)
    n = cache_bytes(graph, t)
    keep = graph.meta.get("cache_keeps", {}).get(name)
    if keep is None:
        return n
    for d in t.dims:
        if d.role in TOKEN_ROLES:  # a prefill's present is indexed by the new tokens
            start, stop = d.position_range(graph.bindings)
            if stop - start > keep:
                n *= keep / (stop - start)
    return n


def _full_attention_bytes(graph: Graph, t: TensorType) -> float:
    """`cache_bytes` of `t` were its attended-position axis over all S = P + T positions: a
    window's axis covers fewer; a shard of an axis keeps the whole axis's range, so a shard of
    a full layer's cache scales by 1."""
    b = graph.bindings
    n = cache_bytes(graph, t)
    for d in t.dims:
        if d.role == "key_token":
            start, stop = d.position_range(b)
            n *= b["S"] / (stop - start) if stop > start else 1.0
    return n


def cache_bytes(graph: Graph, t: TensorType) -> float:
    """Bytes of a KV cache tensor `t`, at the cache's own dtype (the workload's kv_dtype)."""
    return nbytes(graph.meta.get("kv_dtype") or t.dtype, t.numel(graph.bindings))


def peak_activations(
    graph: Graph, attention: str, within: Graph | None = None
) -> tuple[float, str]:
    """Peak live activation bytes of `within` (a part of `graph`; default the whole), and where:
    not the KV cache (counted as the cache) nor, under flash attention, what the fused kernel
    keeps on chip."""
    held = {r.node for r in graph.carried_outputs().values()}
    if attention == "flash":
        region = core_attention_region(graph)
        held |= region.pairs | region.copies
    return _peak_activations(graph if within is None else within, held)


def _peak_activations(graph: Graph, skip: set[str]) -> tuple[float, str]:
    """Largest sum of live activation bytes while walking the nodes in order."""
    order = [(n.name, n, [r.node for r in n.inputs]) for n in graph.topo()]
    return walk_peak(order, skip, graph.bindings, [r.node for r in graph.outputs.values()])


def walk_peak(
    order: list[tuple[str, Node, list[str]]],
    skip: Container[str],
    bindings: dict[str, int],
    outputs: Iterable[str],
) -> tuple[float, str]:
    """`_peak_activations` over (name, node, the names of its inputs) in topological order: a
    node may stand for the same node of another layer (report/reuse.py). Sizes are whole
    bytes (or eighths of one), so the running sums are exact in any order."""
    root: dict[str, str] = {}  # a view's memory belongs to its source
    born_at: dict[str, int] = {}
    last_use: dict[str, int] = {}
    born = [0.0] * (len(order) + 1)
    sizes: dict[int, float] = {}  # by node: one node may stand for many
    kinds: dict[str, int] = {}  # by op: 0 holds no memory, 1 a view, 2 its own
    for i, (name, n, inputs) in enumerate(order):
        for r in inputs:
            last_use[root.get(r, r)] = i
        kind = kinds.get(n.op)
        if kind is None:
            spec = OPS[n.op]
            kind = kinds[n.op] = (
                0 if spec.category == SOURCE or spec.in_place else (1 if spec.view else 2)
            )
        if kind == 0 or name in skip:
            continue
        if kind == 1 and inputs:
            root[name] = root.get(inputs[0], inputs[0])
            continue
        nb = sizes.get(id(n))
        if nb is None:
            nb = sizes[id(n)] = sum(nbytes(t.dtype, t.numel(bindings)) for t in n.outputs)
        born[i] = nb
        born_at[name] = last_use[name] = i  # written and never read: freed at once
    for out in outputs:
        last_use[root.get(out, out)] = len(order)
    freed = [0.0] * (len(order) + 1)
    for name, i in last_use.items():
        j = born_at.get(name)
        if j is not None:
            freed[i] += born[j]
    if not order:
        return 0.0, ""
    # live after each node's output is made, before what it last read is freed
    live = np.cumsum(np.asarray(born[:-1]) - np.concatenate(([0.0], freed[:-2])))
    at = int(np.argmax(live))
    if live[at] <= 0:
        return 0.0, ""
    return float(live[at]), order[at][0]
