"""Measured beside predicted: what `graphllm run`'s ranks timed against the partition report.

The ranks' timing records (graphllm/runtime/dist/records.py, as `RankRecord.to_dict()`) give, per
step (prefill, decode 1..K), each segment's compute seconds and each cut point's wall seconds.
The prediction is the partition report of the same model, strategy and step workload (T, P, fp32
as the ranks compute) on a device (`--hardware local`: this machine, its links measured by
`graphllm calibrate --link`). The table holds, per step kind (prefill; decode: the median over
its steps, on both sides) and per rank, the seconds of compute and of each collective kind,
measured and predicted, and their ratio.

A collective's wall time includes waiting for its slowest peer to arrive: ranks that compute
unevenly, a later pipeline stage's recv (which waits for the stages before it to compute), and
above all more ranks than cores (a rank waits for a core as well as for its peers), which the
notes say.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from typing import Any

from graphllm.build.builder import build_graph
from graphllm.errors import GraphllmError
from graphllm.exporters.trace import US, chrome_trace
from graphllm.ir import Graph
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.ops import COMMUNICATION, OPS
from graphllm.passes import meta_result
from graphllm.passes.parallel.figures import comm_seconds
from graphllm.passes.parallel.partition import Strategy, partition, partition_report

COMPUTE = "compute"
STEP = "step"  # the step's wall time: compute, communication and what else the rank did
KINDS = ("prefill", "decode")


@dataclass(frozen=True)
class Row:
    """One figure of one rank in one step kind: measured and predicted seconds."""

    step: str  # prefill or decode (the median over the decode steps)
    rank: int
    kind: str  # compute, step, or a collective's op (all_reduce, send, recv, ...)
    measured: float
    predicted: float
    # a collective kind's median call (over every call of the step kind) and its predicted one:
    # the link's own ratio, which a step's first call, absorbing the ranks' skew, does not sway
    measured_call: float | None = None
    predicted_call: float | None = None
    # the median call as the last rank to reach it timed it (the least over its group): the
    # transfer without the wait for the peers, which the others' calls hold
    last_call: float | None = None

    @property
    def ratio(self) -> float | None:
        """measured / predicted (None where nothing was predicted)."""
        return self.measured / self.predicted if self.predicted > 0 else None

    @property
    def call_ratio(self) -> float | None:
        """The median call's measured / predicted seconds (collectives)."""
        if self.measured_call is None or not self.predicted_call:
            return None
        return self.measured_call / self.predicted_call

    @property
    def last_ratio(self) -> float | None:
        """The median call of the last rank to reach it, measured / predicted (collectives)."""
        if self.last_call is None or not self.predicted_call:
            return None
        return self.last_call / self.predicted_call


def step_kind(step: str) -> str:
    """'prefill' or 'decode' of a record's step name ('prefill', 'decode 3')."""
    kind = step.split()[0] if step else ""
    if kind not in KINDS:
        raise GraphllmError(f"timing record: unknown step {step!r}; known: prefill, decode N")
    return kind


def strategy_of(text: str) -> Strategy:
    """The Strategy that `Strategy.describe()` wrote as `text` ('pp=2 tp=2 sp')."""
    kw: dict[str, Any] = {}
    for part in text.split():
        if part in ("sp", "whole_vocab"):
            kw[part] = True
        elif "=" in part and part.split("=")[0] in Strategy.__dataclass_fields__:
            k, v = part.split("=", 1)
            kw[k] = int(v)
        elif text != "one device":
            raise GraphllmError(f"timing record: cannot read the strategy {text!r}")
    return Strategy(**kw)


def measured_step(step: dict[str, Any]) -> dict[str, float]:
    """One rank's step record as seconds per kind: compute (segments, and cut points that are
    local work such as shard_slice), each collective op, and the step's wall time."""
    out: dict[str, float] = defaultdict(float)
    out[COMPUTE] = step["compute_seconds"]
    for c in step["collectives"]:
        kind = c["kind"] if OPS[c["kind"]].category == COMMUNICATION else COMPUTE
        out[kind] += c["seconds"]
    out[STEP] = step["seconds"]
    return dict(out)


def predicted_step(
    config: ModelConfig,
    workload: Workload,
    strategy: Strategy,
    hw: Hardware,
    attention: str,
    mla: str = "naive",
) -> tuple[Graph, dict[str, Any]]:
    """The partitioned program of one step and its partition report (a dict) on `hw`."""
    graph = partition(build_graph(config, workload, mla=mla), strategy, hw)
    return graph, partition_report(graph, hw, attention).to_dict()


