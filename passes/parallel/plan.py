"""Parallel plans: every legal TP x CP x PP x EP x DP layout of N devices, fitted and ranked.

Legality is the partition pass's own: `partition.validate` and the partition transform itself,
whose ConfigError becomes the recorded reason. Microbatches: a training step runs B/dp of one
sequence each (gradient accumulation; 1F1B keeps at most pp in flight); inference runs one
microbatch (pp = 1, or decode, where each microbatch would read the weights again) or B/dp of one
sequence (a pipelined prefill). Tensor parallel training adds sequence parallelism where it is
legal (it only removes replicated activations).

Speed: a candidate's per-rank program depends on (tp, sp, cp, ep, microbatch size) alone, and
layers of one kind (the per-layer fields of the config: attention type, MoE or dense) cost the
same, so each such key is partitioned once, on a model with one layer of each kind, and every
pp, dp and ZeRO choice is assembled from its per-layer figures: stages balanced by layer time as
`partition.pipeline` does, a send of the residual stream between stages, memory per stage
(training: passes/training.py), step = (M + pp - 1) x the slowest stage's microbatch + the
gradient reduction. `tests/passes/parallel/test_plan.py` checks candidates against the full partition report.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from graphllm.build.builder import build_graph
from graphllm.errors import ConfigError, GraphllmError
from graphllm.ir import Graph
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.models.workload import dtype as dtype_of
from graphllm.ops import COMMUNICATION, OPS, SOURCE
from graphllm.passes.cost import layer_of, layer_scopes
from graphllm.passes.memory import peak_activations
from graphllm.passes.parallel.partition import (
    Strategy,
    balance,
    comm_bytes,
    gradient_seconds,
    link_bandwidth,
    make_mesh,
    partition,
    validate,
)
from graphllm.passes.registry import meta_result, run
from graphllm.passes.training import (
    MASTER_BYTES,
    MOMENTS_BYTES,
    TrainingOptions,
    _layer_inputs,
    gradient_collectives,
    saved_activations,
)

AXES = ("tp", "cp", "pp", "ep", "dp")


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def factorisations(n: int, pinned: dict[str, int], moe: bool) -> list[dict[str, int]]:
    """Every assignment of sizes to AXES whose product is n; pinned sizes fixed; ep=1 if dense."""
    out = []

    def rec(i: int, left: int, acc: dict[str, int]) -> None:
        if i == len(AXES) - 1:
            ax = AXES[i]
            if pinned.get(ax, left) == left:
                out.append(acc | {ax: left})
            return
        ax = AXES[i]
        choices = [pinned[ax]] if ax in pinned else divisors(left)
        if ax == "ep" and not moe and ax not in pinned:
            choices = [1]
        for d in choices:
            if left % d == 0:
                rec(i + 1, left // d, acc | {ax: d})

    rec(0, n, {})
    return out


# -- per-layer figures of one partitioned program -------------------------------------------------
def layer_kinds(cfg: ModelConfig) -> list[tuple]:
    """Per layer, the values of the config's per-layer fields: layers of one kind cost the same."""
    n = cfg.num_hidden_layers
    per = [f.name for f in dataclasses.fields(cfg) if _per_layer(getattr(cfg, f.name), n)]
    return [tuple(getattr(cfg, k)[i] for k in per) for i in range(n)]


def _per_layer(v: Any, n: int) -> bool:
    return isinstance(v, tuple) and len(v) == n


def reduced_config(cfg: ModelConfig) -> tuple[ModelConfig, list[int]]:
    """A config with one layer of each kind, and for each real layer its reduced index."""
    kinds = layer_kinds(cfg)
    first: dict[tuple, int] = {}
    for i, k in enumerate(kinds):
        first.setdefault(k, i)
    keep = sorted(first.values())
    n = cfg.num_hidden_layers
    changes: dict[str, Any] = {"num_hidden_layers": len(keep)}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if _per_layer(v, n):
            changes[f.name] = tuple(v[i] for i in keep)
    try:
        small = dataclasses.replace(cfg, **changes)
    except (GraphllmError, TypeError, ValueError):
        return cfg, list(range(n))
    where = {k: j for j, k in enumerate(kinds[i] for i in keep)}
    return small, [where[k] for k in kinds]


