"""trace's analyses on one layer of each kind, stood in for every layer.

The layers of a model repeat: `plan.reduced_config` keeps one layer of each kind (the values of
the per-layer config fields). Its graph is built and analysed as the full one would be, then its
node sequence is unrolled to the full model's: each real layer runs its kind's nodes with the
layer index substituted in their names, its residual input the previous real layer's output.
The cost and roofline reports are tallies (cost.CostTally, roofline.TimeTally) whose float sums
are correctly rounded (math.fsum) and so do not depend on the order of their addends: each run
of the sequence (what comes before the layers, each layer, what comes after) is tallied once per
kind of run and its tally added for every run of that kind. The params, memory and token
figures walk the sequence with the passes' own code (params.tally, memory.walk_peak, whose sums
of whole bytes are exact in any order, tokens.step). Either way the document is the full
analysis's to the last bit (tests/report/test_reuse.py). The token sets are propagated layer by
layer as the pass does, a layer whose inputs' sets were seen before on a layer of its kind
reusing that layer's result.

What needs the real graph (render, export, partition, --per-op, --print-graph) builds it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphllm.frontends import is_traced, model_graph
from graphllm.ir import Graph, Node, Ref
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload, nbytes
from graphllm.ops import OPS, SOURCE
from graphllm.passes import tokens as tk
from graphllm.passes.attention_region import core_attention_region
from graphllm.passes.cost import CostReport, CostTally, layer_of, layer_scopes, scopes_of
from graphllm.passes.memory import (
    MemoryReport,
    _full_attention_bytes,
    _kept_bytes,
    _stateful_as_attention,
    cache_bytes,
    walk_peak,
)
from graphllm.passes.parallel.plan import reduced_config
from graphllm.passes.params import ParamReport, tally
from graphllm.passes.registry import Results
from graphllm.passes.roofline import (
    RooflineReport,
    Timer,
    TimeTally,
    Timing,
    _core,
    step_bandwidth,
)
from graphllm.passes.stored import param_bytes
from graphllm.report.reduced import reduced_traced, same_nodes
from graphllm.report.trace_report import analysed, analyses, document, trace_report


@dataclass
class Unrolled:
    """The full model's node sequence, each node standing for itself in the reduced graph."""

    small: Graph
    names: list[str]  # full names, in the full graph's order
    reps: list[Node]  # the reduced graph's node each stands for
    inputs: list[list[str]]  # full names of each node's inputs
    layer: list[int | None]  # the real layer each belongs to (None: before or after them)
    spans: list[tuple[int, int, int | None]]  # (start, end, real layer): the runs of one layer
    outputs: list[tuple[str, Any, str]]  # (full output name, the reduced Ref, full node name)
    blocks: list[str]  # each real layer's output, full names
    index: list[int]  # each real layer's reduced layer


_SPLITS: dict[int, dict[str, tuple[str, str] | None]] = {}  # by layer: name -> around it
_PARTS: dict[int, Callable[[str], tuple[str, str] | None]] = {}  # by layer: reading _SPLITS


def _parts(r: int) -> Callable[[str], tuple[str, str] | None]:
    """A name of reduced layer r cut around its layer index (the first dotted component `r`):
    (before, after), or None for a name without it."""
    table = _SPLITS.get(r)
    if table is not None and len(table) <= 100_000:
        return _PARTS[r]
    table = _SPLITS[r] = {}
    pat = re.compile(rf"(?<=\.){r}(?=\.|$)")

    def parts(name: str) -> tuple[str, str] | None:
        got = table.get(name, False)
        if got is False:
            m = pat.search(name)
            got = table[name] = (name[: m.start()], name[m.end() :]) if m else None
        return got  # type: ignore[return-value]

    _PARTS[r] = parts
    return parts


def _renamer(r: int, i: int) -> Callable[[str], str]:
    """Reduced layer r's names as real layer i's: the first dotted component `r` (the layer
    index) becomes `i`."""
    idx, parts = str(i), _parts(r)

    def rename(name: str) -> str:
        p = parts(name)
        return name if p is None else p[0] + idx + p[1]

    return rename


