"""Google AI Edge Model Explorer: the graph as its graph JSON, and one node-data overlay per cost.

The JSON is built through the package's own `model_explorer.graph_builder` and
`node_data_builder` dataclasses (pip `ai-edge-model-explorer`, the `explorer` extra), so the
fields are the ones its web app reads. Each node's namespace is its scope path
(`model/layers.3/self_attn`), which the app draws as nested, collapsible layers; a weight sits
beside the node it is named under (`q_proj.weight` beside `q_proj`). Every output carries its
shape (`tensor_shape`, drawn on the edges), and each overlay colours the nodes by one metric of
the cost and roofline passes.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from graphllm.errors import GraphllmError
from graphllm.files import finite, write_text_atomic
from graphllm.ir import Graph, Node
from graphllm.models.hardware import Hardware
from graphllm.ops import OPS, SOURCE
from graphllm.passes import meta_result, run

GRAPH_ID = "graphllm"
# metric (the overlay file's infix) -> the overlay's name in the app's side panel
METRICS = {
    "flops": "FLOPs",
    "bytes": "bytes moved",
    "time": "predicted time (s)",
}
# low cost white, high cost red: the app interpolates between the stops by value
GRADIENT = (("#ffffff", 0.0), ("#fdd49e", 0.5), ("#d7301f", 1.0))
# attrs whose values are tables, not settings: left out of the side panel
BULKY_ATTRS = frozenset({"axes", "type", "inv_freq"})


@dataclass(frozen=True)
class ExplorerExport:
    """What `export_model_explorer` wrote: the graph JSON and the overlay per metric."""

    path: Path
    overlays: dict[str, Path]
    nodes: int


def _explorer() -> tuple[Any, Any, Any]:
    try:
        from model_explorer import graph_builder, node_data_builder, utils
    except ModuleNotFoundError:
        raise GraphllmError(
            "--format model-explorer needs Model Explorer: pip install 'graphllm[explorer]'"
        ) from None
    return graph_builder, node_data_builder, utils


def overlay_paths(path: Path) -> dict[str, Path]:
    """The overlay files beside `path`: graph.json -> graph.flops.json, graph.bytes.json, ..."""
    stem = path.name[: -len(path.suffix)] if path.suffix else path.name
    return {m: path.with_name(f"{stem}.{m}{path.suffix or '.json'}") for m in METRICS}


def split_scope(name: str) -> list[str]:
    """A node name's path components; an index stays with its collection (`layers.3`,
    `experts.*`), so a layer is one collapsible box and not a box per digit."""
    out: list[str] = []
    for part in name.split("."):
        if out and (part.isdigit() or part == "*"):
            out[-1] += "." + part
        else:
            out.append(part)
    return out


def placement(name: str, names: Any) -> tuple[str, str]:
    """(namespace, label) of node `name`: its scope path without the last component, or, for a
    node named under another node (a weight, `...q_proj.weight`), that node's namespace."""
    parts = split_scope(name)
    for k in range(len(parts) - 1, 0, -1):
        owner = ".".join(parts[:k])
        if owner in names:
            ns = split_scope(owner)[:-1]
            return "/".join(ns), ".".join(parts[len(ns) :])
    return "/".join(parts[:-1]), parts[-1]


def node_metrics(graph: Graph, n: Node) -> dict[str, float] | None:
    """The overlay values of one node (None for a source: inputs and weights compute nothing)."""
    if OPS[n.op].category == SOURCE:
        return None
    oc = meta_result(n, "cost")
    t = n.meta.get("time")
    out = {"flops": oc.flops, "bytes": oc.bytes}
    if t is not None:
        out["time"] = t.seconds
    return finite(out)


