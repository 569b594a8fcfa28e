"""Training memory of one rank: weights, gradients, optimizer state, saved activations, ZeRO.

Conventions (docs/partitioning.md, "Training memory"):
- Mixed-precision Adam as in ZeRO (Rajbhandari et al. 2020, sec. 3): weights and gradients in the
  weight dtype (2 + 2 bytes a parameter in bf16), the optimizer state in fp32: 4 bytes of master
  weights when the weight dtype is narrower than fp32, 8 bytes of first and second moments; 16
  bytes a parameter in all for bf16 (their K = 12), 16 for fp32 weights too (no master copy).
- ZeRO over the data-parallel group of each weight, the ranks that hold the same shard of it (dp,
  and the cp and ep ranks that do not cut it): stage 1 shards the optimizer state, 2 the gradients
  too, 3 (FSDP) the weights too.
- Gradient reduction, once a step over that group: stage 0 all-reduces the gradients (ring,
  2(n-1)/n of them per device); 1 and 2 reduce-scatter them and all-gather the updated weights;
  3 all-gathers the weights in the forward and again in the backward pass and reduce-scatters the
  gradients (1.5x the volume).
- Saved activations come from the graph: the tensors the backward pass reads. A contraction needs
  its non-weight inputs, a norm and a nonlinear elementwise op (SiLU, GELU, sigmoid) its input, a
  product of two activations both inputs, softmax its output; linear ops (adds, scaling, masks,
  RoPE, reshapes) need nothing. A tensor made by a copy (repeat_kv) or gathered by a collective is
  kept as its source and copied or gathered again (as Megatron's sequence parallelism does). Fused
  (flash) attention keeps no T x S tensor: it saves the softmax's log-sum-exp (fp32, B x H x T)
  and recomputes the rest. `recompute="selective"` also drops the T x S tensors under naive
  attention (Megatron's selective recomputation) and every elementwise output that a cheap op
  remakes from tensors already kept (SiLU(gate), the gated product); `"full"` keeps only each
  layer's input and recomputes one layer at a time in the backward pass (that layer's tensors are
  the working set). The logits are kept for the loss.
- Against Korthikanti et al. 2022 ("Reducing activation recomputation", table 2): a GPT layer
  saves sbh(34 + 5as/h) bytes in 16-bit, 34sbh with selective recomputation, 2sbh with full.
  Without dropout (3as²b + 2sbh of masks and dropped-out scores), with GQA (K and V at g/a of the
  width) and a SwiGLU MLP of width f (gate, up, SiLU(gate) and their product, 8sbf in place of the
  GELU MLP's 16sbh), the same counting gives sbh(6 + 4g/a + 4 + 2 + 8f/h) + 2as²b, which is what
  this module derives (tests/passes/test_training.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from typing import Any

from graphllm.errors import ConfigError
from graphllm.ir import Graph, Node, Ref
from graphllm.models.workload import dtype as dtype_of
from graphllm.models.workload import nbytes
from graphllm.ops import COMMUNICATION, CONTRACTION, ELEMENTWISE, OPS, SOURCE, letter_sizes
from graphllm.passes.attention_region import core_attention_region
from graphllm.passes.cost import layer_of
from graphllm.passes.registry import meta_result
from graphllm.passes.stored import param_bytes

RECOMPUTE = ("none", "selective", "full")
ZERO_STAGES = (0, 1, 2, 3)
DP_AXES = ("dp", "cp", "ep")  # mesh axes whose ranks see other tokens: their gradients add up
MOMENTS_BYTES = 8  # Adam's first and second moments in fp32
MASTER_BYTES = 4  # fp32 master weights, when the weights are narrower


@dataclass(frozen=True)
class TrainingOptions:
    """How a training step keeps its state: recomputation and ZeRO stage (Adam optimizer)."""

    recompute: str = "none"
    zero: int = 0

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE:
            raise ConfigError(f"--recompute must be one of {', '.join(RECOMPUTE)}")
        if self.zero not in ZERO_STAGES:
            raise ConfigError(f"--zero must be 0, 1, 2 or 3, got {self.zero!r}")


@dataclass(frozen=True)
class Activations:
    """Bytes one microbatch keeps for the backward pass, and what recomputation adds while it runs."""

    saved: float
    working: float  # recomputed during the backward pass, one layer at a time
    per_layer: dict[str, float] = field(default_factory=dict)  # '' holds what no layer holds

    @property
    def total(self) -> float:
        return self.saved + self.working


def saved_activations(
    graph: Graph,
    recompute: str = "none",
    attention: str = "flash",
    names: set[str] | None = None,
) -> Activations:
    """The tensors the backward pass reads, over the nodes in `names` (all by default)."""
    b = graph.bindings
    pairs = core_attention_region(graph).pairs  # the T x S tensors of core attention
    drop_pairs = attention == "flash" or recompute == "selective"
    kept = _read_by_backward(graph, names, pairs if drop_pairs else frozenset())
    for k, r in graph.outputs.items():
        if k == "logits" and (names is None or r.node in names):
            kept.setdefault(_kept_as(graph, r), "")
    if recompute == "selective":
        remade = _remade(graph, set(kept))
        kept = {r: lay for r, lay in kept.items() if r not in remade}
    # what the fused kernel keeps per row instead of the pairs (softmax's LSE)
    extra = _attention_stats(graph, names, pairs) if attention == "flash" else {}
    per_layer: dict[str, float] = defaultdict(float, extra)
    for r, lay in kept.items():
        t = graph.type_of(r)
        per_layer[lay] += nbytes(t.dtype, t.numel(b))
    if recompute != "full":
        return Activations(sum(per_layer.values()), 0.0, dict(per_layer))
    # full: each layer keeps its input and remakes the rest, one layer at a time
    inputs = defaultdict(float, {"": per_layer.get("", 0.0)})
    for lay, x in layer_inputs(graph, names).items():
        inputs[lay] += x
    working = max((v for k, v in per_layer.items() if k), default=0.0)
    return Activations(sum(inputs.values()), working, dict(inputs))


def _kept_as(graph: Graph, r: Ref) -> Ref:
    """The tensor kept for `r`: a copy or a collective's output is remade from its source (and a
    view is its input)."""
    while True:
        n = graph[r.node]
        if not (OPS[n.op].backward_redoes or (OPS[n.op].view and n.inputs)):
            return r
        r = n.inputs[0]


def _read_by_backward(
    graph: Graph, names: set[str] | None, dropped: frozenset[str]
) -> dict[Ref, str]:
    """Each tensor the backward pass of the nodes in `names` reads (graph inputs, weights and the
    nodes `dropped` aside), and the layer whose backward reads it first."""
    kept: dict[Ref, str] = {}
    for n in graph.nodes():
        if names is not None and n.name not in names:
            continue
        spec = OPS[n.op]
        if spec.category in (SOURCE, COMMUNICATION):
            continue
        reads = "inputs" if spec.category == CONTRACTION else spec.backward_reads
        if reads == "output":
            refs = [Ref(n.name, i) for i in range(len(n.outputs))]
        elif reads == "inputs":
            refs = list(n.inputs)
        else:
            continue
        for r in refs:
            r = _kept_as(graph, r)
            if OPS[graph[r.node].op].category != SOURCE and r.node not in dropped:
                kept.setdefault(r, layer_of(graph, n.name))
    return kept


def _attention_stats(
    graph: Graph, names: set[str] | None, pairs: frozenset[str]
) -> dict[str, float]:
    """Bytes a fused attention kernel keeps per query row (fp32 statistics), by layer."""
    out: dict[str, float] = defaultdict(float)
    for n in graph.nodes():
        stats = OPS[n.op].backward_stats
        if stats and n.name in pairs and (names is None or n.name in names):
            sizes = letter_sizes(graph, n)
            row = math.prod(sizes[x] for x in OPS[n.op].reduce)
            out[layer_of(graph, n.name)] += 4 * stats * n.out.numel(graph.bindings) / row
    return out


def _remade(graph: Graph, kept: set[Ref]) -> set[Ref]:
    """Elementwise outputs that elementwise ops remake from kept tensors (or remade ones)."""
    avail: set[Ref] = set(kept)
    out: set[Ref] = set()
    for n in graph.nodes():
        spec = OPS[n.op]
        if spec.category == SOURCE:
            avail.add(Ref(n.name))
        elif spec.category == ELEMENTWISE and all(_kept_as(graph, x) in avail for x in n.inputs):
            avail.add(Ref(n.name))
            out.add(Ref(n.name))
    return out


def layer_inputs(graph: Graph, names: set[str] | None) -> dict[str, float]:
    """Bytes of the tensors that enter each layer from outside it (the residual stream)."""
    b = graph.bindings
    out: dict[str, float] = defaultdict(float)
    seen: set[Ref] = set()
    for n in graph.nodes():
        if names is not None and n.name not in names:
            continue
        lay = layer_of(graph, n.name)
        if not lay or OPS[n.op].category == SOURCE:
            continue
        for r in n.inputs:
            src = graph[r.node]
            if OPS[src.op].category == SOURCE or layer_of(graph, r.node) == lay or r in seen:
                continue
            seen.add(r)
            t = graph.type_of(r)
            out[lay] += nbytes(t.dtype, t.numel(b))
    return out


# -- weights, gradients, optimizer state -------------------------------------------------------
def dp_group(node: Node, mesh: Any) -> tuple[tuple[str, ...], int]:
    """The mesh axes over which `node` (a weight) is replicated while the tokens differ."""
    if mesh is None:
        return (), 1
    sh = meta_result(node, "sharding")[0]
    cut = {m for axis in sh.axes for m, _ in axis}
    axes = tuple(a for a in DP_AXES if a not in cut and mesh.size(a) > 1)
    return axes, math.prod(mesh.size(a) for a in axes)


@dataclass(frozen=True)
class TrainingMemory:
    """One rank's bytes during a training step."""

    weights: float
    gradients: float
    optimizer: float
    activations: float  # saved for backward, times the microbatches in flight
    activations_working: float  # recomputed in the backward pass (full recomputation)
    microbatches_in_flight: int
    recompute: str
    zero: int
    collectives: list[dict[str, Any]] = field(default_factory=list)  # the gradient reduction

    @property
    def total(self) -> float:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.activations_working
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"total": self.total}