def unroll(small: Graph, index: list[int]) -> Unrolled | None:
    """The full sequence of `small` (one layer of each kind) for real layers of reduced index
    `index`; None where a layer reads another layer's nodes other than its predecessor's output
    (a value residual, shared KV), which one layer cannot stand for."""
    lo = _layout(small, index)
    if lo is None:
        return None
    u = Unrolled(small, [], [], [], [], [], [], [], index)
    seen: set[str] = set()
    for n in lo.pre:
        _emit(u, seen, n, n.name, [x.node for x in n.inputs], None)
    u.spans.append((0, len(u.names), None))
    if not _unroll_layers(u, lo, seen) or not _unroll_post(u, lo, seen):
        return None
    outputs = _outputs(lo, small, index)
    if outputs is None:
        return None
    u.outputs = outputs
    return u


@dataclass
class _Layout:
    """Where the reduced graph's layers lie in its node order."""

    nodes: list[Node]
    blocks: list[str]  # each reduced layer's output
    starts: list[int]  # each reduced layer's first node
    ends: list[int]  # and its last
    seg_of: dict[str, int]  # the reduced layer of each node inside one
    stream0: str  # the residual stream entering layer 0

    @property
    def pre(self) -> list[Node]:
        return self.nodes[: self.starts[0]]

    @property
    def post(self) -> list[Node]:
        return self.nodes[self.ends[-1] + 1 :]

    def layer(self, r: int) -> list[Node]:
        return self.nodes[self.starts[r] : self.ends[r] + 1]


def _layout(small: Graph, index: list[int]) -> _Layout | None:
    """The reduced graph's layers as runs of its node order, one after another; None where they
    are not (or the graph's blocks and layer scopes disagree)."""
    blocks = list(small.meta.get("blocks", ()))
    nodes = list(small.nodes())
    if len(blocks) != len(set(index)) or not nodes:
        return None
    scopes = layer_scopes(small)
    if len(scopes) != len(blocks):
        return None
    pos = {p: j for j, p in enumerate(scopes)}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, n in enumerate(nodes):
        lay = layer_of(small, n.name)
        if lay:
            r = pos[lay]
            first.setdefault(r, k)
            last[r] = k
    where = {b: j for j, b in enumerate(blocks)}
    if sorted(first) != list(range(len(blocks))) or any(where.get(blocks[r]) != r for r in first):
        return None
    starts = [first[r] for r in range(len(blocks))]
    ends = [last[r] for r in range(len(blocks))]
    if any(starts[r + 1] <= ends[r] for r in range(len(blocks) - 1)):
        return None
    seg_of = {n.name: r for r in range(len(blocks)) for n in nodes[starts[r] : ends[r] + 1]}
    stream0 = _stream0(nodes, starts[0], ends[0], small[blocks[0]].outputs)
    if stream0 is None:
        return None
    return _Layout(nodes, blocks, starts, ends, seg_of, stream0)


def _stream0(nodes: list[Node], start: int, end: int, stream: tuple) -> str | None:
    """The residual stream entering layer 0 (nodes[start:end + 1]): the last op before it that
    it reads of the stream's type (`stream`: the layer's output types; a traced model makes
    its rotary tables after the embedding). None where a later layer reads it too (a skip from
    the embedding): its layer 0 read and the stream could not be told apart."""
    read0 = {x.node for n in nodes[start : end + 1] for x in n.inputs}
    pre = nodes[:start]
    stream0 = next(
        (n.name for n in reversed(pre) if n.name in read0 and _computes(n) and n.outputs == stream),
        None,
    )
    later = {x.node for n in nodes[end + 1 :] for x in n.inputs}
    return None if stream0 is None or stream0 in later else stream0


def _emit(
    u: Unrolled, seen: set[str], n: Node, name: str, ins: list[str], layer: int | None
) -> None:
    seen.add(name)
    u.names.append(name)
    u.reps.append(n)
    u.inputs.append(ins)
    u.layer.append(layer)


_Row = tuple[Node, Any, list[tuple[int, str, Any]]]


