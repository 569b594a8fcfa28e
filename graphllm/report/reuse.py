"""trace's analyses on one layer of each kind, stood in for every layer (issue 20).

The layers of a model repeat: `plan.reduced_config` keeps one layer of each kind (the values of
the per-layer config fields). Its graph is built and analysed as the full one would be, then its
node sequence is unrolled to the full model's: each real layer runs its kind's nodes with the
layer index substituted in their names, its residual input the previous real layer's output. The
reports are rolled up over that sequence by the passes' own roll-up code (cost.roll_up,
roofline.time_all, params.tally, memory.walk_peak, tokens.step), in the full graph's order, so
that the float sums and the first-seen orders are the full analysis's to the last bit
(tests/report/test_reuse.py). The token sets are propagated layer by layer as the pass does,
a layer whose inputs' sets were seen before on a layer of its kind reusing that layer's result.

What needs the real graph (render, export, partition, --per-op, --print-graph) builds it.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphllm.ir import Graph, Node
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload, nbytes
from graphllm.ops import OPS, SOURCE
from graphllm.passes import tokens as tk
from graphllm.passes.attention_region import core_attention_region
from graphllm.passes.cost import layer_of, layer_scopes, roll_up, scopes_of
from graphllm.passes.memory import (
    MemoryReport,
    _full_attention_bytes,
    _kept_bytes,
    _stateful_as_attention,
    cache_bytes,
    walk_peak,
)
from graphllm.passes.parallel.plan import reduced_config
from graphllm.passes.params import tally
from graphllm.passes.roofline import Timer, _core, time_all
from graphllm.passes.stored import param_bytes
from graphllm.report.trace_report import analysed, document, trace_report


@dataclass
class Unrolled:
    """The full model's node sequence, each node standing for itself in the reduced graph."""

    small: Graph
    names: list[str]  # full names, in the full graph's order
    reps: list[Node]  # the reduced graph's node each stands for
    inputs: list[list[str]]  # full names of each node's inputs
    layer: list[int | None]  # the real layer each belongs to (None: before or after them)
    scopes: list[list[tuple[str, str]]]  # each node's (prefix, kind) scopes, renamed
    outputs: list[tuple[str, Any, str]]  # (full output name, the reduced Ref, full node name)
    blocks: list[str]  # each real layer's output, full names
    index: list[int]  # each real layer's reduced layer


_SPLITS: dict[int, dict[str, tuple[str, str] | None]] = {}  # by layer: name -> around it


def _renamer(r: int, i: int) -> Callable[[str], str]:
    """Reduced layer r's names as real layer i's: the first dotted component `r` (the layer
    index) becomes `i`."""
    idx = str(i)
    table = _SPLITS.get(r)
    if table is None or len(table) > 100_000:
        table = _SPLITS[r] = {}
    pat = re.compile(rf"(?<=\.){r}(?=\.|$)")

    def rename(name: str) -> str:
        parts = table.get(name, False)
        if parts is False:
            m = pat.search(name)
            parts = table[name] = (name[: m.start()], name[m.end() :]) if m else None
        return name if parts is None else parts[0] + idx + parts[1]  # type: ignore[index]

    return rename