def keeps_master(weight_dtype: str) -> bool:
    """Whether Adam keeps fp32 master weights: the weights are narrower than fp32."""
    return dtype_of(weight_dtype).nbytes(1) < 4


def adam_state_bytes(master: bool) -> int:
    """Optimizer state bytes a parameter: the moments, and a master weight when one is kept."""
    return MASTER_BYTES * master + MOMENTS_BYTES


def zero_shards(zero: int, n: int) -> tuple[int, int, int]:
    """Over how many of the `n` ranks replicating a weight ZeRO stage `zero` spreads its
    (weights, gradients, optimizer state)."""
    return (n if zero >= 3 else 1, n if zero >= 2 else 1, n if zero >= 1 else 1)


def _comm(name: str, kind: str, payload: float, n: int, axes: tuple[str, ...]) -> dict[str, Any]:
    wire = OPS[kind].wire(n) * payload  # type: ignore[misc]
    return {
        "name": name,
        "kind": kind,
        "bytes": payload,
        "group_size": n,
        "wire_bytes_per_device": wire,
        "mesh_axis": "+".join(axes),
        "count": 1,  # once a step
    }


def gradient_collectives(
    groups: dict[tuple[str, ...], tuple[float, float, int]], zero: int
) -> list[dict[str, Any]]:
    """The gradient reduction's collectives: per group, (gradient bytes, weight bytes, size)."""
    out = []
    for axes, (grads, weights, n) in groups.items():
        if n <= 1:
            continue
        tag = "grads" + ("" if len(groups) == 1 else f"[{'+'.join(axes)}]")
        if zero == 0:
            out.append(_comm(f"{tag}.all_reduce", "all_reduce", grads, n, axes))
            continue
        out.append(_comm(f"{tag}.reduce_scatter", "reduce_scatter", grads, n, axes))
        if zero == 3:
            out.append(_comm(f"{tag}.all_gather.forward", "all_gather", weights, n, axes))
            out.append(_comm(f"{tag}.all_gather.backward", "all_gather", weights, n, axes))
        else:
            out.append(_comm(f"{tag}.all_gather", "all_gather", weights, n, axes))
    return out