def _template(lo: _Layout, r: int) -> list[_Row]:
    """Reduced layer r's nodes, each with its name cut around the layer index and where each
    input comes from: 0 the stream, 1 the layer itself (the name cut), 2 a node outside every
    layer, 3 a shared input another layer made (or, failing that, a read one layer cannot
    stand for)."""
    parts = _parts(r)
    prev = lo.blocks[r - 1] if r > 0 else lo.stream0
    rows = []
    for n in lo.layer(r):
        ins: list[tuple[int, str, Any]] = []
        for x in n.inputs:
            s = lo.seg_of.get(x.node)
            if x.node == prev:
                ins.append((0, x.node, None))
            elif s == r:
                ins.append((1, x.node, parts(x.node)))
            elif s is None and x.node != lo.stream0:
                ins.append((2, x.node, None))
            else:
                ins.append((3, x.node, parts(x.node)))
        rows.append((n, parts(n.name), ins))
    return rows


def _unroll_layers(u: Unrolled, lo: _Layout, seen: set[str]) -> bool:
    """Every real layer's nodes onto `u`, its kind's with the index substituted; False where a
    layer reads what one layer cannot stand for."""
    templates: dict[int, list[_Row]] = {}
    add_seen, add_name, add_rep, add_ins, add_layer = (
        seen.add,
        u.names.append,
        u.reps.append,
        u.inputs.append,
        u.layer.append,
    )
    for i, r in enumerate(u.index):
        rows = templates.get(r)
        if rows is None:
            rows = templates[r] = _template(lo, r)
        idx, same = str(i), str(i) == str(r)
        stream = lo.stream0 if i == 0 else u.blocks[i - 1]
        start = len(u.names)
        for n, cut, ins_of in rows:
            name = n.name if cut is None else cut[0] + idx + cut[1]
            if name in seen:  # a shared input made on first use belongs to no layer
                if name != n.name:
                    return False
                continue
            ins = []
            for where, x, xcut in ins_of:
                if where == 0:
                    ins.append(stream)
                elif where == 2:
                    ins.append(x)
                elif where == 1:
                    ins.append(x if xcut is None else xcut[0] + idx + xcut[1])
                elif (xcut is None or same) and x in seen:
                    ins.append(x)  # a shared input another layer made
                else:
                    return False
            add_seen(name)  # _emit, inlined: the loop runs for every node of the model
            add_name(name)
            add_rep(n)
            add_ins(ins)
            add_layer(i)
        u.blocks.append(_renamer(r, i)(lo.blocks[r]))
        u.spans.append((start, len(u.names), i))
    return True


def _unroll_post(u: Unrolled, lo: _Layout, seen: set[str]) -> bool:
    """The nodes after the layers onto `u`, reading the last real layer's output; False where
    one reads inside a layer."""
    start = len(u.names)
    for n in lo.post:
        ins = []
        for x in n.inputs:
            if x.node == lo.blocks[-1]:
                ins.append(u.blocks[-1])
            elif lo.seg_of.get(x.node) is None and x.node != lo.stream0:
                ins.append(x.node)
            else:
                return False
        _emit(u, seen, n, n.name, ins, None)
    u.spans.append((start, len(u.names), None))
    return True


def _outputs(lo: _Layout, small: Graph, index: list[int]) -> list[tuple[str, Any, str]] | None:
    """The full graph's outputs: those before the layers, each layer's, those after, in the
    reduced graph's order; None where one is made before the layers."""
    by_seg: dict[int | None, list[tuple[str, Any]]] = {}
    for key, ref in small.outputs.items():
        by_seg.setdefault(lo.seg_of.get(ref.node), []).append((key, ref))
    pre = {n.name for n in lo.pre}
    if any(s is None and ref.node in pre for s, v in by_seg.items() for _, ref in v):
        return None
    out = []
    for i, r in enumerate(index):
        rename = _renamer(r, i)
        out += [(rename(k), ref, rename(ref.node)) for k, ref in by_seg.get(r, [])]
    out += [(k, ref, ref.node) for k, ref in by_seg.get(None, [])]
    return out


def _computes(n: Node) -> bool:
    return OPS[n.op].category != SOURCE


