"""The `verify` pass: every node consistent with its op spec (shapes, roles, order)."""

from __future__ import annotations

from typing import Any

from graphllm.ir import Graph
from graphllm.passes.registry import register


@register("verify")
def verify(graph: Graph, results: dict[str, Any]) -> dict[str, int]:
    graph.verify()
    return {"nodes": len(graph), "edges": graph.num_edges()}
