"""A Chrome / Perfetto trace of a partitioned graph's predicted schedule (`partition --trace`).

One process (`pid`) per device, named with its mesh coordinates and pipeline stage; two threads
(`tid`): 0 compute, 1 communication. Every op and collective of a microbatch is a complete event
(`ph: "X"`, `ts` and `dur` in µs) at its roofline time; communication does not overlap compute,
as in the partition report. Microbatches follow the GPipe schedule for inference (forward only:
stage s runs microbatch j in slot s + j) and 1F1B for training (Narayanan et al. 2021: stage s
runs min(pp - s - 1, M) warm-up forwards, then one forward and one backward alternately). Every
slot is as long as the slowest stage's forward (backward), so a faster stage idles at the end of
its slots; the idle slots before, between and after a stage's work are `bubble` events, and on each
device they add up to (pp - 1) / (M + pp - 1) of the pipeline's part of the step. The gradient
reduction of a training step follows on the communication lane.

An op's backward event is its training time less its forward time, at least 0: a longer backward
kernel can hide more of its launch (passes/roofline.py), so an op's share may come out below its
forward one, and the clamp makes the lanes overstate the step by that (1e-8 s on a small MoE).

Large programs (more than MAX_EVENTS events) are drawn one event per layer and lane instead of one
per op; the times are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from graphllm.errors import ConfigError
from graphllm.files import json_text, write_text_atomic
from graphllm.ir import Graph
from graphllm.models.hardware import Hardware
from graphllm.ops import COMMUNICATION, OPS, SOURCE
from graphllm.passes import meta_result, run
from graphllm.passes.cost import layer_of
from graphllm.passes.parallel.figures import comm_seconds

MAX_EVENTS = 200_000
# events a trace holds at most, even drawn per layer: some 120 bytes of JSON each, 250 MB in all,
# about what Perfetto's UI and chrome://tracing still open
MAX_TRACE_EVENTS = 2_000_000
US = 1e6  # trace times are in µs
COMPUTE, COMM = 0, 1
Segment = tuple[str, int, float]  # name, lane, seconds


def _segments(graph: Graph, hw: Hardware, attention: str, training: bool) -> list[list[Any]]:
    """Per stage, its forward segments and (training) backward segments, in run order."""
    plan = graph.meta["partition"]
    mesh, pp = plan.mesh, plan.strategy.pp
    run(graph, ["cost", "roofline"], hardware=hw, attention=attention, training=False)
    fwd = {n.name: meta_result(n, "time").seconds for n in graph.nodes()}
    total = fwd
    if training:
        run(graph, ["cost", "roofline"], hardware=hw, attention=attention, training=True)
        total = {n.name: meta_result(n, "time").seconds for n in graph.nodes()}
    out: list[list[Any]] = [[[], []] for _ in range(pp)]
    for n in graph.nodes():
        spec = OPS[n.op]
        if spec.category == SOURCE or spec.timed_on_peer:  # a recv is timed on its send
            continue
        st = meta_result(n, "stage")
        if spec.category == COMMUNICATION:
            t = comm_seconds(graph, n, mesh, hw)
            out[st][0].append((n.name, COMM, t))
            if training:
                out[st][1].append((f"{n.name} (backward)", COMM, t))
        else:
            out[st][0].append((n.name, COMPUTE, fwd.get(n.name, 0.0)))
            if training:
                # an op fused into a longer backward kernel may hide more of its launch than
                # in the forward one (passes/roofline.py): its kernel grows, the op need not
                back = max(0.0, total.get(n.name, 0.0) - fwd.get(n.name, 0.0))
                out[st][1].append((f"{n.name} (backward)", COMPUTE, back))
    for st in out:
        st[1].reverse()
    return out


def _coarse(graph: Graph, segs: list[Segment]) -> list[Segment]:
    """Consecutive segments of one layer (or outside layers) and lane merged into one."""
    out: list[Segment] = []
    for name, lane, t in segs:
        base = name.removesuffix(" (backward)")
        layer = layer_of(graph, base) or base
        label = layer + (" (backward)" if name != base else "")
        label += " comm" if lane == COMM else ""
        if out and out[-1][0] == label and out[-1][1] == lane:
            out[-1] = (label, lane, out[-1][2] + t)
        else:
            out.append((label, lane, t))
    return out


def schedule(pp: int, m: int, training: bool) -> list[list[tuple[str, int, int]]]:
    """Per stage, its ops in order: ('F' or 'B', microbatch, stage)."""
    out = []
    for s in range(pp):
        if not training:
            out.append([("F", j, s) for j in range(m)])
            continue
        warm = min(pp - s - 1, m)
        ops = [("F", j, s) for j in range(warm)]
        for i in range(m - warm):
            ops += [("F", warm + i, s), ("B", i, s)]
        ops += [("B", j, s) for j in range(m - warm, m)]
        out.append(ops)
    return out


def timeline(pp: int, m: int, f: float, b: float, training: bool) -> dict[tuple, float]:
    """Start time of every op when each forward takes `f` and each backward `b`."""
    order = schedule(pp, m, training)
    start: dict[tuple, float] = {}
    end: dict[tuple, float] = {}
    pos, free = [0] * pp, [0.0] * pp
    while any(pos[s] < len(order[s]) for s in range(pp)):
        moved = False
        for s in range(pp):
            while pos[s] < len(order[s]):
                kind, j, _ = order[s][pos[s]]
                deps = [(kind, j, s - 1)] if kind == "F" and s > 0 else []
                if kind == "B":
                    deps = [("F", j, s)] + ([("B", j, s + 1)] if s < pp - 1 else [])
                if any(d not in end for d in deps):
                    break
                t0 = max([free[s], *(end[d] for d in deps)])
                key = (kind, j, s)
                start[key], end[key] = t0, t0 + (f if kind == "F" else b)
                free[s] = end[key]
                pos[s] += 1
                moved = True
        if not moved:  # cannot happen for these schedules; guards an infinite loop
            raise RuntimeError("pipeline schedule deadlocked")
    return start


def chrome_trace(
    graph: Graph,
    report: dict[str, Any],
    hw: Hardware,
    attention: str = "flash",
    training: bool = False,
) -> dict[str, Any]:
    """The trace document of the partition report `report` (PartitionReport.to_dict())."""
    plan = graph.meta["partition"]
    pp, m = plan.strategy.pp, plan.strategy.microbatches
    segs = _segments(graph, hw, attention, training)
    nodes = sum(len(f) + len(b) for f, b in segs)
    if nodes * m * len(report["devices"]) > MAX_EVENTS:
        segs = [[_coarse(graph, f), _coarse(graph, b)] for f, b in segs]
    _require_drawable(segs, m, len(report["devices"]) // pp)
    f = max(sum(t for _, _, t in st[0]) for st in segs)
    b = max(sum(t for _, _, t in st[1]) for st in segs) if training else 0.0
    slots = _Slots(timeline(pp, m, f, b, training), f, b, (m + pp - 1) * (f + b))
    events: list[dict[str, Any]] = []
    for dev in report["devices"]:
        pid, st = dev["rank"], dev["coords"]["pp"]
        events += _process(pid, st, dev["coords"], report["mesh"])
        events += slots.events(pid, st, segs[st])
        events += _gradients(pid, st, report["collectives"], slots.end)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "schedule": "1F1B" if training else "GPipe (forward only)",
            "stages": pp,
            "microbatches": m,
            "slot_forward_us": f * US,
            "slot_backward_us": b * US,
            "pipeline_us": slots.end * US,
            "bubble": (pp - 1) / (m + pp - 1),
        },
    }


def require_traceable(microbatches: int, devices: int) -> None:
    """Refuse, before anything is built, a trace that would hold too many events even at one
    event a microbatch and device (each runs at least one layer in each)."""
    _require_events(microbatches * devices, microbatches, devices)


def _require_drawable(segs: list[list[Any]], microbatches: int, per_stage: int) -> None:
    """Refuse, before drawing, a trace of more than MAX_TRACE_EVENTS events (one a layer)."""
    events = per_stage * microbatches * sum(len(f) + len(b) for f, b in segs)
    _require_events(events, microbatches, per_stage * len(segs))


def _require_events(events: int, microbatches: int, devices: int) -> None:
    if events > MAX_TRACE_EVENTS:
        raise ConfigError(
            f"--trace would hold {events:,} events or more ({microbatches:,} microbatches on "
            f"{devices:,} devices, one event a layer); graphllm writes at most "
            f"{MAX_TRACE_EVENTS:,} (what trace viewers open): fewer --microbatches or devices"
        )


@dataclass(frozen=True)
class _Slots:
    """The pipeline schedule: when each (pass, microbatch, stage) slot starts, how long a forward
    and a backward slot last, and when the pipeline's part of the step ends."""

    start: dict[tuple, float]
    forward: float
    backward: float
    end: float

    def events(self, pid: int, stage: int, segs: list[list[Segment]]) -> list[dict[str, Any]]:
        """Device `pid`'s ops in each of its stage's slots, and the bubbles between them."""
        events, busy = [], []
        for (kind, j, s), t0 in sorted(self.start.items(), key=lambda kv: kv[1]):
            if s != stage:
                continue
            fwd = kind == "F"
            busy.append((t0, t0 + (self.forward if fwd else self.backward)))
            args = {"microbatch": j, "pass": "forward" if fwd else "backward", "stage": stage}
            cursor = t0
            for name, lane, t in segs[0 if fwd else 1]:
                if t <= 0:
                    continue
                cat = "communication" if lane == COMM else "compute"
                events.append(_span(name, cat, cursor, t, pid, lane, args))
                cursor += t
        t = 0.0
        for a, z in busy + [(self.end, self.end)]:
            if a > t + 1e-15:
                events.append(_span("bubble", "bubble", t, a - t, pid, COMPUTE, {"stage": stage}))
            t = max(t, z)
        return events


