"""Run a partitioned graph in numpy, rank by rank, with the collectives carried out across ranks.

Every rank of the mesh (microbatches included) gets its block of each weight and graph input, cut
as the node's sharding says; nodes run in topological order on the ranks of their pipeline stage;
a collective's impl takes the input of every rank of its group at once. The graph outputs are
assembled from the ranks' blocks, so they compare directly with the unpartitioned graph's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from graphllm.build.weights import random_weights
from graphllm.errors import GraphError, GraphllmError
from graphllm.ir import Graph, Node
from graphllm.ir.opspec import needs_positions, position_origins
from graphllm.ops import OPS, bind_node
from graphllm.passes.parallel.sharding import Mesh, Sharding, block_index, operand_letters
from graphllm.passes.registry import meta_result
from graphllm.runtime.budget import require_interpreted
from graphllm.runtime.interpret import Interpreter

Coords = tuple[int, ...]


def shard(full: np.ndarray, sh: Sharding, mesh: Mesh, c: dict[str, int]) -> np.ndarray:
    """Rank `c`'s block of a whole tensor (zeros where another rank holds a partial value)."""
    idx = []
    for i, splits in enumerate(sh.axes):
        blocks = sh.blocks(i)
        if full.shape[i] % blocks:
            raise GraphError(f"axis {i} of size {full.shape[i]} does not split in {blocks} blocks")
        size = full.shape[i] // blocks
        k = block_index(splits, mesh, c)
        idx.append(slice(k * size, (k + 1) * size))
    out = full[tuple(idx)]
    if any(c[m] != 0 for m in sh.partial):
        return np.zeros_like(out)
    return out


def assemble(
    parts: dict[Coords, np.ndarray], sh: Sharding, mesh: Mesh, coords: dict[Coords, dict]
) -> np.ndarray:
    """The whole tensor from the ranks' blocks."""
    first = next(iter(parts.values()))
    shape = [s * sh.blocks(i) for i, s in enumerate(first.shape)]
    out = np.zeros(shape, dtype=first.dtype)
    for r, x in parts.items():
        c = coords[r]
        idx = tuple(
            slice(
                block_index(sp, mesh, c) * x.shape[i], (block_index(sp, mesh, c) + 1) * x.shape[i]
            )
            for i, sp in enumerate(sh.axes)
        )
        out[idx] = x
    return out


class SPMDInterpreter:
    """Executes the one-rank program of a partitioned graph on every rank of its mesh."""

    def __init__(self, graph: Graph, weights: dict[str, np.ndarray]) -> None:
        self.graph = graph
        self.weights = weights
        self.mesh: Mesh = meta_result(graph, "partition").mesh
        self.ranks = [tuple(c.values()) for c in self.mesh.coords()] or [()]
        self.coords = {r: dict(zip(self.mesh.names, r)) for r in self.ranks}
        self._letters: dict[str, dict[str, tuple[int, int]]] = {}

    def _on(self, node: Node) -> list[Coords]:
        """The ranks that run `node`: those of its pipeline stage (sources: every stage reading it)."""
        if "pp" not in self.mesh.names:
            return self.ranks
        stages = meta_result(node, "stages")
        return [r for r in self.ranks if self.coords[r]["pp"] in stages]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute on whole graph inputs `feeds`; returns every graph output, whole."""
        env: dict[Coords, dict[str, Any]] = {r: {} for r in self.ranks}
        for node in self.graph.nodes():
            ranks = self._on(node)
            try:
                self._run_node(node, ranks, env, feeds)
            except GraphllmError:
                raise
            except Exception as e:
                raise GraphError(f"{node.name} ({node.op}) failed: {e}") from e
        out = {}
        for name, ref in self.graph.outputs.items():
            node = self.graph[ref.node]
            parts = {}
            for r in self._on(node):
                v = env[r][ref.node]
                parts[r] = v[ref.index] if isinstance(v, tuple) else v
            out[name] = assemble(parts, node.meta["sharding"][ref.index], self.mesh, self.coords)
        return out

    def _run_node(
        self, node: Node, ranks: list[Coords], env: dict[Coords, dict], feeds: dict
    ) -> None:
        spec = OPS[node.op]
        if node.op in ("param", "input"):
            src = self.weights if node.op == "param" else feeds
            if node.name not in src:
                what = "no weight given for" if node.op == "param" else "graph input not fed:"
                raise GraphllmError(f"{what} {node.name}")
            value = src[node.name]
            if "rows" in node.attrs:  # a weight loaded with its rows regrouped (a seeded view)
                value = value[np.asarray(node.attrs["rows"])]
            for r in ranks:
                env[r][node.name] = shard(
                    value, node.meta["sharding"][0], self.mesh, self.coords[r]
                )
            return
        if spec.collective:
            m = node.attrs["mesh"]
            k = self.mesh.names.index(m)
            done: set[Coords] = set()
            for r in ranks:
                if r in done:
                    continue
                group = [r[:k] + (j,) + r[k + 1 :] for j in range(self.mesh.size(m))]
                xs = [self._arg(env[g], node.inputs[0]) for g in group]
                for g, y in zip(group, spec.impl(xs, node.attrs)):  # type: ignore[misc]
                    if g in ranks:
                        env[g][node.name] = y
                        done.add(g)
            return
        letters = self._letter_axes(node)
        for r in ranks:
            args = [self._arg(env[r], ref) for ref in node.inputs]
            attrs = node.attrs
            if letters:
                attrs = {**attrs, "shard": self._offsets(node, letters, args, self.coords[r])}
            if needs_positions(spec):  # the whole axis's origin; `shard` says where a block is
                attrs = {**attrs, "origin": position_origins(self.graph, node)}
            env[r][node.name] = spec.impl(args, attrs)  # type: ignore[misc]

    @staticmethod
    def _arg(env: dict[str, Any], ref: Any) -> Any:
        v = env.get(ref.node)
        return v[ref.index] if isinstance(v, tuple) else v

    def _letter_axes(self, node: Node) -> dict[str, tuple[int, int]]:
        hit = self._letters.get(node.name)
        if hit is None:
            hit = self._letters[node.name] = letter_axes(self.graph, node)
        return hit

    def _offsets(
        self, node: Node, letters: dict, args: list[np.ndarray], c: dict[str, int]
    ) -> dict[str, tuple[int, int]]:
        shapes = [a.shape for a in args]
        return shard_offsets(self.graph, node, letters, shapes, self.mesh, c)


def letter_axes(graph: Graph, node: Node) -> dict[str, tuple[int, int]]:
    """Letter -> (input, axis) for every split axis of the node's inputs."""
    hit: dict[str, tuple[int, int]] = {}
    sig = OPS[node.op].signature
    bind_node(graph, node)  # the signature fits
    for i, (op, r) in enumerate(zip(sig.inputs, node.inputs)):
        sh = graph[r.node].meta["sharding"][r.index]
        for j, x in enumerate(operand_letters(op, len(sh.axes))):
            if sh.axes[j] and x not in hit:
                hit[x] = (i, j)
    return hit


