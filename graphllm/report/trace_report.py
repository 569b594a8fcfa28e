"""The `trace` document: one JSON-ready dict per run, with a stable schema that later passes extend."""

from __future__ import annotations

import csv
import io
from collections import Counter
from dataclasses import asdict
from typing import Any

from graphllm.files import json_text
from graphllm.frontends import model_graph
from graphllm.ir import Graph
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.ops import OPS, SOURCE
from graphllm.passes import meta_result, run
from graphllm.passes.cost import ZERO, scopes_of
from graphllm.passes.registry import Results
from graphllm.report.mla import form_cost, form_costs, kv_per_token
from graphllm.trace import traced_graph

ANALYSES = ["verify", "params", "tokens", "cost", "memory", "roofline"]


def trace_report(
    config: ModelConfig,
    workload: Workload,
    hardware: Hardware | None = None,
    attention: str = "flash",
    training: bool = False,
    mla: str = "naive",
    mtp: bool = False,
) -> tuple[dict[str, Any], Graph]:
    """Build and verify the graph, run every analysis; returns the document and the graph."""
    graph, res = analysed(config, workload, hardware, attention, training, mla, mtp)
    section = graph_section(graph)
    doc = document(
        config,
        workload,
        attention,
        training,
        mla,
        mtp,
        section,
        *(res[k] for k in ("params", "tokens", "cost", "memory", "roofline")),
    )
    return doc, graph


def traced_report(
    raw: dict[str, Any],
    name: str,
    workload: Workload,
    hardware: Hardware | None = None,
    attention: str = "flash",
    training: bool = False,
) -> tuple[dict[str, Any], Graph]:
    """trace_report's document and graph for a model traced from transformers' code
    (graphllm.trace), where graphllm builds no family for it or the user asks for the trace."""
    graph = traced_graph(raw, workload, name)
    res = run(graph, ANALYSES, hardware=hardware, attention=attention, training=training)
    section = graph_section(graph)
    results = (res[k] for k in ("params", "tokens", "cost", "memory", "roofline"))
    config = graph.meta["config"]
    doc = document(config, workload, attention, training, "naive", False, section, *results)
    return doc, graph


def graph_section(graph: Graph) -> dict[str, Any]:
    """The document's graph section: its size, its ops by kind, its inputs and outputs."""
    return {
        "nodes": len(graph),
        "edges": graph.num_edges(),
        "ops": dict(Counter(n.op for n in graph.nodes())),
        "inputs": [n.name for n in graph.nodes("input")],
        "outputs": list(graph.outputs),
    }


def analysed(
    config: ModelConfig,
    workload: Workload,
    hardware: Hardware | None,
    attention: str,
    training: bool,
    mla: str,
    mtp: bool,
    exact_sets: bool | None = None,
    passes: list[str] = ANALYSES,
) -> tuple[Graph, Results]:
    """The model's graph and the results of `passes` on it (trace's analyses by default);
    `exact_sets`: the tokens pass's option, left to its default when None."""
    graph = model_graph(config, workload, mla=mla, mtp=mtp)
    return graph, analyses(graph, hardware, attention, training, exact_sets, passes)


def analyses(
    graph: Graph,
    hardware: Hardware | None,
    attention: str,
    training: bool,
    exact_sets: bool | None = None,
    passes: list[str] = ANALYSES,
) -> Results:
    """The results of `passes` on `graph` (trace's analyses by default)."""
    opts: dict[str, Any] = {"hardware": hardware, "attention": attention, "training": training}
    if exact_sets is not None:
        opts["exact_sets"] = exact_sets
    return run(graph, passes, **opts)


def document(
    config: ModelConfig,
    workload: Workload,
    attention: str,
    training: bool,
    mla: str,
    mtp: bool,
    graph: dict[str, Any],
    params: Any,
    tokens: Any,
    cost: Any,
    memory: Any,
    roof: Any,
) -> dict[str, Any]:
    """The trace document from the analyses' reports (`graph`: the graph section)."""
    doc = {
        "model": {
            "name": config.name,
            "model_type": config.model_type,
            "frontend": getattr(config, "frontend", "built"),
            "config": asdict(config),
            # a multimodal model's text decoder: what is modelled, said in the report
            **({"text_decoder_of": config.text_decoder_of} if config.text_decoder_of else {}),
            **(
                {"quantization": quantization_section(config, memory)}
                if config.quantization
                else {}
            ),
        },
        "workload": workload.to_dict()
        | {"attention": attention, "training": training}
        # the options a latent-attention or multi-token-prediction model was traced with
        | ({"mla": mla, "mtp": mtp} if config.is_mla or config.num_nextn_predict_layers else {}),
        "graph": graph,
        "params": params.to_dict(),
        "token_mixing": tokens.to_dict(),
        "flops": cost.flops,
        "bytes": cost.bytes,
        "per_layer": cost.per_layer,
        "memory": memory.to_dict(),
        "roofline": roof.to_dict() if roof is not None else None,
    }
    if config.is_mla:
        # this graph's cost is one form's, where the forms are compared alike (a forward, flash)
        same = attention == "flash" and not training and not mtp
        doc["mla"] = mla_section(config, workload, {mla: form_cost(cost)} if same else None)
    return doc