def unroll(small: Graph, index: list[int]) -> Unrolled | None:
    """The full sequence of `small` (one layer of each kind) for real layers of reduced index
    `index`; None where a layer reads another layer's nodes other than its predecessor's output
    (a value residual, shared KV), which one layer cannot stand for."""
    blocks = list(small.meta.get("blocks", ()))
    nodes = list(small.nodes())
    if len(blocks) != len(set(index)) or not nodes:
        return None
    seg_of: dict[str, int] = {}
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    where = {b: j for j, b in enumerate(blocks)}
    scopes = layer_scopes(small)
    if len(scopes) != len(blocks):
        return None
    pos = {p: j for j, p in enumerate(scopes)}
    for k, n in enumerate(nodes):
        lay = layer_of(small, n.name)
        if lay:
            r = pos[lay]
            first.setdefault(r, k)
            last[r] = k
    if sorted(first) != list(range(len(blocks))) or any(where.get(blocks[r]) != r for r in first):
        return None
    starts = [first[r] for r in range(len(blocks))]
    ends = [last[r] for r in range(len(blocks))]
    if any(starts[r + 1] <= ends[r] for r in range(len(blocks) - 1)):
        return None
    for r in range(len(blocks)):
        for n in nodes[starts[r] : ends[r] + 1]:
            seg_of[n.name] = r
    pre = nodes[: starts[0]]
    post = nodes[ends[-1] + 1 :]
    # the residual stream entering layer 0: the last op before it that it reads
    read0 = {x.node for n in nodes[starts[0] : ends[0] + 1] for x in n.inputs}
    stream0 = next((n.name for n in reversed(pre) if n.name in read0 and _computes(n)), None)
    later = {x.node for n in nodes[ends[0] + 1 :] for x in n.inputs}
    if stream0 is None or stream0 in later:
        # a later layer reading the embedding's output too (a skip from it): its layer 0 read
        # and the stream could not be told apart
        return None

    u = Unrolled(small, [], [], [], [], [], [], [], index)
    seen: set[str] = set()
    full_block: list[str] = []
    renamed: dict[tuple, list[tuple[str, str]]] = {}
    # each reduced node's scopes once, equal ones one object: renamed keys on its id
    scopes_by_node: dict[int, tuple] = {}
    interned: dict[tuple, tuple] = {}

    def stream_in(i: int) -> str:
        return stream0 if i == 0 else full_block[i - 1]

    def emit(n: Node, name: str, ins: list[str], layer: int | None, rename: Any) -> None:
        seen.add(name)
        u.names.append(name)
        u.reps.append(n)
        u.inputs.append(ins)
        u.layer.append(layer)
        sc = scopes_by_node.get(id(n))
        if sc is None:
            t = tuple(scopes_of(small, n.name))
            sc = scopes_by_node[id(n)] = interned.setdefault(t, t)
        hit = renamed.get((layer, id(sc)))
        if hit is None:  # the nodes of one module share their scopes
            hit = renamed[(layer, id(sc))] = [(rename(p), k) for p, k in sc]
        u.scopes.append(hit)

    def same(x: str) -> str:
        return x

    for n in pre:
        emit(n, n.name, [x.node for x in n.inputs], None, same)
    for i, r in enumerate(index):
        rename = _renamer(r, i)
        prev = blocks[r - 1] if r > 0 else stream0
        for n in nodes[starts[r] : ends[r] + 1]:
            name = rename(n.name)
            if name in seen:  # a shared input made on first use belongs to no layer
                if name != n.name:
                    return None
                continue
            ins = []
            for x in n.inputs:
                s = seg_of.get(x.node)
                if x.node == prev:
                    ins.append(stream_in(i))
                elif s == r:
                    ins.append(rename(x.node))
                elif s is None and x.node != stream0:
                    ins.append(x.node)
                elif rename(x.node) == x.node and x.node in seen:
                    ins.append(x.node)  # a shared input another layer made
                else:
                    return None
            emit(n, name, ins, i, rename)
        full_block.append(rename(blocks[r]))
    for n in post:
        ins = []
        for x in n.inputs:
            s = seg_of.get(x.node)
            if x.node == blocks[-1]:
                ins.append(full_block[-1])
            elif s is None and x.node != stream0:
                ins.append(x.node)
            else:
                return None
        emit(n, n.name, ins, None, same)
    u.blocks = full_block

    # outputs: those before the layers, each layer's, those after, in the reduced graph's order
    by_seg: dict[int | None, list[tuple[str, Any]]] = {}
    for key, ref in small.outputs.items():
        by_seg.setdefault(seg_of.get(ref.node), []).append((key, ref))
    if any(
        s is None and ref.node in {n.name for n in pre} for s, v in by_seg.items() for _, ref in v
    ):
        return None
    for i, r in enumerate(index):
        rename = _renamer(r, i)
        u.outputs += [(rename(k), ref, rename(ref.node)) for k, ref in by_seg.get(r, [])]
    u.outputs += [(k, ref, ref.node) for k, ref in by_seg.get(None, [])]
    return u


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
    if mtp:
        return None
    small_cfg, index = reduced_config(config)
    if small_cfg is config:
        return None
    small, res = analysed(small_cfg, workload, hardware, attention, training, mla, mtp)
    u = unroll(small, index)
    if u is None:
        return None
    scopes = dict(zip(u.names, u.scopes, strict=True))
    cost = roll_up(
        ((name, n.op, n.meta["cost"]) for name, n in zip(u.names, u.reps, strict=True)),
        scopes.__getitem__,
        attention,
        training,
    )
    roof = None
    if hardware is not None:
        timer = Timer(small, hardware, attention == "flash")
        base: dict[int, tuple[float, float, bool]] = {}

        cores: dict[int, str | None] = {}  # by the scopes' list, which a module's ops share

        def timings() -> Any:
            for name, n, sc in zip(u.names, u.reps, u.scopes, strict=True):
                b = base.get(id(n))
                if b is None:
                    b = base[id(n)] = timer.base(n, n.meta["cost"], scopes_of(small, n.name))
                core = cores.get(id(sc), False)
                if core is False:
                    core = cores[id(sc)] = _core(sc)
                yield name, n.op, *b, core, sc

        roof = time_all(timings(), timer, small.meta["workload"], training, lambda *_: None)
    in_mtp = {
        n.name for n in small.params() if any(k == "mtp" for _, k in scopes_of(small, n.name))
    }
    params = tally(
        (n for n in u.reps if n.op == "param"),
        small.meta["config"],
        {name for name, n in zip(u.names, u.reps, strict=True) if n.name in in_mtp},
    )
    memory = _memory(u, attention)
    tokens = _tokens(u, res["tokens"])
    if tokens is None:
        return None
    graph = {
        "nodes": len(u.names),
        "edges": sum(len(x) for x in u.inputs),
        "ops": dict(Counter(n.op for n in u.reps)),
        "inputs": [name for name, n in zip(u.names, u.reps, strict=True) if n.op == "input"],
        "outputs": [k for k, _, _ in u.outputs],
    }
    return document(
        config, workload, attention, training, mla, mtp, graph, params, tokens, cost, memory, roof
    )


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
    for n in u.reps:
        if n.op != "param":
            continue
        nb = param_bytes(n, b)
        weights += nb
        by_dtype[n.out.dtype] = by_dtype.get(n.out.dtype, 0.0) + nb
        experts = n.attrs.get("stacked") == "expert"
        active += nb * cfg.num_experts_per_tok / cfg.num_experts if experts and cfg else nb
    cache = [(k, ref) for k, ref, _ in u.outputs if _role(g, ref, "cache")]
    presents: dict[str, Any] = {}
    for k, ref in cache:
        presents.setdefault(k, ref)
    kv = sum(cache_bytes(g, g.type_of(r)) for r in presents.values())
    full = sum(_full_attention_bytes(g, g.type_of(r)) for r in presents.values())
    kept = sum(_kept_bytes(g, _reduced_key(g, r), r) for _, r in cache)
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
    g = u.small
    n, exact = small.positions, small.exact
    b = g.bindings
    letters: dict[int, tuple] = {}
    narrower: dict[Any, Any] = {}
    names, reps, inputs, layer = u.names, u.reps, u.inputs, u.layer
    # what each layer's nodes give to later nodes
    read_later: set[str] = set()
    where = {name: layer[k] for k, name in enumerate(names)}
    for k, ins in enumerate(inputs):
        for x in ins:
            if where.get(x) is not None and where[x] != layer[k]:
                read_later.add(x)
    logits = next(node for key, _, node in u.outputs if key == "logits")
    read_later.add(logits)
    blocks = set(u.blocks)
    info: dict[str, Any] = {}
    reach: dict[str, tuple[int, int]] = {}
    memo: dict[Any, dict[str, Any]] = {}

    def one(k: int) -> Any:
        node = reps[k]
        lt = None
        if OPS[node.op].category != SOURCE:
            lt = letters.get(id(node))
            if lt is None:
                lt = letters[id(node)] = tk.position_letters(g, node)
        out = tk.step(node, [info[x] for x in inputs[k]], lt, n, exact, b, narrower)
        if names[k] in blocks and isinstance(out, tk._One):
            reach[names[k]] = out.deps.extent(n - 1)
        info[names[k]] = out
        return out

    k = 0
    total = len(names)
    while k < total:
        lay = layer[k]
        if lay is None:
            one(k)
            k += 1
            continue
        end = k
        while end < total and layer[end] == lay:
            end += 1
        inside = set(names[k:end])
        outside = list(
            dict.fromkeys(x for j in range(k, end) for x in inputs[j] if x not in inside)
        )
        key = (u.index[lay], tuple(_fingerprint(info[x]) for x in outside))
        hit = memo.get(key)
        rename = _renamer(u.index[lay], lay)
        if hit is None:
            for j in range(k, end):
                one(j)
            hit = memo[key] = {
                reps[j].name: (info[names[j]], reach.get(names[j]))
                for j in range(k, end)
                if names[j] in read_later or names[j] in blocks
            }
        else:
            for j in range(k, end):
                got = hit.get(reps[j].name)
                if got is not None and rename(reps[j].name) == names[j]:
                    info[names[j]] = got[0]
                    if got[1] is not None:
                        reach[names[j]] = got[1]
        for j in range(k, end):  # a layer's own sets are not read after it
            if names[j] not in read_later:
                info.pop(names[j], None)
        k = end
    out = info.get(logits)
    if not isinstance(out, tk._One):
        return None
    mixing = [(name, node.op) for name, node in zip(names, reps, strict=True)]
    mixing = [(name, op) for (name, op), node in zip(mixing, reps, strict=True)
              if small.verdicts[node.name].mixes]  # fmt: skip
    per_layer = [
        {"layer": i, "reach": reach[name][0], "first": reach[name][1]}
        for i, name in enumerate(u.blocks)
        if name in reach
    ]
    verdicts = {name: small.verdicts[node.name] for name, node in zip(names, reps, strict=True)}
    return tk.TokenReport(verdicts, mixing, exact, n, small.past, out.deps, per_layer)