@dataclass
class Part:
    """Figures of one layer (or of what comes before / after the layers), per microbatch."""

    seconds: float = 0.0  # compute (forward, or forward + backward when training)
    comm_seconds: float = 0.0  # per pass
    comm: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # -> [seconds, wire]
    params: float = 0.0
    weight_bytes: float = 0.0
    ep_weight_bytes: float = 0.0  # of weight_bytes: cut over ep (their gradients skip ep)
    master: bool = False  # weights narrower than fp32: Adam keeps fp32 master weights
    kv_bytes: float = 0.0
    saved: float = 0.0  # activations kept for backward (training)
    full_saved: float = 0.0  # ... under no recomputation (the working set of full recompute)
    stream_bytes: float = 0.0  # the residual stream entering the layer (a pipeline send)


@dataclass
class Program:
    layers: list[Part]  # per reduced layer
    pre: Part
    post: Part
    peak_activations: float  # inference


def analyse(
    graph: Graph, hw: Hardware, attention: str, training: TrainingOptions | None
) -> Program:
    """Per-layer figures of a partitioned graph (one rank's program)."""
    train = training is not None
    run(graph, ["cost", "roofline"], hardware=hw, attention=attention, training=train)
    mesh = meta_result(graph, "partition").mesh
    order = layer_scopes(graph)
    index = {p: i for i, p in enumerate(order)}
    layers = [Part() for _ in order]
    pre, post = Part(), Part()
    b = graph.bindings

    def part(name: str) -> Part:
        lay = layer_of(graph, name)
        return layers[index[lay]] if lay else post if seen_layer else pre

    seen_layer = False
    presents = {r.node for r in graph.cache_outputs().values()}
    kv_dt = graph.meta.get("kv_dtype")
    for n in graph.nodes():
        spec = OPS[n.op]
        if spec.category == SOURCE:
            if n.op == "param":
                users = graph.users(n)
                p = part(users[0].name) if users else pre
                nb = dtype_of(n.out.dtype).nbytes(n.out.numel(b))
                p.params += n.out.numel(b)
                p.weight_bytes += nb
                sh = meta_result(n, "sharding")[0]
                if any(m == "ep" for axis in sh.axes for m, _ in axis):
                    p.ep_weight_bytes += nb
                p.master |= dtype_of(n.out.dtype).nbytes(1) < 4
            continue
        p = part(n.name)
        if p is not pre and p is not post:
            seen_layer = True
        if n.name in presents:
            p.kv_bytes += dtype_of(kv_dt or n.out.dtype).nbytes(n.out.numel(b))
        if spec.category == COMMUNICATION:
            if spec.timed_on_peer:
                continue
            _, wire = comm_bytes(graph, n)
            secs = wire / link_bandwidth(mesh, n.attrs["mesh"], hw) if wire else 0.0
            p.comm_seconds += secs
            c = p.comm.setdefault((n.op, n.attrs["mesh"]), [0.0, 0.0])
            c[0] += secs
            c[1] += wire
        else:
            p.seconds += meta_result(n, "time").seconds
    peak = 0.0
    if train:
        rc = training.recompute  # type: ignore[union-attr]
        act = saved_activations(graph, rc, attention).per_layer
        none = saved_activations(graph, "none", attention).per_layer if rc == "full" else act
        for lay, x in act.items():
            p = layers[index[lay]] if lay else post
            p.saved += x
        for lay, x in none.items():
            if lay:
                layers[index[lay]].full_saved += x
    else:
        peak = peak_activations(graph, attention)[0]
    for lay, x in _layer_inputs(graph, None).items():
        layers[index[lay]].stream_bytes = x
    return Program(layers, pre, post, peak)