def quantization_section(config: ModelConfig, memory: Any) -> dict[str, Any]:
    """How the checkpoint stores its weights: the method, the format of a converted weight,
    and the stored bytes by graph dtype (scales and zero points in their weight's)."""
    q = config.quantization
    assert q is not None
    return {
        "method": q.method,
        "describe": q.describe(),
        "weights": asdict(q.weights),
        "stored_bytes_by_dtype": memory.weights_by_dtype,
    }


def mla_section(
    config: ModelConfig, workload: Workload, known: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What latent attention saves: its KV cache per token against the same model's with
    standard multi-head attention, and this workload's cost in the naive and absorbed forms
    (`known`: forms already costed)."""

    forms = form_costs(config, workload, known)
    return {
        "kv_cache_per_token": kv_per_token(config, workload.kv_dtype).to_dict(),
        "forms": {form: asdict(c) for form, c in forms.items()},
    }


PER_OP_FIELDS = (
    "name",
    "op",
    "scopes",
    "outputs",
    "flops",
    "matmul",
    "matmul_causal",
    "bytes_read",
    "bytes_written",
    "weight_bytes",
    "kv_bytes",
    "intensity",
    "seconds",
    "bound",
)


def per_op_rows(graph: Graph) -> list[dict[str, Any]]:
    """One row per computing node: its cost and, when timed, its roofline time."""
    rows = []
    for n in graph.nodes():
        if OPS[n.op].category == SOURCE:
            continue
        oc = meta_result(n, "cost")
        t = n.meta.get("time")  # absent: no hardware given, the op is not timed
        rows.append(
            {
                "name": n.name,
                "op": n.op,
                "scopes": ";".join(sorted({k for _, k in scopes_of(graph, n.name)})),
                "outputs": " ".join(o.format(graph.bindings) for o in n.outputs),
                "flops": oc.flops,
                "matmul": oc.matmul,
                "matmul_causal": oc.matmul_causal,
                "bytes_read": oc.bytes_read,
                "bytes_written": oc.bytes_written,
                "weight_bytes": oc.weight_bytes,
                "kv_bytes": oc.kv_bytes,
                "intensity": oc.intensity if oc.bytes else None,
                "seconds": t.seconds if t else None,
                "bound": t.bound if t else None,
            }
        )
    return rows


def per_op_text(graph: Graph, fmt: str) -> str:
    """The per-op table as CSV or JSON text."""
    rows = per_op_rows(graph)
    if fmt == "json":
        return json_text(rows, indent=1)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=PER_OP_FIELDS)
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def sweep(
    config: ModelConfig,
    workloads: list[Workload],
    hardware: Hardware | None,
    attention: str = "flash",
    training: bool = False,
    mla: str = "naive",
    mtp: bool = False,
) -> list[dict[str, Any]]:
    """FLOPs, bytes and predicted time for each workload (a sweep over T)."""
    out = []
    for wl in workloads:
        graph, res = analysed(
            config, wl, hardware, attention, training, mla, mtp, passes=["cost", "roofline"]
        )
        cost, roof = res["cost"], res["roofline"]
        by_op: dict[str, dict[str, float]] = {}
        for n in graph.nodes():
            oc = meta_result(n, "cost")
            if oc is ZERO:
                continue
            e = by_op.setdefault(n.op, {"flops": 0, "timed_flops": 0, "bytes": 0.0, "seconds": 0.0})
            e["flops"] += oc.flops
            # what the roofline timed: flash attention skips the (query, key) pairs masked out
            masked = oc.matmul - oc.matmul_causal if attention == "flash" else 0
            e["timed_flops"] += oc.flops - masked
            e["bytes"] += oc.bytes
            e["seconds"] += meta_result(n, "time").seconds if roof else 0.0
        out.append(
            {
                "seq_len": wl.seq_len,
                "past_len": wl.past_len,
                "act_dtype": wl.act_dtype,
                "flops": cost.flops["total"],
                "matmul": cost.flops["matmul"],
                "bytes": cost.bytes["total"],
                "seconds": roof.seconds if roof else None,
                "rate_model": roof.rate_model if roof else None,
                "cuda_graphs": roof.cuda_graphs if roof else None,
                "by_op": by_op,
            }
        )
    return out