def reused_report(
    config: ModelConfig,
    workload: Workload,
    hardware: Hardware | None = None,
    attention: str = "flash",
    training: bool = False,
    mla: str = "naive",
    mtp: bool = False,
) -> dict[str, Any] | None:
    """trace_report's document from one layer of each kind; None where that cannot stand for
    the full graph (the caller analyses the full graph then)."""
    got = _reused(config, workload, hardware, attention, training, mla, mtp)
    if got is None:
        return None
    u, res = got
    reports = (res[k] for k in ("params", "tokens", "cost", "memory", "roofline"))
    return document(config, workload, attention, training, mla, mtp, _graph_section(u), *reports)


def reused_results(
    config: ModelConfig,
    workload: Workload,
    hardware: Hardware | None = None,
    attention: str = "flash",
    training: bool = False,
    mla: str = "naive",
    mtp: bool = False,
    exact_sets: bool | None = None,
) -> Results | None:
    """{pass: report}, as `passes.run` gives trace's analyses on the full graph, from one layer
    of each kind; None where that cannot stand for the full graph."""
    got = _reused(config, workload, hardware, attention, training, mla, mtp, exact_sets)
    return None if got is None else got[1]


def _reused(
    config: ModelConfig,
    workload: Workload,
    hardware: Hardware | None,
    attention: str,
    training: bool,
    mla: str,
    mtp: bool,
    exact_sets: bool | None = None,
) -> tuple[Unrolled, Results] | None:
    """The unrolled sequence and the reports of trace's analyses over it."""
    if mtp:
        return None
    got = _reduced(config, workload, hardware, attention, training, mla, exact_sets)
    if got is None:
        return None
    small, index, res, full = got
    u = unroll(small, index)
    if u is None or (full is not None and not _gives_back(u, full)):
        return None
    tokens = _tokens(u, res["tokens"])
    if tokens is None:
        return None
    out = Results(verify={"nodes": len(u.names), "edges": sum(map(len, u.inputs))})
    out["params"] = _params(u)
    out["tokens"] = tokens
    out["cost"] = _cost(u, attention, training)
    out["memory"] = _memory(u, attention)
    out["roofline"] = _roofline(u, hardware, attention, training) if hardware is not None else None
    return u, out


def _reduced(
    config: Any,
    workload: Workload,
    hardware: Hardware | None,
    attention: str,
    training: bool,
    mla: str,
    exact_sets: bool | None,
) -> tuple[Graph, list[int], Results, Graph | None] | None:
    """The graph of one layer of each kind, each real layer's index in it, the analyses of it,
    and (a traced model's, cut from it) the full graph its unrolling must give back."""
    if not is_traced(config):
        small_cfg, index = reduced_config(config)
        if small_cfg is config:
            return None
        args = (workload, hardware, attention, training, mla, False, exact_sets)
        small, res = analysed(small_cfg, *args)
        return small, index, res, None
    full = model_graph(config, workload, mla=mla)  # refuses a form the trace cannot give
    cut = reduced_traced(full)
    if cut is None:
        return None
    res = analyses(cut[0], hardware, attention, training, exact_sets)
    return cut[0], cut[1], res, full


def _gives_back(u: Unrolled, full: Graph) -> bool:
    """Whether `u` is `full` node for node and output for output (its outputs then put in the
    full graph's order, which a traced model's lowering chose)."""
    order = {k: i for i, k in enumerate(full.outputs)}
    if not same_nodes(full, u.names, u.reps, u.inputs):
        return False
    if set(order) != {k for k, _, _ in u.outputs}:
        return False
    for key, ref, node in u.outputs:  # each output the same tensor, in the same role
        role = u.small.output_roles.get(_reduced_key(u.small, ref))
        if full.outputs[key] != Ref(node, ref.index) or full.output_roles.get(key) != role:
            return False
    u.outputs.sort(key=lambda o: order[o[0]])
    return True


