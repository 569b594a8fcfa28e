"""The `trace` document: one JSON-ready dict per run, with a stable schema that later passes extend."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from graphllm.builder import build_graph
from graphllm.ir import Graph
from graphllm.model_config import ModelConfig
from graphllm.passes import run
from graphllm.workload import Workload


def trace_report(config: ModelConfig, workload: Workload) -> tuple[dict[str, Any], Graph]:
    """Build and verify the graph, run the analyses; returns the document and the graph."""
    graph = build_graph(config, workload)
    results = run(graph, ["verify", "params", "tokens"])
    cfg = asdict(config)
    doc = {
        "model": {"name": config.name, "model_type": config.model_type, "config": cfg},
        "workload": workload.to_dict(),
        "graph": {
            "nodes": len(graph),
            "edges": graph.num_edges(),
            "ops": dict(Counter(n.op for n in graph.nodes())),
            "inputs": [n.name for n in graph.nodes("input")],
            "outputs": list(graph.outputs),
        },
        "params": results["params"].to_dict(),
        "token_mixing": results["tokens"].to_dict(),
    }
    return doc, graph