def explorer_graph(graph: Graph) -> Any:
    """The graph as a `graph_builder.GraphCollection` (cost and time read from the nodes' meta)."""
    gb = _explorer()[0]
    bindings = graph.bindings
    nodes = []
    for n in graph.nodes():
        ns, label = placement(n.name, graph)
        attrs = [gb.KeyValue("op", n.op)]
        attrs += [
            gb.KeyValue(k, _text(v)) for k, v in sorted(n.attrs.items()) if k not in BULKY_ATTRS
        ]
        metrics = node_metrics(graph, n)
        if metrics is not None:
            attrs += [gb.KeyValue(k, f"{v:.6g}") for k, v in metrics.items() if v is not None]
        outs = [
            gb.MetadataItem(
                id=str(i),
                attrs=[
                    gb.KeyValue("tensor_shape", f"{t.dtype}{_dims(t.shape(bindings))}"),
                    gb.KeyValue("dims", t.format()),
                    gb.KeyValue("tensor_name", n.name if i == 0 else f"{n.name}:{i}"),
                ],
            )
            for i, t in enumerate(n.outputs)
        ]
        edges = [
            gb.IncomingEdge(
                sourceNodeId=r.node, sourceNodeOutputId=str(r.index), targetNodeInputId=str(i)
            )
            for i, r in enumerate(n.inputs)
        ]
        nodes.append(
            gb.GraphNode(
                id=n.name,
                label=label,
                namespace=ns,
                attrs=attrs,
                incomingEdges=edges,
                outputsMetadata=outs,
            )
        )
    return gb.GraphCollection(label=graph.name, graphs=[gb.Graph(id=GRAPH_ID, nodes=nodes)])


def explorer_overlays(graph: Graph) -> dict[str, Any]:
    """metric -> `node_data_builder.ModelNodeData`: the metric per computing node, by node id."""
    nd = _explorer()[1]
    values: dict[str, dict[str, float]] = {m: {} for m in METRICS}
    for n in graph.nodes():
        metrics = node_metrics(graph, n) or {}
        for m, v in metrics.items():
            if v is not None:
                values[m][n.name] = v
    gradient = [nd.GradientItem(stop=s, bgColor=c) for c, s in GRADIENT]
    return {
        m: nd.ModelNodeData(
            graphsData={
                GRAPH_ID: nd.GraphNodeData(
                    name=METRICS[m],
                    results={k: nd.NodeDataResult(value=v) for k, v in vals.items()},
                    gradient=gradient,
                )
            }
        )
        for m, vals in values.items()
        if vals
    }


def export_model_explorer(
    graph: Graph,
    path: str | Path,
    hardware: Hardware | None = None,
    attention: str = "flash",
) -> ExplorerExport:
    """Analyse `graph` (cost; roofline time on `hardware`) and write its Model Explorer graph
    JSON to `path` and one overlay per metric beside it (`overlay_paths`), each atomically."""
    plain = _explorer()[2].remove_none  # what the package's own writers drop: unset fields
    path = Path(path)
    run(graph, ["roofline"], hardware=hardware, attention=attention)
    collection = explorer_graph(graph)
    overlays = explorer_overlays(graph)
    targets = overlay_paths(path)
    # the graph JSON last: it is what the viewer is pointed at, and names no overlay
    for m, data in overlays.items():
        doc = {k: plain(asdict(v)) for k, v in data.graphsData.items()}
        write_text_atomic(targets[m], _json(doc))
    write_text_atomic(path, _json(plain(asdict(collection))))
    return ExplorerExport(path, {m: targets[m] for m in overlays}, len(graph))


def _json(doc: Any) -> str:
    # the numbers are finite already (node_metrics), so no walk over 200k values to check it
    return json.dumps(doc, allow_nan=False)


def _dims(shape: tuple[Any, ...]) -> str:
    return "[" + ",".join(_size(s) for s in shape) + "]"


def _size(s: Any) -> str:
    if isinstance(s, str):
        return s
    # balanced routing's slots per expert need not be whole: 1.75, not 7/4
    return str(int(s)) if s == int(s) else f"{float(s):g}"


def _text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    s = repr(v) if not isinstance(v, str) else v
    return s if len(s) <= 200 else s[:197] + "..."