def _graph_section(u: Unrolled) -> dict[str, Any]:
    return {
        "nodes": len(u.names),
        "edges": sum(len(x) for x in u.inputs),
        "ops": dict(Counter(n.op for n in u.reps)),
        "inputs": [name for name, n in zip(u.names, u.reps, strict=True) if n.op == "input"],
        "outputs": [k for k, _, _ in u.outputs],
    }


def _params(u: Unrolled) -> ParamReport:
    """The params pass over the unrolled sequence."""
    small = u.small
    in_mtp = {
        n.name for n in small.params() if any(k == "mtp" for _, k in scopes_of(small, n.name))
    }
    mtp = {name for name, n in zip(u.names, u.reps, strict=True) if n.name in in_mtp}
    return tally((n for n in u.reps if n.op == "param"), small.meta["config"], mtp)


def _run_keys(u: Unrolled) -> list[tuple]:
    """Each run of `u.spans` by what it holds: a layer's by its kind and its nodes (the first
    layer of a kind may hold a shared input the others read), before and after by place."""
    keys: list[tuple] = []
    for s, e, lay in u.spans:
        kind = ("at", s) if lay is None else ("layer", u.index[lay])
        keys.append((*kind, tuple(map(id, u.reps[s:e]))))
    return keys


def _layer_names(u: Unrolled, lay: int | None) -> Callable[[str], str] | None:
    return None if lay is None else _renamer(u.index[lay], lay)


def _cost(u: Unrolled, attention: str, training: bool) -> CostReport:
    """The cost pass's report over the unrolled sequence: each run's tally once per kind."""
    g = u.small
    made: dict[tuple, CostTally] = {}
    full = CostTally()
    for key, (s, e, lay) in zip(_run_keys(u), u.spans, strict=True):
        t = made.get(key)
        if t is None:
            t = made[key] = CostTally()
            for n in u.reps[s:e]:
                t.add(n.op, n.meta["cost"], scopes_of(g, n.name))
        full.extend(t, _layer_names(u, lay))
    return full.report(attention, training)


def _roofline(u: Unrolled, hardware: Hardware, attention: str, training: bool) -> RooflineReport:
    """The roofline pass's report over the unrolled sequence: each run's tally once per kind."""
    g = u.small
    timer = Timer(g, hardware, attention == "flash")
    wl = g.meta["workload"]
    rows_of: dict[tuple, list[Timing]] = {}
    runs = []
    for key, (s, e, _) in zip(_run_keys(u), u.spans, strict=True):
        rows = rows_of.get(key)
        if rows is None:
            rows = rows_of[key] = []
            for n in u.reps[s:e]:
                sc = scopes_of(g, n.name)
                rows.append((n.name, n.op, *timer.base(n, n.meta["cost"], sc), _core(sc), sc))
        runs.append((key, rows))
    moved = [r[3] for _, rows in runs for r in rows] if hardware.calibration is not None else []
    bw = step_bandwidth(timer, training, moved)
    made: dict[tuple, TimeTally] = {}
    full = TimeTally()
    for key, rows in runs:
        t = made.get(key)
        if t is None:
            t = made[key] = TimeTally()
            t.add(rows, timer, wl, training, bw, None)
        full.extend(t)
    return full.report(timer, wl, training, bw)


