"""`graphllm trace`: build, verify and analyse a model's graph, and print what it costs."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click

from graphllm.cli.common import (
    deepseek_options,
    device_options,
    frontend_option,
    json_option,
    mla_for,
    model_options,
    resolve_sweep,
    traced_source,
    traced_workloads,
    user_errors,
)
from graphllm.errors import ConfigError
from graphllm.files import check_target, json_text, write_text_atomic
from graphllm.frontends import require_engine_form
from graphllm.models.hardware import Hardware, load_hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.report.fit import fit_section, training_fit_section
from graphllm.report.plot import plot_sweep
from graphllm.report.reuse import trace_document
from graphllm.report.summary import print_sweep, print_trace
from graphllm.report.trace_report import per_op_text, sweep, trace_report, traced_report
from graphllm.trace.model import traced_graph


@click.command()
@model_options
@device_options("Fused core attention, or every op through memory (the score matrix included).")
@click.option("--training", is_flag=True, help="Forward + backward FLOPs.")
@deepseek_options
@frontend_option
@json_option
@click.option("--print-graph", is_flag=True, help="Print the graph, one line per node.")
@click.option(
    "--per-op",
    nargs=2,
    type=(click.Choice(["csv", "json"]), click.Path(path_type=Path)),
    help="Write one row per op node: --per-op csv FILE.",
)
@click.option(
    "--plot", type=click.Path(path_type=Path), help="With a --seq-len list: draw the sweep (.png)."
)
@user_errors
def trace(
    hardware: str | None,
    attention: str,
    training: bool,
    mla: str,
    mtp: bool,
    frontend: str,
    as_json: bool,
    print_graph: bool,
    per_op: tuple[str, Path] | None,
    plot: Path | None,
    **options: Any,
) -> None:
    """Build the model's op graph, verify and analyse it: params, token mixing, cost, memory."""

    for target in (per_op[1] if per_op else None, plot):
        if target is not None:
            check_target(target, inputs=(options["config_path"],))  # before the work
    traced = traced_source(options, frontend)
    if traced is not None:
        args = (traced, options, hardware, (attention, mla, mtp), training, as_json, print_graph)
        _traced(*args, per_op, plot)
        return
    again = _same_model_flags(options)  # before resolve takes them out of `options`
    config, workloads = resolve_sweep(options)
    chosen_mla, mla = mla, mla_for(config, workloads[0], training, mla)  # one phase a sweep
    hw = load_hardware(hardware) if hardware else None
    if len(workloads) > 1:
        if per_op or print_graph:
            raise ConfigError("--per-op and --print-graph take one --seq-len, not a list")
        _sweep(config, workloads, hw, (attention, training, mla, mtp), as_json, plot)
        return
    if plot:
        raise ConfigError("--plot draws a sweep: give --seq-len a list, e.g. 128,1024,8192")
    args = (config, workloads[0], hw, attention, training, mla, mtp)
    graph = None
    if per_op or print_graph:
        doc, graph = trace_report(*args)  # the real graph, node by node
    else:
        doc = trace_document(*args)  # one layer of each kind standing for the rest
    if hw is not None and hardware is not None:
        doc["fit"] = _fit(doc, config, workloads[0], hw, attention, training, mla)
        _plan_hint(doc["fit"], again, hardware, attention, training, chosen_mla, mtp)
    if per_op and graph is not None:
        write_text_atomic(per_op[1], per_op_text(graph, per_op[0]))
    if print_graph and graph is not None:
        click.echo(graph.print())
    elif as_json:
        click.echo(json_text(doc, indent=2))
    else:
        print_trace(doc)


