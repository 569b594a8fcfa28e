"""The interactive report's contents: everything `trace`, `render`, `trace --plot` and
`partition --trace` give, gathered into one JSON-ready dict that exporters.html writes as a page.

The op table has one row per op of each kind of layer (plan.reduced_config's layers), with the
number of layers that run it, instead of one row per op of the model: Llama-3.1-405B's 126 alike
layers are one layer's ~35 rows, not 4,400, so the page stays small and its table fast to sort
and filter without virtual scrolling. The diagrams are drawn once per kind of layer for the same
reason. Everything else (the summary, the breakdowns, the sweep) is the full model's, from the
same functions the terminal commands call.
"""

from __future__ import annotations

import base64
import gzip
import html
import re
from dataclasses import replace
from typing import Any

from graphllm.build.builder import build_graph
from graphllm.exporters.dot import KIND_TITLE, view_dot
from graphllm.exporters.render import svg_text
from graphllm.exporters.trace import chrome_trace, require_traceable
from graphllm.files import json_text
from graphllm.frontends import is_traced, model_graph
from graphllm.ir import Graph
from graphllm.models.hardware import Hardware
from graphllm.models.workload import Workload
from graphllm.passes.cost import layer_of, layer_scopes
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.passes.parallel.plan import reduced_config
from graphllm.passes.training import TrainingOptions
from graphllm.report.fit import fit_section, training_fit_section
from graphllm.report.reuse import trace_document
from graphllm.report.summary import _activations, _b, _n, _t
from graphllm.report.trace_report import analysed, per_op_rows, sweep

ATTENTION_KINDS = ("attention", "linear_attention", "mamba")  # what exporters.dot draws as such
FFN_KINDS = ("mlp", "moe")
TOKENS = 3  # token positions (columns) of the tokens view, as `render --view tokens`
OP_COLUMNS = (
    "name",
    "op",
    "scope",
    "shape",
    "layers",
    "flops",
    "bytes",
    "intensity",
    "seconds",
    "mixing",
)