def trace_document(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """`trace_report`'s document (of its arguments), analysed on one layer of each kind where
    that stands for the full graph, else on the full graph."""
    doc = reused_report(*args, **kwargs)
    return doc if doc is not None else trace_report(*args, **kwargs)[0]


def _memory(u: Unrolled, attention: str) -> MemoryReport:
    """The memory pass over the unrolled sequence."""
    g = u.small
    b = g.bindings
    cfg = g.meta.get("config")
    weights = active = 0.0
    by_dtype: dict[str, float] = {}
    stored: dict[int, float] = {}  # by node: one stands for the same weight of many layers
    for n in u.reps:
        if n.op != "param":
            continue
        nb = stored.get(id(n))
        if nb is None:
            nb = stored[id(n)] = param_bytes(n, b)
        weights += nb
        by_dtype[n.out.dtype] = by_dtype.get(n.out.dtype, 0.0) + nb
        experts = n.attrs.get("stacked") == "expert"
        active += nb * cfg.num_experts_per_tok / cfg.num_experts if experts and cfg else nb
    cache = [(k, ref) for k, ref, _ in u.outputs if _role(g, ref, "cache")]
    presents: dict[str, Any] = {}
    for k, ref in cache:
        presents.setdefault(k, ref)
    # each reduced output's figures once: it stands for the same output of many layers
    sized = _once(lambda r: cache_bytes(g, g.type_of(r)))
    whole = _once(lambda r: _full_attention_bytes(g, g.type_of(r)))
    kept_of = _once(lambda r: _kept_bytes(g, _reduced_key(g, r), r))
    kv = sum(sized(r) for r in presents.values())
    full = sum(whole(r) for r in presents.values())
    kept = sum(kept_of(r) for _, r in cache)
    held_small = {r.node for r in g.carried_outputs().values()}
    if attention == "flash":
        region = core_attention_region(g)
        held_small |= region.pairs | region.copies
    skip = {name for name, n in zip(u.names, u.reps, strict=True) if n.name in held_small}
    order = list(zip(u.names, u.reps, u.inputs, strict=True))
    peak, at = walk_peak(order, skip, b, [node for _, _, node in u.outputs])
    states = [ref for _, ref, _ in u.outputs if _role(g, ref, "state")]
    state = sum(nbytes(g.type_of(r).dtype, g.type_of(r).numel(b)) for r in states)
    small_layers = set(g.meta.get("state_layers", ()))
    count = sum(1 for r in u.index if r in small_layers)
    full += _stateful_as_attention(g, count)
    return MemoryReport(weights, active, by_dtype, kv, peak, at, full, kept, state)


def _once(f: Callable[[Any], float]) -> Callable[[Any], float]:
    memo: dict[Any, float] = {}

    def once(x: Any) -> float:
        hit = memo.get(x)
        if hit is None:
            hit = memo[x] = f(x)
        return hit

    return once


def _reduced_key(g: Graph, ref: Any) -> str:
    keys = g.meta.get("_output_keys")
    if keys is None or keys[0] != g.version:
        keys = g.meta["_output_keys"] = (g.version, {r: k for k, r in g.outputs.items()})
    return keys[1][ref]


def _role(g: Graph, ref: Any, role: str) -> bool:
    return g.output_roles.get(_reduced_key(g, ref)) == role


def _fingerprint(v: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, tk._One):
        return (1, v.support.tobytes(), _deps_print(v.deps))
    return (
        2,
        v.support.tobytes(),
        _deps_print(v.row),
        _deps_print(v.col),
        v.lo.tobytes(),
        v.hi.tobytes(),
    )


def _deps_print(d: tk.Deps) -> Any:
    return d.m.tobytes() if d.exact else (d.lo.tobytes(), d.hi.tobytes())


def _tokens(u: Unrolled, small: tk.TokenReport) -> tk.TokenReport | None:
    """The tokens pass over the unrolled sequence: verdicts per node from its stand-in, the
    sets propagated layer by layer (a layer of a kind whose inputs' sets were seen before on
    that kind gives that layer's outputs)."""
    runs = [(key, s, e, lay) for key, (s, e, lay) in zip(_run_keys(u), u.spans, strict=True)]
    reads = _outside_reads(u, runs)
    logits = next(node for key, _, node in u.outputs if key == "logits")
    prop = _Propagation(u, small, _read_later(u, runs, reads) | {logits})
    for key, s, e, lay in runs:
        if lay is None:
            for k in range(s, e):
                prop.one(k)
        else:
            prop.layer(key, s, e, [u.inputs[s + j][q] for j, q in reads[key]])
    out = prop.info.get(logits)
    if not isinstance(out, tk._One):
        return None
    g, names, reps = u.small, u.names, u.reps
    mixes = {id(node) for node in g.nodes() if small.verdicts[node.name].mixes}
    mixing = [(name, node.op) for name, node in zip(names, reps, strict=True) if id(node) in mixes]
    reach = prop.reach
    per_layer = [
        {"layer": i, "reach": reach[name][0], "first": reach[name][1]}
        for i, name in enumerate(u.blocks)
        if name in reach
    ]
    verdicts = {name: small.verdicts[node.name] for name, node in zip(names, reps, strict=True)}
    return tk.TokenReport(
        verdicts, mixing, small.exact, small.positions, small.past, out.deps, per_layer
    )


def _outside_reads(u: Unrolled, runs: list[tuple]) -> dict[tuple, list[tuple[int, int]]]:
    """Each layer run's outside inputs, once per kind of run: (node, input) of each name it
    reads from before it, the first time it reads it (a layer's names are its stand-in's,
    renamed)."""
    reads: dict[tuple, list[tuple[int, int]]] = {}
    for key, s, e, lay in runs:
        if lay is not None and key not in reads:
            inside = set(u.names[s:e])
            first: dict[str, tuple[int, int]] = {}
            for j in range(s, e):
                for q, x in enumerate(u.inputs[j]):
                    if x not in inside:
                        first.setdefault(x, (j - s, q))
            reads[key] = list(first.values())
    return reads


def _read_later(u: Unrolled, runs: list[tuple], reads: dict[tuple, list]) -> set[str]:
    """What a layer's nodes give to later nodes: what the later layers and the nodes after them
    read from outside themselves (a name from before the layers too, which no layer drops)."""
    out: set[str] = set()
    for key, s, e, lay in runs:
        if lay is None:
            out.update(x for j in range(s, e) for x in u.inputs[j])
        else:
            out.update(u.inputs[s + j][q] for j, q in reads[key])
    return out


class _Propagation:
    """The tokens pass's sets, node by node in the unrolled order, a layer's outputs reused from
    an earlier layer of its kind whose inputs' sets were the same."""

    def __init__(self, u: Unrolled, small: tk.TokenReport, read_later: set[str]) -> None:
        self.u, self.read_later, self.blocks = u, read_later, set(u.blocks)
        self.n, self.exact = small.positions, small.exact
        self.letters: dict[int, tuple] = {}
        self.narrower: dict[Any, Any] = {}
        self.info: dict[str, Any] = {}
        self.reach: dict[str, tuple[int, int]] = {}
        self.memo: dict[Any, list[tuple[int, Any, Any]]] = {}
        # a layer's inputs are mostly the sets an earlier layer gave (a memo's own objects):
        # each object's fingerprint once, the object held so that its id stays its own
        self.prints: dict[int, tuple[Any, Any]] = {}

    def printed(self, v: Any) -> Any:
        hit = self.prints.get(id(v))
        if hit is None:
            hit = self.prints[id(v)] = (v, _fingerprint(v))
        return hit[1]

    def one(self, k: int) -> Any:
        u, node, name = self.u, self.u.reps[k], self.u.names[k]
        lt = None
        if OPS[node.op].category != SOURCE:
            lt = self.letters.get(id(node))
            if lt is None:
                lt = self.letters[id(node)] = tk.position_letters(u.small, node)
        ins = [self.info[x] for x in u.inputs[k]]
        out = tk.step(node, ins, lt, self.n, self.exact, u.small.bindings, self.narrower)
        if name in self.blocks and isinstance(out, tk._One):
            self.reach[name] = out.deps.extent(self.n - 1)
        self.info[name] = out
        return out

    def layer(self, key: tuple, s: int, e: int, outside: list[str]) -> None:
        """Layer run [s, e) of kind `key`, reading `outside` from before it."""
        names, info, reach = self.u.names, self.info, self.reach
        memo_key = (key, tuple(self.printed(info[x]) for x in outside))
        hit = self.memo.get(memo_key)
        if hit is None:
            for j in range(s, e):
                self.one(j)
            # what it gives later nodes, by its place in the run
            hit = self.memo[memo_key] = [
                (j - s, info[names[j]], reach.get(names[j]))
                for j in range(s, e)
                if names[j] in self.read_later or names[j] in self.blocks
            ]
            for j in range(s, e):  # a layer's own sets are not read after it
                if names[j] not in self.read_later:
                    info.pop(names[j], None)
            return
        for j, got, extent in hit:
            info[names[s + j]] = got
            if extent is not None:
                reach[names[s + j]] = extent