def shard_offsets(
    graph: Graph,
    node: Node,
    letters: dict[str, tuple[int, int]],
    shapes: list[tuple[int, ...]],
    mesh: Mesh,
    c: dict[str, int],
) -> dict[str, tuple[int, int]]:
    """For each split letter: (first index rank `c` holds, the whole axis's size), from the
    local `shapes` of the node's inputs (runtime/dist bakes them into a rank's segments)."""
    out = {}
    for x, (i, j) in letters.items():
        r = node.inputs[i]
        sh = graph[r.node].meta["sharding"][r.index]
        size = int(shapes[i][j])
        out[x] = (block_index(sh.axes[j], mesh, c) * size, size * sh.blocks(j))
    return out


@dataclass(frozen=True)
class PartitionCheck:
    """Logits of the partitioned run beside the single-device run's."""

    reference: np.ndarray
    partitioned: np.ndarray
    ranks: int
    others: dict[str, float]  # largest difference of every other output (present K/V)

    @property
    def max_diff(self) -> float:
        return float(np.max(np.abs(self.reference - self.partitioned)))

    def agrees(self, tol: float = 1e-5) -> bool:
        return self.max_diff <= tol

    def differences(self, count: int = 10) -> list[tuple[tuple[int, ...], float, float]]:
        """The largest differences: (index, reference, partitioned)."""
        d = np.abs(self.reference - self.partitioned).ravel()
        top = np.argsort(-d, kind="stable")[:count]
        return [
            (
                tuple(int(x) for x in np.unravel_index(k, self.reference.shape)),
                float(self.reference.ravel()[k]),
                float(self.partitioned.ravel()[k]),
            )
            for k in top
        ]


def check_partition(graph: Graph, partitioned: Graph, seed: int = 0) -> PartitionCheck:
    """Run both graphs on the same random weights, token ids and past K/V; compare outputs."""

    # the single-device run, and every rank's (a replicated tensor is held once per rank)
    devices = meta_result(partitioned, "partition").mesh.devices
    b, t = graph.bindings["B"], graph.bindings["T"]
    require_interpreted(graph, f"verify partition at B={b:,} T={t:,}", runs=1 + devices)
    rng = np.random.default_rng(seed)
    weights = random_weights(graph, seed=seed)
    b, t = int(graph.bindings["B"]), int(graph.bindings["T"])
    p = int(graph.bindings.get("P", 0))
    table = graph.type_of(next(graph.nodes("embedding")).inputs[1])
    vocab = int(table.dims[0].size)  # type: ignore[arg-type]
    feeds: dict[str, np.ndarray] = {
        "input_ids": rng.integers(0, vocab, size=(b, t)),
        "position_ids": np.broadcast_to(np.arange(p, p + t), (b, t)).copy(),
    }
    if "attention_mask" in graph:  # a recurrence zeroes padded positions; none here
        feeds["attention_mask"] = np.ones((b, p + t), np.int64)
    for n in graph.nodes("input"):
        if n.name not in feeds:  # past K/V: random values of the cache's shape
            shape = tuple(int(d.size or graph.bindings[d.name]) for d in n.out.dims)
            if n.out.dtype == "int64":  # more token ids (DeepSeek's MTP inputs)
                feeds[n.name] = rng.integers(0, vocab, size=shape)
            else:
                feeds[n.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    ref = Interpreter(graph, weights).run(feeds)
    out = SPMDInterpreter(partitioned, weights).run(feeds)
    others = {k: float(np.max(np.abs(ref[k] - out[k]))) for k in ref if k != "logits"}
    return PartitionCheck(ref["logits"], out["logits"], devices, others)