def default_sweep(seq_len: int) -> list[int]:
    """The T values the sweep chart draws when one --seq-len is given: T/64 ... 4T by fours."""
    return sorted({max(1, seq_len * 4**k // 64) for k in range(5)})


def report_data(
    config: Any,
    workload: Workload,
    hardware: Hardware | None = None,
    strategy: Strategy | None = None,
    training: TrainingOptions | None = None,
    attention: str = "flash",
    mla: str = "naive",
    mtp: bool = False,
    sweep_lens: list[int] | None = None,
    renderer: str | None = None,
) -> dict[str, Any]:
    """The report's contents for one model and workload (and, with `strategy`, its layout)."""
    split = strategy is not None and (strategy.devices > 1 or strategy.microbatches > 1)
    if split and hardware is not None:
        require_traceable(strategy.microbatches, strategy.devices)
    trains = training is not None
    doc = _document(config, workload, hardware, attention, trains, mla, mtp)
    graph = model_graph(config, workload, mla=mla, mtp=mtp)
    kinds = _layer_kinds(config, graph)
    lens = sweep_lens or default_sweep(workload.seq_len)
    points = [replace(workload, seq_len=t) for t in lens]
    rows = sweep(config, points, hardware, attention, trains, mla, mtp)
    data: dict[str, Any] = {
        "title": f"{config.name}: graphllm report",
        "model": {"name": config.name, "model_type": config.model_type},
        "workload": doc["workload"],
        "summary": _summary(doc),
        "params": doc["params"],
        "memory": doc["memory"],
        "roofline": doc["roofline"],
        "fit": doc.get("fit"),
        "breakdown": _breakdown(doc),
        "sweep": [{k: r[k] for k in ("seq_len", "flops", "bytes", "seconds")} for r in rows],
        "op_kinds": _op_kinds(rows[-1], hardware),
        "layers": kinds["index"],
        "kinds": kinds["labels"],
        "ops": _op_table(config, workload, hardware, attention, trains, mla, mtp),
        "diagrams": _diagrams(config, workload, graph, kinds, mla, mtp, renderer),
    }
    if "mla" in doc:
        data["mla"] = doc["mla"]
    if split:
        data["partition"] = _partition(graph, strategy, hardware, attention, training, renderer)
        data["diagrams"] += data["partition"].pop("diagrams")
    return data


def _document(
    config: Any,
    workload: Workload,
    hardware: Hardware | None,
    attention: str,
    training: bool,
    mla: str,
    mtp: bool,
) -> dict[str, Any]:
    """trace's document, with the fit on one device (a built family's: the plan behind it
    enumerates built layouts)."""
    doc = trace_document(config, workload, hardware, attention, training, mla, mtp)
    if is_traced(config):
        return doc
    if hardware is not None and training:
        doc["fit"] = training_fit_section(config, workload, hardware, attention)
    elif hardware is not None:
        doc["fit"] = fit_section(config, workload, hardware, doc["memory"], attention, mla)
    return doc


# -- the layers and their kinds --------------------------------------------------------------
def traced_layer_kinds(graph: Graph) -> list[int]:
    """Each layer's kind in a traced graph, numbered in order of first appearance: layers whose
    modules are alike (classes, parameter shapes, plain attributes) are one kind."""
    reps: dict[str, str] = graph.meta.get("layer_kinds", {})
    order: dict[str, int] = {}
    return [order.setdefault(reps.get(p, p), len(order)) for p in layer_scopes(graph)]


def _layer_kinds(config: Any, graph: Graph) -> dict[str, Any]:
    """Each layer's kind (plan.reduced_config's index, or as the trace recognised it), the
    first layer of each kind, and a label per kind from its sub-layers (`attention + MoE`)."""
    index = traced_layer_kinds(graph) if is_traced(config) else reduced_config(config)[1]
    prefixes = layer_scopes(graph)
    scopes: dict[str, str] = graph.meta.get("scopes", {})
    first: dict[int, int] = {}
    for i, k in enumerate(index):
        first.setdefault(k, i)
    labels = {}
    for k, i in sorted(first.items()):
        p = prefixes[i]
        subs = [
            scopes[s]
            for s in scopes
            if s.startswith(p + ".") and "." not in s[len(p) + 1 :] and scopes[s] != "norms"
        ]
        labels[str(k)] = {
            "label": " + ".join(KIND_TITLE.get(s, s) for s in subs) or "decoder block",
            "first": i,
            "count": sum(1 for x in index if x == k),
        }
    return {"index": list(index), "labels": labels, "first": first}


# -- the summary -------------------------------------------------------------------------------
def _summary(doc: dict[str, Any]) -> list[list[str]]:
    """(label, value) rows, formatted as the terminal's `trace` prints them."""
    w, p, m, r = doc["workload"], doc["params"], doc["memory"], doc.get("roofline")
    rows = [
        ["model", f"{doc['model']['name']} ({doc['model']['model_type']})"],
        [
            "workload",
            f"{w['phase']}, B={w['batch']} T={w['seq_len']} P={w['past_len']} (S={w['key_len']});"
            f" weights {w['weight_dtype']}, activations {_activations(w)}, KV cache "
            f"{w['kv_dtype']}; {w['attention']} attention"
            + ("; forward + backward" if w.get("training") else ""),
        ],
        ["graph", f"{doc['graph']['nodes']:,} nodes, {doc['graph']['edges']:,} edges"],
    ]
    total = p["total"] or 1
    rows += [
        [f"parameters: {kind}", f"{count:,} ({_n(count)}, {100 * count / total:.1f}%)"]
        for kind, count in p["by_kind"].items()
        if count
    ]
    rows += [
        ["parameters: total", f"{p['total']:,} ({_n(p['total'])})"],
        ["parameters: active per token", f"{p['active']:,} ({_n(p['active'])})"],
        [
            "FLOPs",
            f"{_n(doc['flops']['total'])} (matmul {_n(doc['flops']['matmul'])}); bytes moved "
            f"{_b(doc['bytes']['total'])}",
        ],
        [
            "memory",
            f"weights {_b(m['weights'])} (active {_b(m['weights_active'])}), KV cache "
            f"{_b(m['kv_cache'])}, peak activations {_b(m['activations'])}; total "
            f"{_b(m['total'])}",
        ],
        ["KV cache", _b(m["kv_cache"]) + (f" + state {_b(m['state'])}" if m.get("state") else "")],
    ]
    if r:
        rows.append(
            [
                f"roofline on {r['hardware']}",
                f"{_t(r['seconds'])} per step, {r['tokens_per_second']:,.0f} tokens/s ("
                f"{r.get('rate_model', 'ideal')} model)",
            ]
        )
    fit = doc.get("fit")
    if fit:
        what = " for a training step (Adam, fp32 state)" if fit.get("parts") else ""
        text = f"needs {_b(fit['needs'])}{what} of {_b(fit['memory_bytes'])}: " + (
            "fits on one device" if fit["fits"] else "does not fit on one device"
        )
        if not fit["fits"] and fit.get("devices"):
            layout = " ".join(f"{k}={v}" for k, v in fit["layout"].items())
            text += f"; {fit['devices']} devices are the fewest that hold it ({layout})"
        elif not fit["fits"]:
            text += f" ({fit.get('unplanned', '')})"
        rows.append([f"fits {r['hardware'] if r else 'the device'}", text])
    return rows


def _breakdown(doc: dict[str, Any]) -> dict[str, Any]:
    """FLOPs, bytes and time by scope and by op kind (the full model's)."""
    f, b, r = doc["flops"], doc["bytes"], doc.get("roofline") or {}
    return {
        "by_scope": {
            s: {
                "flops": f["by_scope"].get(s, 0),
                "bytes": b["by_scope"].get(s, 0.0),
                "seconds": r.get("by_scope", {}).get(s),
            }
            for s in sorted(set(f["by_scope"]) | set(b["by_scope"]))
        },
        "by_op": {
            op: {"flops": fl, "seconds": r.get("by_op", {}).get(op)}
            for op, fl in sorted(f["by_op"].items())
        },
    }


def _op_kinds(last: dict[str, Any], hw: Hardware | None) -> dict[str, Any]:
    """The roofline chart's points (`trace --plot`'s right panel): each op kind at the sweep's
    last T, and the device's roof."""
    points = [
        {
            "op": op,
            "intensity": e["flops"] / e["bytes"],
            "attained": e["flops"] / e["seconds"],
        }
        for op, e in sorted(last["by_op"].items())
        if e["bytes"] and e["flops"] and e["seconds"]
    ]
    roof = None
    if hw is not None:
        peak, bw = hw.peak(last.get("act_dtype", "bf16")), hw.bandwidth()
        roof = {"name": hw.name, "peak": peak, "bandwidth": bw}
    return {"seq_len": last["seq_len"], "points": points, "roof": roof}


# -- the op table ------------------------------------------------------------------------------
def _op_table(
    config: Any,
    workload: Workload,
    hw: Hardware | None,
    attention: str,
    training: bool,
    mla: str,
    mtp: bool,
) -> dict[str, Any]:
    """One row per op of each kind of layer (and of the ops outside the layers), named as in
    the first layer of its kind, with the number of layers that run it."""
    if is_traced(config):  # the full graph, its layers' kinds as the trace recognised them
        small, res = analysed(config, workload, hw, attention, training, mla, mtp)
        index = traced_layer_kinds(small)
        first_of = {k: i for i, k in reversed(list(enumerate(index)))}
        where = {layer_scopes(small)[i]: k for k, i in first_of.items()}
    else:  # one layer of each kind, layer k of the reduced graph the k-th kind
        small_cfg, index = reduced_config(config)
        small, res = analysed(small_cfg, workload, hw, attention, training, mla, mtp)
        where = {p: k for k, p in enumerate(layer_scopes(small))}
    mtp_prefixes: dict[str, str] = {}
    if small.meta.get("mtp"):
        full = build_graph(config, workload, mla=mla, mtp=mtp).meta["mtp"]
        mtp_prefixes = {m["prefix"]: f["prefix"] for m, f in zip(small.meta["mtp"], full)}
    rows = _op_rows(small, res["tokens"].verdicts, index, where, mtp_prefixes)
    return {"columns": list(OP_COLUMNS), "rows": rows}


def _op_rows(
    small: Graph,
    verdicts: dict[str, Any],
    index: list[int],
    where: dict[str, int],
    mtp_prefixes: dict[str, str],
) -> list[list[Any]]:
    """The op table's rows of `small`, whose layer `where` names stands for its kind (another
    layer's rows are left out), each named as in the first layer of its kind."""
    count: dict[int, int] = {}
    first: dict[int, int] = {}
    for i, k in enumerate(index):
        count[k] = count.get(k, 0) + 1
        first.setdefault(k, i)
    rows = []
    for row in per_op_rows(small):
        lay = layer_of(small, row["name"])
        k = where.get(lay) if lay else None
        if lay and k is None and not mtp_prefixes:
            continue  # a layer its kind's first stands for
        name, layers = row["name"], 1
        if k is not None and k in first:
            layers = count[k]
            name = _real_prefix(lay, first[k]) + name[len(lay) :]
        else:  # an MTP module is numbered after the layers: the full model's, not these
            mod = next((m for m in mtp_prefixes if name.startswith(m + ".")), None)
            if mod is not None:
                name = mtp_prefixes[mod] + name[len(mod) :]
        rows.append(
            [
                name,
                row["op"],
                row["scopes"],
                row["outputs"],
                layers,
                row["flops"],
                row["bytes_read"] + row["bytes_written"],
                row["intensity"],
                row["seconds"],
                bool(verdicts[row["name"]].mixes),
            ]
        )
    return rows


def _real_prefix(prefix: str, i: int) -> str:
    """A reduced layer's prefix (`model.layers.1`) as real layer i's (`model.layers.7`)."""
    return re.sub(r"\d+$", str(i), prefix)


# -- the diagrams ------------------------------------------------------------------------------
def _svg(dot: str, renderer: str | None, key: str) -> str:
    """The SVG element alone (no XML prolog), its ids made unique within the page."""
    text = svg_text(dot, renderer)
    text = text[text.index("<svg") :]
    return re.sub(r'\bid="', f'id="{key}-', text)


def _diagrams(
    config: Any,
    workload: Workload,
    graph: Graph,
    kinds: dict[str, Any],
    mla: str,
    mtp: bool,
    renderer: str | None,
) -> list[dict[str, Any]]:
    """The model view, a block, attention and FFN view per kind of layer, and the tokens view;
    each with the boxes that open another view (box id -> view id)."""
    out: list[dict[str, Any]] = []
    index = kinds["index"]
    scopes: dict[str, str] = graph.meta.get("scopes", {})
    prefixes = layer_scopes(graph)
    model_links = {f"blocks:{i}": f"block-{index[i]}" for i in range(len(index))}
    out.append(_diagram("model", "model", view_dot(graph, "model"), model_links, renderer))
    for k, i in sorted(kinds["first"].items()):
        label = kinds["labels"][str(k)]["label"]
        links = {}
        for s, kind in scopes.items():
            if not s.startswith(prefixes[i] + "."):
                continue
            if kind in ATTENTION_KINDS:
                links.setdefault(s, f"attention-{k}")
            elif kind in FFN_KINDS:
                links.setdefault(s, f"ffn-{k}")
        title = f"block: {label} (layer {i})"
        out.append(
            _diagram(f"block-{k}", title, view_dot(graph, "block", layer=i), links, renderer)
        )
        targets = set(links.values())
        if f"attention-{k}" in targets:
            dot = view_dot(graph, "attention", layer=i)
            out.append(_diagram(f"attention-{k}", f"attention (layer {i})", dot, {}, renderer))
        if f"ffn-{k}" in targets:
            dot = view_dot(graph, "ffn", layer=i)
            out.append(_diagram(f"ffn-{k}", f"FFN (layer {i})", dot, {}, renderer))
    small_cfg = config if is_traced(config) else reduced_config(config)[0]
    few = replace(workload, batch=1, seq_len=TOKENS, past_len=0)
    tokens = model_graph(small_cfg, few, mla=mla, mtp=mtp)
    dot = view_dot(tokens, "tokens")
    out.append(_diagram("tokens", f"tokens ({TOKENS} positions, layer 0)", dot, {}, renderer))
    return out


def _diagram(
    key: str, title: str, dot: str, links: dict[str, str], renderer: str | None
) -> dict[str, Any]:
    svg = _svg(dot, renderer, key)
    # the boxes drawn (dot and graphviz-pure escape <title> text alike but not identically)
    titles = {html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", svg)}
    shown = {box: target for box, target in links.items() if box in titles}
    return {"id": key, "title": title, "svg": svg, "links": dict(sorted(shown.items()))}


# -- the partition -----------------------------------------------------------------------------
def _partition(
    graph: Graph,
    strategy: Strategy,
    hw: Hardware | None,
    attention: str,
    training: TrainingOptions | None,
    renderer: str | None,
) -> dict[str, Any]:
    """Per-device figures, the collectives, one rank's block and (timed) the trace."""
    split = partition(graph, strategy, hw)
    report = partition_report(split, hw, attention, training).to_dict()
    out: dict[str, Any] = {
        "strategy": strategy.describe(),
        "mesh": report["mesh"],
        "stages": report["stages"],
        "collectives": report["collectives"],
        "pipeline": report["pipeline"],
        "notes": report["notes"],
        "devices": len(report["devices"]),
        "trace_gz": None,
    }
    if hw is not None:
        trace = chrome_trace(split, report, hw, attention, training is not None)
        # the trace of a 405B model on 16 devices is ~5 MB of JSON, ~40x smaller gzipped; mtime
        # 0 keeps the bytes the same from run to run
        raw = json_text(trace).encode()
        out["trace_gz"] = base64.b64encode(gzip.compress(raw, 9, mtime=0)).decode()
        out["trace_bytes"] = len(raw)
    dot = view_dot(split, "block", layer=0)
    out["diagrams"] = [
        _diagram("rank", f"block 0, one rank ({strategy.describe()})", dot, {}, renderer)
    ]
    return out
