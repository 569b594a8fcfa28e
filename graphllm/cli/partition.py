"""`graphllm partition` and `graphllm verify partition`: parallel layouts, their costs, and proof by
execution that the partitioned graph computes what the single-device one does."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from graphllm.build.builder import build_graph
from graphllm.cli.common import (
    VERIFY_T,
    deepseek_options,
    frontend_option,
    json_option,
    mla_for,
    model_options,
    resolve,
    seed_option,
    t_given,
    traced_model,
    traced_source,
    traced_workloads,
    user_errors,
)
from graphllm.cli.layout import partition_options, strategy_from, strategy_options, training_from
from graphllm.errors import ConfigError
from graphllm.exporters.trace import chrome_trace, require_traceable, write_trace
from graphllm.files import check_target, json_text
from graphllm.frontends import require_traced_forms
from graphllm.ir import Graph
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel.engine import mla_why
from graphllm.passes.parallel.partition import Strategy, partition_report
from graphllm.passes.parallel.partition import partition as partition_graph
from graphllm.report.console import console as new_console
from graphllm.report.summary import _b, _n, _t, hardware_model_line
from graphllm.runtime.observe import small_instance
from graphllm.runtime.spmd import check_partition
from graphllm.trace.model import traced_graph

MAX_VERIFY_PARAMS = 200_000_000  # numpy runs every rank on one CPU: keep verification small


@click.command()
@partition_options
@frontend_option
@json_option
@click.option("--print-graph", is_flag=True, help="Print one rank's program, one line a node.")
@click.option(
    "--trace",
    "trace_path",
    type=click.Path(path_type=Path),
    help="Write a Chrome/Perfetto trace of the predicted schedule (FILE.json).",
)
@user_errors
def partition(
    hardware: str | None,
    attention: str,
    mla: str,
    mtp: bool,
    frontend: str,
    as_json: bool,
    print_graph: bool,
    trace_path: Path | None,
    **options: Any,
) -> None:
    """Partition the graph over devices: per-device memory, FLOPs, communication and time."""

    if trace_path is not None:
        check_target(trace_path, inputs=(options["config_path"],))  # before the work
    strategy = strategy_from(options)
    training = training_from(options)
    config, wl, graph, form = _model(options, frontend, mla, mtp, training is not None)
    if training is not None and training.zero and strategy.dp == 1:
        raise ConfigError("--zero shards over the data parallel group: give --dp N with N > 1")
    hw = load_hardware(hardware) if hardware else None
    if trace_path is not None and hw is None:
        raise ConfigError("--trace times the schedule on a device: give --hardware NAME")
    if trace_path is not None:
        require_traceable(strategy.microbatches, strategy.devices)
    graph = partition_graph(graph, strategy, hw)
    if print_graph:
        click.echo(graph.print())
        return
    report = partition_report(graph, hw, attention, training)
    doc = {
        "model": {"name": config.name, "model_type": config.model_type},
        "workload": wl.to_dict() | {"attention": attention, "training": training is not None},
        "hardware": hw.to_dict() if hw else None,
        "rate_model": hw.rate_model if hw else None,
        "partition": report.to_dict(),
    }
    if config.is_mla:
        doc["mla"] = {"form": form, "why": mla_why(mla)}
    if getattr(config, "frontend", "built") == "traced":
        doc["model"]["frontend"] = config.frontend
    if trace_path is not None:
        trace = chrome_trace(graph, doc["partition"], hw, attention, training is not None)
        write_trace(trace_path, trace)
    if as_json:
        click.echo(json_text(doc, indent=2))
    else:
        print_partition(doc)
        if trace_path is not None:
            click.echo(f"wrote {trace_path} (open in ui.perfetto.dev or chrome://tracing)")


def _model(
    options: dict[str, Any], frontend: str, mla: str, mtp: bool, training: bool
) -> tuple[Any, Workload, Graph, str | None]:
    """The config, workload, whole graph to partition and its MLA form: built, or traced from
    transformers' code (--frontend), whose weights are cut as transformers' own plans say."""
    traced = traced_source(options, frontend)
    if traced is not None:
        phase = "training" if training else ""
        graph, wl = traced_model(traced, options, "partition", mla, phase, mtp)
        return graph.meta["config"], wl, graph, None
    config, wl = resolve(options)
    form = mla_for(config, wl, training, mla)
    return config, wl, build_graph(config, wl, mla=form, mtp=mtp), form


def print_partition(doc: dict[str, Any]) -> None:
    """Per-stage devices, communication by kind, pipeline bubble."""

    con = new_console()
    p, hw = doc["partition"], doc["hardware"]
    con.print(_headline(doc))
    if "mla" in doc:
        m = doc["mla"]
        con.print(f"MLA: {m['form']} for this {doc['workload']['phase']} step ({m['why']})")
    for note in p["notes"]:
        con.print(f"note: {note}")
    con.print(_stage_table(p, hw))
    comm = _collective_table(p["collectives"], timed=hw is not None)
    if comm.row_count:
        con.print(comm)
    pipe = p["pipeline"]
    if pipe["stages"] > 1:
        con.print(
            f"pipeline ({pipe['schedule']}): {pipe['stages']} stages, {pipe['microbatches']} "
            "microbatches, bubble "
            f"{100 * pipe['bubble']:.1f}%"
            + (f", step {_t(pipe['step_seconds'])}" if pipe["step_seconds"] else "")
        )
    elif hw is not None:
        con.print(
            f"step: {_t(p['stages'][0]['seconds'])} per device (communication not overlapped)"
        )
    if hw is not None:
        con.print(hardware_model_line(hw))


def _headline(doc: dict[str, Any]) -> str:
    """Model, workload, and the devices with their mesh."""
    p, w, hw = doc["partition"], doc["workload"], doc["hardware"]
    mesh = " x ".join(f"{k}={v}" for k, v in p["mesh"].items() if v > 1) or "one device"
    where = f" {hw['name']}" if hw else ""
    traced = " (traced)" if doc["model"].get("frontend") == "traced" else ""
    return (
        f"[bold]{doc['model']['name']}[/bold]{traced}, {w['phase']} B={w['batch']} "
        f"T={w['seq_len']} "
        f"P={w['past_len']}: {len(p['devices'])}{where} devices ({mesh}"
        + (", sequence parallel" if p["strategy"]["sp"] else "")
        + (", embedding and LM head whole" if p["strategy"].get("whole_vocab") else "")
        + ")"
    )


# rows of the stage table: (label, the cell of a stage)
Row = tuple[str, Callable[[dict[str, Any]], str]]


def _stage_table(p: dict[str, Any], hw: dict[str, Any] | None) -> Table:
    """One column per pipeline stage: what one of its devices holds, computes and sends."""
    per_stage = len(p["devices"]) // len(p["stages"])
    rows: list[Row] = [
        ("layers", lambda s: f"{s['layers'][0]}-{s['layers'][1]}" if s["layers"] else ""),
        ("devices", lambda s: str(per_stage)),
        ("params", lambda s: _n(s["params"])),
        *_memory_rows(p.get("training"), any(s.get("state_bytes") for s in p["stages"])),
        (
            "memory" + (f" of {_b(hw['memory_bytes'])}" if hw else ""),
            lambda s: (
                _b(s["memory_bytes"])
                + ("" if s["fits"] is None else (" fits" if s["fits"] else " [red]too big[/red]"))
            ),
        ),
        ("FLOPs", lambda s: _n(s["flops"])),
        ("bytes moved", lambda s: _b(s["bytes"])),
        ("bytes sent", lambda s: _b(sum(s["comm_bytes"].values()))),
    ]
    if hw is not None:
        rows += [
            ("compute time", lambda s: _t(s["compute_seconds"])),
            ("communication time", lambda s: _t(s["comm_seconds"])),
            ("time (no overlap)", lambda s: _t(s["seconds"])),
        ]
    table = Table("per device", *(f"stage {s['stage']}" for s in p["stages"]))
    for label, cell in rows:
        table.add_row(label, *(cell(s) for s in p["stages"]))
    return table


def _memory_rows(tr: dict[str, Any] | None, states: bool) -> list[Row]:
    """What a device keeps in memory: weights, KV cache (and the conv and recurrent `states` of
    linear-attention or Mamba layers), activations; in training, also the gradients and
    optimizer state."""
    if not tr:
        return [
            ("weights", lambda s: _b(s["weight_bytes"])),
            ("KV cache", lambda s: _b(s["kv_cache_bytes"])),
            *([("conv and recurrent state", lambda s: _b(s["state_bytes"]))] if states else []),
            ("activations (peak)", lambda s: _b(s["activation_bytes"])),
        ]
    return [
        (
            "weights" + (" (ZeRO-3 shard)" if tr["zero"] == 3 else ""),
            lambda s: _b(s["training"]["weights"]),
        ),
        ("gradients", lambda s: _b(s["training"]["gradients"])),
        ("optimizer (Adam, fp32)", lambda s: _b(s["training"]["optimizer"])),
        (
            f"activations ({tr['recompute']} recompute)",
            lambda s: f"{_b(s['activation_bytes'])} ({s['training']['microbatches_in_flight']} mb)",
        ),
    ]


def _collective_table(collectives: list[dict[str, Any]], timed: bool) -> Table:
    """The collectives by kind and mesh axis: how many, their payloads, bytes sent, time."""
    comm = Table("collective", "axis", "group", "count", "payload", "sent/device", "time")
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    for c in collectives:
        r = rows.setdefault((c["kind"], c["mesh_axis"]), {"n": 0, "pay": set(), "wire": 0.0})
        r["n"] += c["count"]
        r["pay"].add(c["bytes"])
        r["wire"] += c["count"] * c["wire_bytes_per_device"]
        r["group"] = c["group_size"]
        r["t"] = r.get("t", 0.0) + c["count"] * (c["seconds"] or 0.0)
    for (kind, axis), r in rows.items():
        pay = sorted(r["pay"])
        each = _b(pay[0]) if len(pay) == 1 else f"{_b(pay[0])} - {_b(pay[-1])}"
        time = _t(r["t"]) if timed else ""
        comm.add_row(kind, axis, str(r["group"]), str(r["n"]), each, _b(r["wire"]), time)
    return comm


def _instance_workload(
    wl: Workload, s: Strategy, given_t: bool, given_b: bool
) -> tuple[Workload, str]:
    """The small instance's workload and the note's words for it: without -t a short prompt
    whose tokens every cut divides (cp, ep over the tokens, sp), without -b one sequence for
    each dp rank and microbatch; what the user gave stays (the strategy's check names a misfit)."""
    said: list[str] = []
    if not given_t:
        cut = s.cp * s.ep * (s.tp if s.sp else 1)
        t = -(-VERIFY_T // cut) * cut  # VERIFY_T rounded up to a multiple of the cut
        if wl.seq_len > t:
            wl = replace(wl, seq_len=t)
            said.append(f"T={t} (-t to choose)")
    per = s.dp * s.microbatches
    if not given_b and wl.batch % per:
        wl = replace(wl, batch=per)
        said.append(f"B={per} (-b to choose)")
    return wl, f" at {', '.join(said)}" if said else ""


@click.command("partition")
@model_options
@strategy_options
@deepseek_options
@frontend_option
@seed_option()
@user_errors
def verify_partition(seed: int, mla: str, mtp: bool, frontend: str, **options: Any) -> None:
    """Run the partitioned graph rank by rank in numpy and compare its logits with one device's.

    Exit 0 when they agree within 1e-5 (fp32), 1 with the largest differences otherwise.
    """

    strategy = strategy_from(options)
    traced = traced_source(options, frontend)
    if traced is not None:
        _report_check(*_traced_check(traced, options, strategy, (seed, mla, mtp)))
        return
    given_t = t_given(options)  # before resolve takes the workload flags out of options
    given_b = options.get("batch") is not None
    config, wl = resolve(options)
    mla = mla_for(config, wl, False, mla)
    wl = Workload.with_dtype(wl, dtype="fp32")
    graph = build_graph(config, wl, mla=mla, mtp=mtp)
    params = sum(n.out.numel(graph.bindings) for n in graph.params())
    if params > MAX_VERIFY_PARAMS:
        # a published model is verified as `verify tokens` does it: its architecture at toy
        # sizes (family, features, routing, layer kinds), said on stderr and in the result line
        # a prompt of the default 2048 tokens is over numpy's budget even at toy sizes: without
        # a T given (-t or the config's workload section) the instance runs a short one, as
        # `verify tokens` does
        wl, at = _instance_workload(wl, strategy, given_t, given_b)
        click.echo(
            f"note: {config.name} has {params:,.0f} parameters, too many to run every rank in "
            f"numpy: verifying a small instance of it (same family and features, toy sizes, "
            f"every divisibility {strategy.describe()} needs){at}",
            err=True,
        )
        config = small_instance(config, wl.seq_len, strategy)
        graph = build_graph(config, wl, mla=mla, mtp=mtp)
    check = check_partition(graph, partition_graph(graph, strategy), seed=seed)
    _report_check(config.name, wl, strategy, check)


def _traced_check(
    source: tuple[dict, str], options: dict[str, Any], strategy: Strategy, how: tuple
) -> tuple[str, Workload, Strategy, Any]:
    """verify partition of a model traced from transformers' code, at the size it is given
    (a traced model has no small instance of itself: give a tiny config of the architecture).
    `how`: the seed, and the MLA and MTP flags."""
    raw, name = source
    seed, mla, mtp = how
    workloads = traced_workloads(options, raw)
    if len(workloads) > 1:
        raise ConfigError("verify partition takes one --seq-len, not a list")
    wl = Workload.with_dtype(workloads[0], dtype="fp32")
    shape = traced_graph(raw, wl, name)  # on the meta device: counted before any weight is made
    require_traced_forms(shape.meta["config"], mla, mtp)
    params = sum(n.out.numel(shape.bindings) for n in shape.params())
    if params > MAX_VERIFY_PARAMS:
        raise ConfigError(
            f"{shape.meta['config'].name} has {params:,.0f} parameters, too many to run every "
            f"rank in numpy (at most {MAX_VERIFY_PARAMS:,}): verify a config of the same "
            "architecture at small sizes"
        )
    graph = traced_graph(raw, wl, name, values=True)
    check = check_partition(graph, partition_graph(graph, strategy), seed=seed)
    return f"{graph.meta['config'].name} (traced)", wl, strategy, check


def _report_check(name: str, wl: Workload, strategy: Strategy, check: Any) -> None:
    """The result line of verify partition (and the largest differences, exit 1, if any)."""
    what = (
        f"{name} (B={wl.batch} T={wl.seq_len} P={wl.past_len}), "
        f"{strategy.describe()} on {check.ranks} devices"
    )
    mtp_diff = max((v for k, v in check.others.items() if k.startswith("mtp.")), default=None)
    also = "" if mtp_diff is None else f", MTP logits {mtp_diff:.2e}"
    if check.agrees() and (mtp_diff is None or mtp_diff <= 1e-5):
        click.echo(f"{what}: logits equal within 1e-5 (max |diff| {check.max_diff:.2e}{also})")
        return
    click.echo(f"{what}: logits differ, max |diff| {check.max_diff:.3e}{also}")
    for idx, ref, got in check.differences():
        click.echo(f"  logits{list(idx)}: single device {ref:.6g}, partitioned {got:.6g}")
    sys.exit(1)