def _process(pid: int, stage: int, coords: dict[str, int], mesh: dict[str, int]) -> list:
    """The device's process and thread names: its stage and its other mesh coordinates."""
    where = [f"{k} {v}" for k, v in coords.items() if mesh[k] > 1]
    label = f"device {pid}: stage {stage}" + "".join(f", {w}" for w in where if w[:2] != "pp")
    return [
        _meta(pid, "process_name", label),
        _meta(pid, "process_sort_index", pid, key="sort_index"),
        _meta(pid, "thread_name", "compute", tid=COMPUTE),
        _meta(pid, "thread_name", "communication", tid=COMM),
    ]


def _gradients(pid: int, stage: int, collectives: list[dict[str, Any]], t0: float) -> list:
    """A training step's gradient reductions of the stage, one after another from `t0`."""
    events = []
    for c in collectives:
        if c.get("gradient") and c["stage"] == stage and c["seconds"]:
            args = {"bytes": c["bytes"], "group_size": c["group_size"]}
            events.append(_span(c["name"], "gradient reduction", t0, c["seconds"], pid, COMM, args))
            t0 += c["seconds"]
    return events


def _meta(pid: int, name: str, value: Any, tid: int = 0, key: str = "name") -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {key: value}}


def _span(
    name: str, cat: str, t0: float, dur: float, pid: int, tid: int, args: dict[str, Any]
) -> dict[str, Any]:
    """A complete event (`ph: "X"`) from `t0` seconds for `dur` seconds."""
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": t0 * US,
        "dur": dur * US,
        "pid": pid,
        "tid": tid,
        "args": dict(args),  # an event of its own, not one shared by a slot's ops
    }


def write_trace(path: str | Path, doc: dict[str, Any]) -> Path:
    """Write the trace atomically (whole or not at all)."""
    return write_text_atomic(path, json_text(doc))