def training_memory(
    graph: Graph,
    opts: TrainingOptions,
    attention: str = "flash",
    names: set[str] | None = None,
    in_flight: int = 1,
) -> TrainingMemory:
    """Training memory of one rank of `graph` (partitioned or not), over the nodes in `names`.

    `in_flight`: microbatches whose activations a rank holds at once (pipeline schedules).
    """
    plan = graph.meta.get("partition")
    mesh = plan.mesh if plan is not None else None
    if opts.zero and (mesh is None or mesh.size("dp") == 1):
        raise ConfigError("--zero shards over the data parallel group: give --dp N with N > 1")
    b = graph.bindings
    weights = grads = optim = 0.0
    groups: dict[tuple[str, ...], list[float]] = {}
    for p in graph.params():
        if names is not None and p.name not in names:
            continue
        numel = p.out.numel(b)
        wb = param_bytes(p, b)
        axes, n = dp_group(p, mesh)
        on_weights, on_grads, on_optim = zero_shards(opts.zero, n)
        weights += wb / on_weights
        grads += wb / on_grads
        optim += adam_state_bytes(keeps_master(p.out.dtype)) * numel / on_optim
        g = groups.setdefault(axes, [0.0, 0.0, n])
        g[0] += wb
        g[1] += wb
    act = saved_activations(graph, opts.recompute, attention, names)
    colls = gradient_collectives({k: tuple(v) for k, v in groups.items()}, opts.zero)
    return TrainingMemory(
        weights=weights,
        gradients=grads,
        optimizer=optim,
        activations=in_flight * act.saved,
        activations_working=act.working,
        microbatches_in_flight=in_flight,
        recompute=opts.recompute,
        zero=opts.zero,
        collectives=colls,
    )