# -- assembling a candidate -----------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    strategy: dict[str, Any]
    memory_bytes: float  # the fullest device
    fits: bool
    seconds: float  # a step: a decoded token, a prefill, or a training step
    compute_seconds: float  # of the slowest stage, a step, without the bubble
    comm_seconds: float  # of the slowest stage, a step (gradient reduction included)
    main_comm: dict[str, Any]  # the collective kind taking the most time a step
    stages: list[dict[str, Any]]
    bubble: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def assemble(
    prog: Program,
    kinds: list[int],
    s: Strategy,
    hw: Hardware,
    training: TrainingOptions | None,
) -> Candidate:
    """A candidate's stages, memory and step time from its program's per-layer figures."""
    mesh = make_mesh(s)
    m, pp, train = s.microbatches, s.pp, training is not None
    passes = 2 if train else 1
    full = [prog.layers[k] for k in kinds]
    weights = [p.seconds + passes * p.comm_seconds for p in full]
    weights[0] += prog.pre.seconds + passes * prog.pre.comm_seconds
    weights[-1] += prog.post.seconds + passes * prog.post.comm_seconds
    groups = balance(weights, pp) if pp > 1 else [(0, len(full) - 1)]
    send_bw = link_bandwidth(mesh, "pp", hw) if pp > 1 else 0.0
    stages, comm = [], defaultdict(float)
    for st, (a, z) in enumerate(groups):
        parts = full[a : z + 1] + [prog.pre] * (st == 0) + [prog.post] * (st == pp - 1)
        per_mb = sum(weights[a : z + 1])
        compute = sum(p.seconds for p in parts)
        for p in parts:
            for key, (secs, _) in p.comm.items():
                comm[key] += passes * m * secs / pp  # the average stage, for the main cost
        if st < pp - 1:  # send the residual stream to the next stage (and its gradient back)
            sent = full[z + 1].stream_bytes / send_bw
            per_mb += passes * sent
            comm[("send/recv", "pp")] += passes * m * sent / pp
        wb = sum(p.weight_bytes for p in parts)
        entry: dict[str, Any] = {
            "stage": st,
            "layers": [a, z],
            "params": sum(p.params for p in parts),
            "seconds_per_microbatch": per_mb,
            "compute_seconds": m * compute,
        }
        if train:
            mem, grad_s = _training_memory(parts, s, mesh, hw, training, min(pp - st, m))
            entry |= mem
            comm[("gradients", "dp")] = max(comm[("gradients", "dp")], grad_s)
            entry["gradient_seconds"] = grad_s
        else:
            kv = m * sum(p.kv_bytes for p in parts)
            entry |= {"weight_bytes": wb, "kv_cache_bytes": kv}
            entry["memory_bytes"] = wb + kv + prog.peak_activations
            entry["gradient_seconds"] = 0.0
        stages.append(entry)
    slowest = max(e["seconds_per_microbatch"] for e in stages)
    grads = max(e["gradient_seconds"] for e in stages)
    step = (m + pp - 1) * slowest + grads
    mem = max(e["memory_bytes"] for e in stages)
    slow = max(stages, key=lambda e: e["seconds_per_microbatch"])
    compute = slow["compute_seconds"]  # of the slowest stage, its microbatches, no bubble
    kind, axis = max(comm, key=lambda k: comm[k]) if comm else ("none", "")
    main = {"kind": kind, "mesh_axis": axis, "seconds": comm.get((kind, axis), 0.0)}
    return Candidate(
        strategy=s.to_dict(),
        memory_bytes=mem,
        fits=mem <= hw.memory_bytes,
        seconds=step,
        compute_seconds=compute,
        comm_seconds=m * slowest - compute + grads,
        main_comm=main,
        stages=stages,
        bubble=(pp - 1) / (m + pp - 1),
    )


def _training_memory(
    parts: list[Part],
    s: Strategy,
    mesh: Any,
    hw: Hardware,
    opts: TrainingOptions,
    in_flight: int,
) -> tuple[dict[str, Any], float]:
    """Training memory of a stage (as passes/training.training_memory) and its gradient time."""
    wb = sum(p.weight_bytes for p in parts)
    ep_wb = sum(p.ep_weight_bytes for p in parts)
    master = any(p.master for p in parts)
    params = sum(p.params for p in parts)
    ep_params = params * ep_wb / wb if wb else 0.0
    n_all = s.dp * s.cp * s.ep  # replicas of a weight that ep does not cut
    n_ep = s.dp * s.cp
    axes_all = tuple(a for a in ("dp", "cp", "ep") if getattr(s, a) > 1)
    axes_ep = tuple(a for a in ("dp", "cp") if getattr(s, a) > 1)
    z = opts.zero
    out = {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0}
    for byts, numel, n in ((wb - ep_wb, params - ep_params, n_all), (ep_wb, ep_params, n_ep)):
        out["weights"] += byts / (n if z >= 3 else 1)
        out["gradients"] += byts / (n if z >= 2 else 1)
        state = (MASTER_BYTES * master + MOMENTS_BYTES) * numel
        out["optimizer"] += state / (n if z >= 1 else 1)
    saved = sum(p.saved for p in parts)
    working = max((p.full_saved for p in parts), default=0.0) if opts.recompute == "full" else 0.0
    out["activations"] = in_flight * saved
    out["activations_working"] = working
    out["microbatches_in_flight"] = in_flight
    out["memory_bytes"] = sum(out[k] for k in ("weights", "gradients", "optimizer")) + (
        in_flight * saved + working
    )
    groups = {}
    if n_all > 1 and wb - ep_wb:
        groups[axes_all] = (wb - ep_wb, wb - ep_wb, n_all)
    if n_ep > 1 and ep_wb:
        groups[axes_ep] = (ep_wb, ep_wb, n_ep)
    secs = 0.0
    for c in gradient_collectives(groups, z):
        secs += gradient_seconds(c, mesh, hw)
    return out, secs


