"""A rank's program cut into segments at its collective and send/recv nodes.

A segment is a run of local ops between two communication points: a standalone Graph whose
inputs are the values it reads from outside (graph inputs, and values an earlier segment or a
collective produced), whose params are the weights it reads (this rank's blocks) and whose
outputs are the values read after it. What makes the rank's program one rank's, rather than any
rank's, is baked into the copies of its nodes: `shard` (where this rank's block of each split axis
starts, and the whole axis's size) and `origin` (the first absolute position of each position
axis), exactly as the SPMD interpreter hands them to the op impls. So a runner needs nothing but
the segment's graph and the rank's weights: the numpy one below, or the onnxruntime one
(dist-ort) behind the same `SegmentRunner` protocol.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from graphllm.errors import GraphllmError
from graphllm.ir import Graph, Node, Ref
from graphllm.ir.opspec import needs_positions, position_origins
from graphllm.ops import COMMUNICATION, OPS, SOURCE
from graphllm.passes.parallel.sharding import Mesh
from graphllm.passes.registry import meta_result
from graphllm.runtime.dist.tensors import to_numpy, to_torch
from graphllm.runtime.interpret import Interpreter
from graphllm.runtime.spmd import letter_axes, shard_offsets


def value_name(ref: Ref) -> str:
    """The name of one output of a node at a segment boundary: the node's for its first output,
    `node:i` for output i."""
    return ref.node if ref.index == 0 else f"{ref.node}:{ref.index}"


def communicates(node: Node) -> bool:
    """Whether a node is a cut point: a collective (shard_slice included: it needs the rank's
    index on its mesh axis) or a point-to-point send/recv."""
    spec = OPS[node.op]
    return spec.collective or spec.category == COMMUNICATION


@dataclass(frozen=True)
class Segment:
    """Local ops of one rank between two cut points."""

    index: int
    nodes: tuple[str, ...]  # the rank program's compute nodes, topological order
    params: tuple[str, ...]  # weights read (the rank's blocks, by param name)
    inputs: tuple[str, ...]  # boundary values fed by name (graph inputs, earlier values)
    outputs: tuple[str, ...]  # values read after the segment (by later steps, or graph outputs)
    graph: Graph  # standalone: inputs as `input` nodes, params, the nodes with this rank's attrs
    # the same, on the rank's program (for an exporter that works on it, as dist-ort's does)
    program: Graph | None = None
    coords: dict[str, int] | None = None  # the rank's mesh coordinates, `mb` included
    in_refs: tuple[Ref, ...] = ()  # what `inputs` name, in the same order
    out_refs: tuple[Ref, ...] = ()  # what `outputs` name, in the same order


@dataclass(frozen=True)
class Cut:
    """A cut point of a rank's program: a node of the program that moves values between ranks."""

    node: str
    inputs: tuple[str, ...]  # value names it reads
    kept: bool = False  # a later step (or the program's outputs) reads its input too


Step = Segment | Cut


class SegmentRunner(Protocol):
    """Runs one segment: boundary values in, by `Segment.inputs` name; `Segment.outputs` out:
    numpy arrays (`run`, a one-rank run), or torch tensors on the rank's device (`run_device`,
    what a rank of a multi-rank run hands its segments and collectives)."""

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def run_device(self, feeds: dict[str, Any]) -> dict[str, Any]: ...


# segment, the rank's weights (param name -> this rank's block) -> a runner
RunnerFactory = Callable[[Segment, dict[str, np.ndarray]], SegmentRunner]