def predicted_seconds(
    graph: Graph, report: dict[str, Any], hw: Hardware
) -> tuple[dict[int, dict[str, float]], dict[int, dict[str, float]]]:
    """Per pipeline stage, the predicted seconds of a step per kind (as `measured_step`): the
    stage's compute, each collective op of its nodes (a recv at its send's time, as the partition
    report times it on the peer), and the pipeline's step time; and per stage and collective
    op, its median call."""
    plan = graph.meta["partition"]
    m = plan.strategy.microbatches
    out: dict[int, dict[str, float]] = {}
    calls: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for st in report["stages"]:
        out[st["stage"]] = {COMPUTE: st["compute_seconds"]}
    for n in graph.nodes():
        spec = OPS[n.op]
        if spec.category != COMMUNICATION:
            continue
        timed = graph[n.inputs[0].node] if spec.timed_on_peer else n
        st = meta_result(n, "stage")
        seconds = comm_seconds(graph, timed, plan.mesh, hw)
        out[st][n.op] = out[st].get(n.op, 0.0) + m * seconds
        calls[st][n.op].append(seconds)
    step = report["pipeline"]["step_seconds"]
    for figures in out.values():
        figures[STEP] = step
    medians = {st: {k: statistics.median(v) for k, v in by.items()} for st, by in calls.items()}
    return out, medians


def _median_steps(steps: list[dict[str, float]]) -> dict[str, float]:
    kinds = dict.fromkeys(k for s in steps for k in s)
    return {k: statistics.median(s.get(k, 0.0) for s in steps) for k in kinds}


def _representative(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The step whose past length is the median of its kind's (decode's middle step)."""
    ordered = sorted(steps, key=lambda s: s["past_len"])
    return ordered[(len(ordered) - 1) // 2]


def compare(
    config: ModelConfig,
    ranks: list[dict[str, Any]],
    hw: Hardware,
    *,
    batch: int = 1,
    attention: str = "flash",
    cores: int | None = None,
    mla: str = "naive",
) -> dict[str, Any]:
    """The measured-beside-predicted document of a run: rows per step kind, rank and kind, the
    ratios per step kind and collective kind (over ranks: the median), and notes."""
    if not ranks or not all(r["steps"] for r in ranks):
        raise GraphllmError("measured beside predicted: the run recorded no steps")
    cores = cores or _cores()
    rows: list[Row] = []
    predictions: dict[str, tuple[Graph, dict[str, Any]]] = {}
    for kind in KINDS:
        first = [s for s in ranks[0]["steps"] if step_kind(s["step"]) == kind]
        if not first:
            continue
        rep = _representative(first)
        wl = Workload(batch=batch, seq_len=rep["seq_len"], past_len=rep["past_len"], dtype="fp32")
        strategy = strategy_of(rep["strategy"])
        graph, report = predicted_step(config, wl, strategy, hw, attention, mla)
        predictions[kind] = (graph, report)
        predicted, per_call = predicted_seconds(graph, report, hw)
        last = _last_arrivals(graph, ranks)
        for r in ranks:
            stage = r["coords"].get("pp", 0)
            want = (predicted[stage], per_call.get(stage, {}))
            rows += _rank_rows(kind, r, graph, want, last)
    return {
        "hardware": hw.name,
        "ranks": len(ranks),
        "cores": cores,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "rows": [
            asdict(r) | {"ratio": r.ratio, "call_ratio": r.call_ratio, "last_ratio": r.last_ratio}
            for r in rows
        ],
        "ratios": ratios(rows),
        "call_ratios": ratios(rows, "call_ratio"),
        "last_ratios": ratios(rows, "last_ratio"),
        "notes": notes(len(ranks), cores, hw, ranks),
        "_predictions": predictions,  # for the trace; dropped from the JSON (`public`)
    }


def _rank_rows(
    kind: str,
    r: dict[str, Any],
    graph: Graph,
    want: tuple[dict[str, float], dict[str, float]],
    last: dict[tuple, float],
) -> list[Row]:
    """Rank `r`'s rows for one step kind: each kind of time measured (the median over its
    steps) beside `want` (the stage's predicted seconds by kind, and a call's), with a
    collective's median call and median last arrival among its ranks."""
    records = [s for s in r["steps"] if step_kind(s["step"]) == kind]
    got = _median_steps([measured_step(s) for s in records])
    want_seconds, want_call = want
    rows = []
    for k in sorted(set(got) | set(want_seconds), key=_order):
        mine = [(s, c) for s in records for c in s["collectives"] if c["kind"] == k]
        call = statistics.median(c["seconds"] for _, c in mine) if mine else None
        least = (
            statistics.median(last[_call_key(graph, r, s, c)] for s, c in mine) if mine else None
        )
        row = Row(kind, r["rank"], k, got.get(k, 0.0), want_seconds.get(k, 0.0))
        rows.append(
            replace(row, measured_call=call, predicted_call=want_call.get(k), last_call=least)
        )
    return rows