# -- the search ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanReport:
    devices: int
    phase: str  # decode | prefill | training
    candidates: list[dict[str, Any]]  # fitting, fastest first
    too_big: list[dict[str, Any]]
    illegal: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _microbatches(wl: Workload, s: dict[str, int], train: bool) -> int:
    local = wl.batch // s["dp"]
    if train:
        return local  # one sequence each: gradient accumulation
    return local if s["pp"] > 1 and wl.phase != "decode" else 1


def plan(
    cfg: ModelConfig,
    wl: Workload,
    devices: int,
    hw: Hardware,
    training: TrainingOptions | None = None,
    attention: str = "flash",
    pinned: dict[str, int] | None = None,
) -> PlanReport:
    """Every legal layout of `devices`, those that fit ranked by predicted step time."""
    if not isinstance(devices, int) or devices < 1:
        raise ConfigError(f"--devices must be a positive integer, got {devices!r}")
    if devices > 1 and hw.interconnect_bandwidth is None:
        raise ConfigError(f"hardware {hw.name} has no interconnect: plans need a device preset")
    pinned = {k: v for k, v in (pinned or {}).items() if v is not None}
    fixed = math.prod(pinned.values())
    if devices % fixed:
        sizes = " x ".join(f"--{k} {v}" for k, v in pinned.items())
        raise ConfigError(f"{sizes} = {fixed} devices does not divide --devices {devices}")
    train = training is not None
    if train and training.zero and pinned.get("dp") == 1:  # type: ignore[union-attr]
        raise ConfigError("--zero shards over the data parallel group: --dp 1 leaves none")
    small, kinds = reduced_config(cfg)
    programs: dict[tuple, Program | str] = {}
    ok, big, bad = [], [], []
    for sizes in factorisations(devices, pinned, cfg.is_moe):
        if train and training.zero and sizes["dp"] == 1:  # type: ignore[union-attr]
            bad.append({"strategy": sizes, "reason": "--zero needs dp > 1"})
            continue
        m = _microbatches(wl, sizes, train) if wl.batch % sizes["dp"] == 0 else 1
        s = Strategy(**sizes, microbatches=max(m, 1))
        try:
            validate(cfg, wl, s)
        except ConfigError as e:
            bad.append({"strategy": sizes, "reason": str(e)})
            continue
        sp = False
        if train and s.tp > 1:
            try:
                validate(cfg, wl, dataclasses.replace(s, sp=True))
                sp = True
            except ConfigError:
                pass
        s = dataclasses.replace(s, sp=sp)
        b_mb = wl.batch // s.dp // s.microbatches
        key = (s.tp, s.sp, s.cp, s.ep, b_mb)
        if key not in programs:
            sub = Strategy(tp=s.tp, sp=s.sp, cp=s.cp, ep=s.ep)
            w = dataclasses.replace(wl, batch=b_mb)
            try:
                g = partition(build_graph(small, w), sub, hw)
                programs[key] = analyse(g, hw, attention, training)
            except GraphllmError as e:
                programs[key] = str(e)
        prog = programs[key]
        if isinstance(prog, str):
            bad.append({"strategy": sizes, "reason": prog})
            continue
        c = assemble(prog, kinds, s, hw, training)
        (ok if c.fits else big).append(c.to_dict())
    if not ok and not big:
        why = "; ".join(sorted({x["reason"] for x in bad})[:3])
        raise ConfigError(f"no layout of {devices} devices is legal for {cfg.name}: {why}")
    ok.sort(key=lambda c: c["seconds"])
    big.sort(key=lambda c: c["memory_bytes"])
    phase = "training" if train else wl.phase
    return PlanReport(devices, phase, ok, big, bad)
