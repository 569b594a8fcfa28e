"""Core attention as a fused kernel sees it, found from tensor roles rather than op names.

The region is every node whose output pairs two position axes (the T x S scores, their scale,
mask and softmax) plus the nodes that consume such a tensor (P V). A fused (flash) kernel keeps
the pair tensors on chip and reads its inputs straight from their sources, so the movement copies
that only feed it (the GQA head repeat) or only rearrange its output (the head merge) are never
materialised either.
"""

from __future__ import annotations

from dataclasses import dataclass

from graphllm.ir import TOKEN_ROLES, Graph, Ref, TensorType
from graphllm.ops import MOVEMENT, OPS


def position_axes(t: TensorType) -> int:
    return sum(d.role in TOKEN_ROLES for d in t.dims)


@dataclass(frozen=True)
class Region:
    pairs: frozenset[str]  # nodes producing (query, key) pair tensors
    consumers: frozenset[str]  # nodes reading them (and producing something else)
    copies: frozenset[str]  # movement copies a fused kernel does not materialise

    def attends(self, name: str) -> bool:
        return name in self.pairs or name in self.consumers

    def source(self, graph: Graph, ref: Ref) -> Ref:
        """The tensor a fused kernel really reads: before any of the copies."""
        while ref.node in self.copies:
            ref = graph[ref.node].inputs[0]
        return ref


def core_attention_region(graph: Graph) -> Region:
    """The region of `graph` (cached on the graph until it changes)."""
    cached = graph.meta.get("_attention_region")
    if cached is not None and cached[0] == graph.version:
        return cached[1]
    region = _find(graph)
    graph.meta["_attention_region"] = (graph.version, region)
    return region


def _find(graph: Graph) -> Region:
    pairs = {n.name for n in graph.nodes() if position_axes(n.out) >= 2}
    consumers = {
        n.name
        for n in graph.nodes()
        if n.name not in pairs and any(r.node in pairs for r in n.inputs)
    }
    b = graph.bindings
    copies = set()
    for n in graph.nodes():
        spec = OPS[n.op]
        if spec.category != MOVEMENT or spec.view or len(n.inputs) != 1:
            continue
        users = graph.users(n)
        expands = n.out.numel(b) > graph.type_of(n.inputs[0]).numel(b)
        feeds = bool(users) and all(u.name in pairs or u.name in consumers for u in users)
        if (expands and feeds) or n.inputs[0].node in consumers:
            copies.add(n.name)
    return Region(frozenset(pairs), frozenset(consumers), frozenset(copies))