def _call_key(graph: Graph, r: dict[str, Any], step: dict[str, Any], c: dict[str, Any]) -> tuple:
    """What names one call of a collective on all its ranks: the step, the node (a recv: its
    send), the microbatch, and the ranks' coordinates off the collective's mesh axis."""
    node = c["node"]
    if node in graph and OPS[c["kind"]].timed_on_peer:
        node = graph[node].inputs[0].node
    group = tuple(sorted((k, v) for k, v in r["coords"].items() if k != c["mesh_axis"]))
    return (step["step"], node, c["microbatch"], group)


def _last_arrivals(graph: Graph, ranks: list[dict[str, Any]]) -> dict[tuple, float]:
    """Per call (`_call_key`), the least seconds any of its ranks took: the last to arrive's."""
    out: dict[tuple, float] = {}
    for r in ranks:
        for s in r["steps"]:
            for c in s["collectives"]:
                key = _call_key(graph, r, s, c)
                out[key] = min(out.get(key, float("inf")), c["seconds"])
    return out


def _order(kind: str) -> tuple[int, str]:
    return ({COMPUTE: 0, STEP: 2}.get(kind, 1), kind)


def ratios(rows: list[Row], which: str = "ratio") -> dict[str, dict[str, float]]:
    """Per step kind, per kind: the median over ranks of a row's `which` ratio (where it has one:
    `ratio`, the step's seconds; `call_ratio`, a collective's median call)."""
    out: dict[str, dict[str, float]] = {}
    for step in KINDS:
        by: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            value = getattr(r, which)
            if r.step == step and value is not None:
                by[r.kind].append(value)
        if by:
            ordered = sorted(by.items(), key=lambda kv: _order(kv[0]))
            out[step] = {k: statistics.median(v) for k, v in ordered}
    return out


def notes(n: int, cores: int, hw: Hardware, ranks: list[dict[str, Any]]) -> list[str]:
    """What a reader must know to read the ratios."""
    out = []
    if n > cores:
        out.append(
            f"{n} ranks on {cores} cores (oversubscribed): a rank's collective time includes "
            "waiting for a core and for the other ranks' compute, so communication reads high "
            "and the ratios are not the link's"
        )
    elif n > 1:
        out.append(f"{n} ranks on {cores} cores: one rank a core")
    if n > 1:
        out.append(
            "a collective's wall time holds its wait for the peers to reach it (gloo's send too "
            "waits for its recv): the first one of a step absorbs the ranks' skew"
        )
    if any(r["coords"].get("pp", 0) > 0 for r in ranks):
        out.append(
            "a later pipeline stage's recv waits for the stages before it to compute: its "
            "measured recv holds that wait, its prediction only the transfer"
        )
    if not hw.links:
        out.append(
            f"hardware {hw.name} has no measured links (graphllm calibrate --link): collectives "
            "are priced at its interconnect's line rate, without latency"
        )
    return out


