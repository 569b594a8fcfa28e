"""Figures of one rank's program: what a collective sends and how long it takes, and one tally of
params, bytes, FLOPs, communication and time over groups of its nodes.

The partition report groups the nodes by pipeline stage, the plan by layer; both tally them here,
so a figure means the same in both. A group's figures are for one microbatch, and its
collectives' for one pass (forward); the caller scales them to a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from graphllm.errors import ConfigError
from graphllm.ir import Graph, Node
from graphllm.models.hardware import Hardware, Link
from graphllm.models.nccl_tuning import PRICED, TUNINGS, Group, Tuning, nccl_choice
from graphllm.models.workload import nbytes
from graphllm.ops import COMMUNICATION, OPS, SOURCE
from graphllm.passes.cost import cost_nodes
from graphllm.passes.memory import cache_bytes
from graphllm.passes.parallel.sharding import Mesh
from graphllm.passes.registry import meta_result, run
from graphllm.passes.roofline import time_nodes
from graphllm.passes.stored import param_bytes
from graphllm.passes.training import keeps_master


# -- one collective ----------------------------------------------------------------------------
def comm_bytes(graph: Graph, n: Node) -> tuple[float, float]:
    """(payload, bytes one device sends) of a collective node.

    The payload is the whole tensor reduced, gathered, scattered, exchanged or sent. With n
    ranks, the ring all-reduce sends 2(n-1)/n of it per device, the ring all-gather and
    reduce-scatter (n-1)/n; in an all-to-all each device holds payload/n and sends (n-1)/n of
    that to the others (pairwise); a send sends the payload.
    """
    wire = OPS[n.op].wire
    if wire is None:
        return 0.0, 0.0  # recv: counted on its send
    k = n.attrs.get("group", 1)
    x, y = (nbytes(t.dtype, t.numel(graph.bindings)) for t in (graph.type_of(n.inputs[0]), n.out))
    rule = OPS[n.op].payload
    share = y if rule == "output" else x  # what one device holds of the payload
    payload = k * x if rule == "group" else share
    return payload, wire(k) * share


Pair = tuple[int, int]  # the two coordinates on its mesh axis of a point-to-point send


def _inside_node(mesh: Mesh, axis: str, hw: Hardware, pair: Pair | None = None) -> bool:
    """Whether a group of `axis` fits in one node (inner axes vary fastest); for a send between
    the coordinates `pair` of the axis, whether every such pair of devices shares a node (a
    pipeline's stages 0-7 of one node send to each other over NVLink, stage 7 to 8 over the
    network)."""
    stride, d = mesh.stride(axis), hw.devices_per_node
    if pair is None:
        return stride * mesh.size(axis) <= d
    a, b = pair
    if abs(b - a) * stride >= d:
        return False
    span = stride * mesh.size(axis)  # devices from one block of the outer axes to the next
    # the outer blocks' offsets modulo the node repeat within d blocks
    outer = range(min(mesh.devices // span, d))
    return all(
        (o * span + a * stride + i) // d == (o * span + b * stride + i) // d
        for o in outer
        for i in range(stride)
    )


def link_bandwidth(mesh: Mesh, axis: str, hw: Hardware, pair: Pair | None = None) -> float:
    """The interconnect when a group of `axis` (or the send between `pair`) fits in one node,
    else the network: the measured bus bandwidth under the achievable model, the line rate under
    the ideal one."""
    inside = _inside_node(mesh, axis, hw, pair)
    bw = hw.interconnect_bandwidth if inside else hw.network_bandwidth
    if bw is None:
        raise ConfigError(f"hardware {hw.name}: no bandwidth between devices")
    ach = hw.achievable
    link = None if ach is None else (ach.interconnect if inside else ach.network)
    return bw if link is None else link.bus_bandwidth


def collective_seconds(
    kind: str,
    group: int,
    wire: float,
    mesh: Mesh,
    axis: str,
    hw: Hardware,
    ranks_per_node: int | None = None,
    pair: Pair | None = None,
) -> float:
    """The alpha-beta time of one collective of op `kind` over `group` ranks of mesh axis `axis`
    that sends `wire` bytes a device. Under the achievable model a link with an NCCL `tuning`
    prices the all-reduce, all-gather and reduce-scatter as NCCL's tuner does (the cheapest
    algorithm and protocol: models/nccl_tuning.py); other links and kinds take the latency of the
    op's fewest steps x the link's step latency, plus the wire bytes over its bus bandwidth. An
    all-reduce inside a node whose interconnect has a measured NVLS takes it where it is faster
    (`nvls_seconds`). A kind measured on this machine (`hw.links`, inside a node) is priced by
    its own link under either model. `ranks_per_node`: of the group, on one node (default: from
    `axis`'s stride); `pair`: a send's two coordinates on `axis`, whose devices may share a node
    where the axis's whole group does not."""
    if not wire:
        return 0.0
    inside = _inside_node(mesh, axis, hw, pair)
    measured = hw.links.get(kind) if inside else None
    if measured is not None and OPS[kind].latency_steps is not None:
        # this kind timed on this machine (calibrate --link): its own alpha and beta
        alpha = min(OPS[kind].latency_steps(group).values()) * measured.step_latency
        return alpha + wire / measured.bus_bandwidth
    beta = wire / link_bandwidth(mesh, axis, hw, pair)
    ach, steps = hw.achievable, OPS[kind].latency_steps
    if ach is None or steps is None:
        return beta
    link = ach.interconnect if inside else ach.network
    tuned = nccl_group(kind, group, mesh, axis, hw, ranks_per_node)
    choice = None if tuned is None else nccl_choice(tuned, wire / OPS[kind].wire(group))
    if choice is not None:
        seconds = choice.seconds  # NCCL counts the whole tensor
    else:
        seconds = beta + (0.0 if link is None else min(steps(group).values()) * link.step_latency)
    nvls = nvls_seconds(kind, group, wire, mesh, axis, hw)
    return seconds if nvls is None else min(seconds, nvls)


def nvls_seconds(
    kind: str, group: int, wire: float, mesh: Mesh, axis: str, hw: Hardware
) -> float | None:
    """The measured NVLS time of an all-reduce that sends `wire` bytes a device over `group`
    ranks of one node (models/hardware.py's Nvls), where the interconnect has one; else None.
    NCCL's tuner prices NVLS at 25 us plus the bytes over its own estimate of the bandwidth, but
    nccl-tests on 8 H100s run 2-16 MiB all-reduces in the ring's time, not that one: so NVLS is
    not NCCL's pick here but the cheaper of its measured time and the ring's or tree's."""
    ach = hw.achievable
    if kind != "all_reduce" or ach is None or not _inside_node(mesh, axis, hw):
        return None
    if ach.interconnect is None or ach.interconnect.nvls is None or kind in hw.links:
        return None
    return ach.interconnect.nvls.seconds(group, wire / OPS[kind].wire(group))


def nccl_group(
    kind: str, group: int, mesh: Mesh, axis: str, hw: Hardware, ranks_per_node: int | None = None
) -> Group | None:
    """The collective as NCCL's tuner sees it where `collective_seconds` prices it so, else None
    (the ideal model, a link without a `tuning`, a kind measured on this machine or one the
    tuner does not price)."""
    ach, inside = hw.achievable, _inside_node(mesh, axis, hw)
    if ach is None or kind not in PRICED or (inside and kind in hw.links):
        return None
    link = ach.interconnect if inside else ach.network
    if link is None or link.tuning is None:
        return None
    ppn = group if inside else ranks_per_node or _ranks_per_node(mesh, [axis], hw)
    intra, inter = _tuned(ach.interconnect if ppn > 1 else None, None if inside else ach.network)
    steps = OPS[kind].latency_steps(group)["ring"]
    return Group(kind, group, -(-group // ppn), steps, link.bus_bandwidth, intra, inter)


def _tuned(*links: Link | None) -> list[Tuning | None]:
    return [None if k is None or k.tuning is None else TUNINGS[k.tuning] for k in links]


def _ranks_per_node(mesh: Mesh, axes: Iterable[str], hw: Hardware) -> int:
    """How many of a group over mesh `axes` share a node: of each axis, those of its devices
    (every `stride`-th) within a node. The axes need not be adjacent (pp may lie between a
    gradient's dp and cp)."""
    return math.prod(max(1, min(mesh.size(a), hw.devices_per_node // mesh.stride(a))) for a in axes)


def comm_seconds(graph: Graph, n: Node, mesh: Mesh, hw: Hardware) -> float:
    """Seconds of a collective node on the link of its mesh axis."""
    _, wire = comm_bytes(graph, n)
    pair = (n.attrs["src"], n.attrs["dst"]) if "src" in n.attrs else None  # a pipeline send
    return collective_seconds(
        n.op, n.attrs.get("group", 2), wire, mesh, n.attrs["mesh"], hw, pair=pair
    )


def gradient_seconds(c: dict[str, Any], mesh: Mesh, hw: Hardware) -> float:
    """Seconds of a training step's gradient collective (`training.gradient_collectives`), over
    the link of the outermost mesh axis it spans."""
    spans = c["mesh_axis"].split("+")
    axis = next(a for a in mesh.names if a in spans)
    wire, group = c["wire_bytes_per_device"], c["group_size"]
    ppn = _ranks_per_node(mesh, [a for a in spans if a in mesh.names], hw)
    return collective_seconds(c["kind"], group, wire, mesh, axis, hw, ranks_per_node=ppn)


# -- groups of nodes ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Collective:
    """A collective node's traffic, once a pass of a microbatch."""

    name: str
    kind: str  # the row's comm_kind (send/recv), else the op
    axis: str  # the mesh axis it runs over
    group: int  # ranks in its group
    payload: float
    wire: float  # bytes one device sends
    seconds: float | None  # on the link; None without hardware


@dataclass
class Figures:
    """What a group of one rank's nodes holds and costs, for one microbatch."""

    names: set[str] = field(default_factory=set)  # its nodes, sources included
    params: float = 0.0
    weight_bytes: float = 0.0
    ep_weight_bytes: float = 0.0  # of weight_bytes: cut over ep (their gradients skip ep)
    master: bool = False  # weights narrower than fp32: Adam keeps fp32 master weights
    kv_cache_bytes: float = 0.0
    # the conv and recurrent states linear-attention and Mamba layers carry to the next
    # step in place of keys and values (constant in the sequence length)
    state_bytes: float = 0.0
    flops: Any = 0  # exact (cost.py): an int, or a Fraction of balanced routing
    bytes: float = 0.0
    compute_seconds: float = 0.0  # 0 without hardware
    comm_seconds: float = 0.0  # one pass
    collectives: list[Collective] = field(default_factory=list)  # in node order


def tally(
    graph: Graph,
    hardware: Hardware | None,
    attention: str,
    training: bool,
    groups_of: Callable[[Node], Iterable[Figures]],
    verified: bool = False,
) -> list[Collective]:
    """Add every node of a partitioned graph into the groups `groups_of` gives it (a weight may be
    held by several); returns the timed collectives in node order. Runs cost and roofline first
    (forward and backward when `training`). `verified`: the caller verified the graph as it
    stands (partition does, last), so its nodes are costed and timed without the verify pass
    and without the passes' totals, which nothing here reads."""
    if verified:
        cost_nodes(graph, attention, training)
        if hardware is not None:
            time_nodes(graph, hardware, attention == "flash", training)
    else:
        run(graph, ["cost", "roofline"], hardware=hardware, attention=attention, training=training)
    mesh = meta_result(graph, "partition").mesh
    presents = {r.node for r in graph.cache_outputs().values()}
    states: dict[str, float] = {}  # node -> bytes of the states it carries to the next step
    for r in graph.state_outputs().values():
        t = graph.type_of(r)
        states[r.node] = states.get(r.node, 0.0) + nbytes(t.dtype, t.numel(graph.bindings))
    timed: list[Collective] = []
    for n in graph.nodes():
        groups = list(groups_of(n))
        for f in groups:
            f.names.add(n.name)
        if OPS[n.op].category == SOURCE:
            if n.op == "param":
                _add_weight(graph, n, groups)
            continue
        c = _collective(graph, n, mesh, hardware)
        if c is not None:
            timed.append(c)
        computes = OPS[n.op].category != COMMUNICATION and hardware is not None
        compute = meta_result(n, "time").seconds if computes else 0.0
        cost = meta_result(n, "cost")
        kv = cache_bytes(graph, n.out) if n.name in presents else 0.0
        state = states.get(n.name, 0.0)
        for f in groups:
            f.flops += cost.flops
            f.bytes += cost.bytes
            f.kv_cache_bytes += kv
            f.state_bytes += state
            f.compute_seconds += compute
            if c is not None:
                f.comm_seconds += c.seconds or 0.0
                f.collectives.append(c)
    return timed


def _add_weight(graph: Graph, n: Node, groups: list[Figures]) -> None:
    """A weight's params and bytes into each group that holds it."""
    numel = n.out.numel(graph.bindings)
    size = param_bytes(n, graph.bindings, numel)
    sh = meta_result(n, "sharding")[0]
    on_ep = any(m == "ep" for axis in sh.axes for m, _ in axis)
    for f in groups:
        f.params += numel
        f.weight_bytes += size
        if on_ep:
            f.ep_weight_bytes += size
        f.master |= keeps_master(n.out.dtype)


def _collective(graph: Graph, n: Node, mesh: Mesh, hw: Hardware | None) -> Collective | None:
    """The traffic of a collective node; None for any other node, and for a collective timed on
    its peer (a recv)."""
    spec = OPS[n.op]
    if spec.category != COMMUNICATION or spec.timed_on_peer:
        return None
    payload, wire = comm_bytes(graph, n)
    secs = comm_seconds(graph, n, mesh, hw) if hw else None
    kind = spec.comm_kind or n.op
    return Collective(n.name, kind, n.attrs["mesh"], n.attrs["group"], payload, wire, secs)


# -- a pipeline of stages ----------------------------------------------------------------------
def bubble(microbatches: int, stages: int) -> float:
    """The idle share of a pipeline step (GPipe and 1F1B alike)."""
    return (stages - 1) / (microbatches + stages - 1)


def step_seconds(stages: list[dict[str, Any]], microbatches: int) -> float:
    """A pipeline step: the first microbatch through every stage, then the other M - 1 each a
    turn of the slowest stage (a flow shop of identical jobs: exact for GPipe's forward, and
    (M + pp - 1) x the stage's time when the stages are balanced), then the gradient reduction
    (not overlapped)."""
    per_mb = [e["seconds_per_microbatch"] for e in stages]
    grads = max(e["gradient_seconds"] for e in stages)
    return math.fsum(per_mb) + (microbatches - 1) * max(per_mb) + grads
