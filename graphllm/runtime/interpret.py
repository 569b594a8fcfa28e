"""Run any Graph with numpy, op by op, from the op table's reference implementations.

The ground truth that exported and partitioned graphs are checked against. Computes in fp32
whatever the workload's storage dtypes are.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from graphllm.errors import GraphError, GraphllmError
from graphllm.ir import STATE, Graph, Node
from graphllm.ir.opspec import needs_positions, position_origins
from graphllm.ops import OPS
from graphllm.runtime.budget import require_interpreted


class Interpreter:
    """A loop over nodes in topological order that dispatches on the op (cf. torch.fx)."""

    def __init__(self, graph: Graph, weights: dict[str, np.ndarray]) -> None:
        self.graph = graph
        self.weights = weights

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute with graph inputs `feeds` (by input name); returns every graph output."""
        env: dict[str, Any] = {}
        for node in self.graph.nodes():
            env[node.name] = self.run_node(node, env, feeds)
        out = {}
        for name, ref in self.graph.outputs.items():
            val = env[ref.node]
            out[name] = val[ref.index] if isinstance(val, tuple) else val
        return out

    def run_node(self, node: Node, env: dict[str, Any], feeds: dict[str, np.ndarray]) -> Any:
        if node.op == "param":
            if node.name not in self.weights:
                raise GraphllmError(f"no weight given for {node.name}")
            return self.weights[node.name]
        if node.op == "input":
            if node.name not in feeds:
                raise GraphllmError(f"graph input {node.name} was not fed")
            return feeds[node.name]
        args = []
        for r in node.inputs:
            v = env[r.node]
            args.append(v[r.index] if isinstance(v, tuple) else v)
        attrs = node.attrs
        if needs_positions(OPS[node.op]):
            # a chunk, or a query's temperature, is a function of absolute positions, which an
            # axis's indices give only after its origin (a rolled cache starts at P - P_w)
            attrs = {**attrs, "origin": position_origins(self.graph, node)}
        try:
            return OPS[node.op].impl(args, attrs)  # type: ignore[misc]
        except Exception as e:
            shapes = ", ".join(str(getattr(a, "shape", "?")) for a in args)
            raise GraphError(f"{node.name} ({node.op}) failed on inputs {shapes}: {e}") from e


def default_feeds(
    graph: Graph, input_ids: np.ndarray, past: dict[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Feeds for token ids (B, T): positions continue after the graph's P past tokens; each past
    K/V is cut to the positions its layer's cache holds (the last W-1 for a window layer)."""
    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim == 1:
        ids = ids[None]
    b, t = ids.shape
    p = int(graph.bindings.get("P", 0)) if past else 0
    feeds = {"input_ids": ids, "position_ids": np.broadcast_to(np.arange(p, p + t), (b, t)).copy()}
    if "attention_mask" in graph:  # a recurrence zeroes padded positions; none here
        feeds["attention_mask"] = np.ones((b, p + t), np.int64)
    for k, v in (past or {}).items():
        name = k.replace("present.", "past_key_values.")
        if name not in graph:
            continue
        if graph.output_role(name.replace("past_key_values.", "present.", 1)) == STATE:
            feeds[name] = v  # a state replaces the past whole: fixed in size
            continue
        held = graph[name].out.dims[2]
        n = int(graph.bindings.get(held.name, v.shape[2]))
        feeds[name] = v[:, :, v.shape[2] - n :]
    return feeds


def run_graph(
    graph: Graph,
    weights: dict[str, np.ndarray],
    input_ids: np.ndarray,
    past: dict[str, np.ndarray] | None = None,
    extra: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Logits (B, T, vocab) and present K/V for token ids, optionally after a cached past;
    `extra` feeds other inputs by name (DeepSeek's `mtp.{k}.input_ids`)."""
    require_interpreted(graph, f"a numpy run of {graph.name}")
    feeds = default_feeds(graph, input_ids, past) | (extra or {})
    return Interpreter(graph, weights).run(feeds)