def public(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` without what only the trace needs (JSON-ready)."""
    return {k: v for k, v in doc.items() if not k.startswith("_")}


def table_lines(doc: dict[str, Any]) -> list[str]:
    """The table as text: one line a step kind, rank and kind; then the ratios and the notes."""
    load = doc["load_average"]
    lines = [
        f"measured beside predicted ({doc['hardware']}; {doc['ranks']} ranks, {doc['cores']} "
        f"cores" + (f", load average {load[0]:.2f}" if load else "") + "). Per step: measured, "
        "predicted, ratio; per collective call (medians): this rank's, the last-arriving "
        "rank's (no wait for peers), predicted, last-arriving / predicted"
    ]
    cols = (
        "step",
        "rank",
        "kind",
        "measured",
        "predicted",
        "ratio",
        "call",
        "last-in",
        "predicted",
        "ratio",
    )
    widths = (8, 4, 12, 11, 11, 7, 10, 10, 10, 7)
    lines.append(_cells(cols, widths))
    for r in doc["rows"]:
        cells = (
            r["step"],
            str(r["rank"]),
            r["kind"],
            _ms(r["measured"]),
            _ms(r["predicted"]),
            _x(r["ratio"]),
            _ms(r["measured_call"]),
            _ms(r["last_call"]),
            _ms(r["predicted_call"]),
            _x(r["last_ratio"]),
        )
        lines.append(_cells(cells, widths))
    for title, key in (("per step", "ratios"), ("per call, last-arriving", "last_ratios")):
        for step, by in doc[key].items():
            got = ", ".join(f"{k} {v:.2f}" for k, v in by.items())
            lines.append(f"{step} measured/predicted {title} (median over ranks): {got}")
    lines += [f"note: {n}" for n in doc["notes"]]
    return lines


def _cells(cells: tuple[str, ...], widths: tuple[int, ...]) -> str:
    # step and kind read left to right; the rank and the figures line up on the right
    return " ".join(
        f"{c:{'<' if i in (0, 2) else '>'}{w}s}" for i, (c, w) in enumerate(zip(cells, widths))
    )


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# -- the trace: predicted lanes beside measured ones --------------------------------------------
MEASURED_PID = 1 << 20  # measured ranks' processes, after every predicted device's


def trace(doc: dict[str, Any], ranks: list[dict[str, Any]], hw: Hardware) -> dict[str, Any]:
    """The partition report's Perfetto trace of each step kind (prefill; decode: its median
    step), each drawn from the measured start of that kind's first step, beside one measured
    process a rank: its compute segments and its collectives at their real start and length."""
    events: list[dict[str, Any]] = []
    starts = _step_starts(ranks)
    for kind, (graph, report) in doc["_predictions"].items():
        predicted = chrome_trace(graph, report, hw)
        t0 = starts.get(kind, 0.0)
        for e in predicted["traceEvents"]:
            e = dict(e)
            if e["ph"] == "X":
                e["ts"] += t0 * US
                e["args"] = {**e["args"], "step": kind}
            elif e["name"] == "process_name":
                e["args"] = {"name": f"predicted {e['args']['name']}"}
            elif e["name"] == "process_sort_index":
                e["args"] = {"sort_index": 2 * e["pid"]}
            events.append(e)
    for r in ranks:
        events += _measured_lanes(r)
    return {
        "traceEvents": _dedupe_meta(events),
        "displayTimeUnit": "ms",
        "otherData": {k: v for k, v in public(doc).items() if k != "rows"},
    }


def _step_starts(ranks: list[dict[str, Any]]) -> dict[str, float]:
    """Per step kind, the earliest start of its first step over the ranks."""
    out: dict[str, float] = {}
    for r in ranks:
        seen: set[str] = set()
        for s in r["steps"]:
            kind = step_kind(s["step"])
            times = [x["start"] for x in s["segments"] + s["collectives"]]
            if kind in seen or not times:
                continue
            seen.add(kind)
            out[kind] = min(out.get(kind, float("inf")), min(times))
    return out


def _measured_lanes(r: dict[str, Any]) -> list[dict[str, Any]]:
    pid = MEASURED_PID + r["rank"]
    where = ", ".join(f"{k} {v}" for k, v in r["coords"].items())  # the mesh's axes over 1
    label = f"measured rank {r['rank']}" + (f": {where}" if where else "")
    events = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}},
        {
            "name": "process_sort_index",
            "ph": "M",
            "pid": pid,
            "tid": 0,
            "args": {"sort_index": 2 * r["rank"] + 1},
        },
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "compute"}},
        {"name": "thread_name", "ph": "M", "pid": pid, "tid": 1, "args": {"name": "communication"}},
    ]
    for s in r["steps"]:
        for seg in s["segments"]:
            args = {"step": s["step"], "microbatch": seg["microbatch"], "nodes": seg["nodes"]}
            events.append(_span(f"segment {seg['segment']}", "compute", seg, pid, 0, args))
        for c in s["collectives"]:
            args = {
                "step": s["step"],
                "bytes": c["bytes"],
                "group_size": c["group_size"],
                "mesh_axis": c["mesh_axis"],
                "microbatch": c["microbatch"],
            }
            lane = 1 if OPS[c["kind"]].category == COMMUNICATION else 0
            events.append(_span(c["node"], "measured " + c["kind"], c, pid, lane, args))
    return events


def _span(name: str, cat: str, t: dict[str, Any], pid: int, tid: int, args: dict) -> dict:
    return {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": t["start"] * US,
        "dur": t["seconds"] * US,
        "pid": pid,
        "tid": tid,
        "args": args,
    }


def _dedupe_meta(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Metadata events once each (both step kinds' predicted traces name the same devices)."""
    seen, out = set(), []
    for e in events:
        if e["ph"] == "M":
            key = (e["name"], e["pid"], e["tid"])
            if key in seen:
                continue
            seen.add(key)
        out.append(e)
    return out