def _traced(
    source: tuple[dict, str],
    options: dict[str, Any],
    hardware: str | None,
    forms: tuple[str, str, bool],
    training: bool,
    as_json: bool,
    print_graph: bool,
    per_op: tuple[str, Path] | None,
    plot: Path | None,
) -> None:
    """trace of a model traced from transformers' code: the same document, without the MLA
    and plan sections a built family has; a --seq-len list sweeps it, each point traced at its
    own shape. `forms`: the attention, MLA and MTP flags."""
    raw, name = source
    attention, mla, mtp = forms
    workloads = traced_workloads(options, raw)
    hw = load_hardware(hardware) if hardware else None
    config = traced_graph(raw, workloads[0], name).meta["config"]
    for phase in {wl.phase for wl in workloads}:  # a cost engines do not pay is no default
        require_engine_form(config, mla, phase, mtp)
    if len(workloads) > 1:
        if per_op or print_graph:
            raise ConfigError("--per-op and --print-graph take one --seq-len, not a list")
        _sweep(config, workloads, hw, (attention, training, "naive", False), as_json, plot)
        return
    if plot:
        raise ConfigError("--plot draws a sweep: give --seq-len a list, e.g. 128,1024,8192")
    graph = None
    if per_op or print_graph:
        doc, graph = traced_report(raw, name, workloads[0], hw, attention, training)
    else:  # one layer of each kind standing for the rest
        doc = trace_document(config, workloads[0], hw, attention, training)
    if per_op:
        write_text_atomic(per_op[1], per_op_text(graph, per_op[0]))
    if print_graph:
        click.echo(graph.print())
    elif as_json:
        click.echo(json_text(doc, indent=2))
    else:
        print_trace(doc)


def _sweep(
    config: ModelConfig,
    workloads: list[Workload],
    hw: Hardware | None,
    forms: tuple[str, bool, str, bool],
    as_json: bool,
    plot: Path | None,
) -> None:
    """A --seq-len list: FLOPs, bytes and time for each (`forms`: attention, training, mla and
    mtp), as a table or JSON, and drawn with --plot."""
    rows = sweep(config, workloads, hw, *forms)
    title = f"{config.name} on {hw.name if hw else 'no hardware'}"
    if plot:
        plot_sweep(rows, plot, title + (f", {hw.rate_model} model" if hw else ""), hw)
    if as_json:
        doc = {
            "model": config.name,
            "hardware": hw.name if hw else None,
            "rate_model": hw.rate_model if hw else None,
            "sweep": rows,
        }
        click.echo(json_text(doc, indent=2))
    else:
        print_sweep(rows, title)
    if plot:
        click.echo(f"wrote {plot}", err=as_json)


def _fit(
    doc: dict[str, Any],
    config: ModelConfig,
    workload: Workload,
    hw: Hardware,
    attention: str,
    training: bool,
    mla: str,
) -> dict[str, Any]:
    """weights + cache + activations (a training step: + gradients, Adam's state, saved
    activations) over the device's memory: the fewest devices that hold them, from plan's own
    search in the form the document was priced in, so the roofline line can say where to go
    next."""
    if training:
        return training_fit_section(config, workload, hw, attention)
    return fit_section(config, workload, hw, doc["memory"], attention, mla)


def _plan_hint(
    fit: dict[str, Any],
    again: list[str],
    hardware: str,
    attention: str,
    training: bool,
    mla: str,
    mtp: bool,
) -> None:
    """Into `fit`: the command that ranks the layouts of its device count, on this model and
    workload as given (`again`: their flags)."""
    if not fit.get("devices"):
        return
    flags = [*again, *(["--training"] if training else []), "-n", str(fit["devices"])]
    flags += ["--hardware", hardware, *_rate_model_flags()]
    if attention != "flash":
        flags += ["--attention", attention]
    if mla != "auto":  # plan's default is trace's
        flags += ["--mla", mla]
    fit["plan_command"] = shlex.join(["graphllm", "plan", *flags])
    if mtp:  # plan lays out the main model: say so rather than count without a word
        fit["plan_note"] = "plan lays out the model without its MTP modules"


def _same_model_flags(options: dict[str, Any]) -> list[str]:
    """The flags that name this command's model and workload (as given), for another command."""
    out: list[str] = []
    if options.get("config_path") is not None:
        out += ["--config", str(options["config_path"])]
    if options.get("preset") is not None:
        out += ["--model", options["preset"]]
    for key, flag in (("batch", "-b"), ("past_len", "--past-len"), ("logits", "--logits")):
        if options.get(key) is not None:
            out += [flag, str(options[key])]
    if options.get("seq_len"):
        out += ["-t", ",".join(map(str, options["seq_len"]))]
    for key in ("dtype", "weight_dtype", "act_dtype", "kv_dtype"):
        if options.get(key):
            out += ["--" + key.replace("_", "-"), options[key]]
    return out


def _rate_model_flags() -> list[str]:
    """--ideal and --cuda-graphs as this command was given them."""
    params = click.get_current_context().params
    out = ["--ideal"] if params.get("ideal") else []
    if params.get("cuda_graphs") is not None:
        out.append("--cuda-graphs" if params["cuda_graphs"] else "--no-cuda-graphs")
    return out