class NumpyRunner:
    """A segment on the numpy interpreter (the op table's reference impls)."""

    # it reads the segment's graph at each run, so it serves the next decode step too when the
    # rank moves that graph's P and S on in place (rank._rebind); a runner without this
    # attribute is made anew each step
    rebindable = True

    def __init__(self, segment: Segment, weights: dict[str, np.ndarray]) -> None:
        self.segment = segment
        self._interp = Interpreter(segment.graph, {k: weights[k] for k in segment.params})

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self._interp.run(feeds)

    def run_device(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """Tensors in and out, through host views (the interpreter computes in numpy)."""
        device = str(next(iter(feeds.values())).device) if feeds else "cpu"
        got = self.run({k: to_numpy(v) for k, v in feeds.items()})
        return {k: to_torch(v, device) for k, v in got.items()}


def on_rank(node: Node, coords: dict[str, int]) -> bool:
    """Whether the rank at `coords` runs (or holds) `node`: its pipeline stage does."""
    if "pp" not in coords:
        return True
    return coords["pp"] in meta_result(node, "stages")


def cut(program: Graph, coords: dict[str, int]) -> list[Step]:
    """The steps of the rank at `coords` (its mesh coordinates, `mb` included) in order:
    segments of local ops, and the cut points between them."""
    mesh: Mesh = meta_result(program, "partition").mesh
    mine = [n for n in program.nodes() if on_rank(n, coords)]
    groups: list[list[Node] | Node] = []
    run: list[Node] = []
    for n in mine:
        if OPS[n.op].category == SOURCE:
            continue
        if communicates(n):
            if run:
                groups.append(run)
                run = []
            groups.append(n)
        else:
            run.append(n)
    if run:
        groups.append(run)
    # which values each later step reads, for every segment's outputs
    later: list[set[str]] = [set() for _ in groups]
    wanted: set[str] = {value_name(r) for r in program.outputs.values()}
    for i in range(len(groups) - 1, -1, -1):
        later[i] = set(wanted)
        g = groups[i]
        for n in g if isinstance(g, list) else [g]:
            wanted |= {value_name(r) for r in n.inputs}
    steps: list[Step] = []
    for i, g in enumerate(groups):
        if isinstance(g, Node):
            reads = tuple(value_name(r) for r in g.inputs)
            steps.append(Cut(g.name, reads, bool(reads) and reads[0] in later[i]))
        else:
            steps.append(_segment(program, mesh, coords, len(steps), g, later[i]))
    return steps


def _segment(
    program: Graph, mesh: Mesh, coords: dict[str, int], index: int, nodes: list[Node], read: set
) -> Segment:
    inside = {n.name for n in nodes}
    sub = Graph(f"{program.name}.segment{index}", dict(program.bindings))
    sub.meta = {k: v for k, v in program.meta.items() if k in ("config", "workload")}
    params: list[str] = []
    inputs: list[str] = []
    in_refs: list[Ref] = []
    out_refs: list[Ref] = []
    refs: dict[Ref, Ref] = {}
    for n in nodes:
        for r in n.inputs:
            if r.node in inside or r in refs:
                continue
            src = program[r.node]
            if src.op == "param":
                sub.add("param", src.name, (), dict(src.attrs), src.outputs)
                params.append(src.name)
                refs[r] = r
            else:
                name = value_name(r)
                sub.input(name, program.type_of(r))
                inputs.append(name)
                in_refs.append(r)
                refs[r] = Ref(name)
    outputs: list[str] = []
    for n in nodes:
        attrs = dict(n.attrs)
        spec = OPS[n.op]
        letters = letter_axes(program, n)
        if letters:
            shapes = [program.type_of(r).shape(program.bindings) for r in n.inputs]
            attrs["shard"] = shard_offsets(program, n, letters, shapes, mesh, coords)
        if needs_positions(spec):
            attrs["origin"] = position_origins(program, n)
        sub.add(n.op, n.name, [refs.get(r, r) for r in n.inputs], attrs, n.outputs)
        for i in range(len(n.outputs)):
            name = value_name(Ref(n.name, i))
            if name in read:
                sub.set_output(name, Ref(n.name, i))
                outputs.append(name)
                out_refs.append(Ref(n.name, i))
    return Segment(
        index,
        tuple(n.name for n in nodes),
        tuple(params),
        tuple(inputs),
        tuple(outputs),
        sub,
        program,
        dict(coords),
        tuple(in_refs),
        tuple(out_refs),
    )


def default_runtime() -> str:
    """`--runtime auto`: onnxruntime once its segment runner is built in, else numpy."""
    return "onnxruntime" if importlib.util.find_spec(ORT_MODULE) is not None else "numpy"


ORT_MODULE = "graphllm.runtime.dist.ort"  # dist-ort's segment runner


def require_runner(name: str) -> RunnerFactory:
    """The segment runner of `--runtime name`."""
    if name == "numpy":
        return NumpyRunner
    if name == "onnxruntime":
        try:  # dist-ort's module; by name, so that a build without it still imports this one
            ort = importlib.import_module(ORT_MODULE)
        except ModuleNotFoundError as e:
            if e.name != ORT_MODULE:
                raise
            raise GraphllmError(
                "--runtime onnxruntime: the onnxruntime segment runner is not in this build "
                "yet; use --runtime numpy"
            ) from None
        return ort.OrtRunner
    raise GraphllmError(f"unknown runtime {name!r}; choose numpy or onnxruntime")
