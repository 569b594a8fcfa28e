"""`graphllm render`: Graphviz diagrams of the model, drawn from the graph the passes analyse."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from graphllm.build.builder import build_graph
from graphllm.cli.common import (
    deepseek_options,
    device_options,
    frontend_option,
    mla_for,
    model_options,
    renderer_option,
    resolve,
    traced_source,
    traced_workloads,
    user_errors,
)
from graphllm.cli.layout import strategy_from, strategy_options
from graphllm.errors import ConfigError
from graphllm.exporters.dot import view_dot
from graphllm.exporters.render import find_renderer, output_format
from graphllm.exporters.render import render as render_file
from graphllm.files import check_target
from graphllm.models.hardware import load_hardware
from graphllm.passes.parallel.partition import partition
from graphllm.trace import traced_graph

# exporters.dot.VIEWS, listed here so that `graphllm --help` does not import the exporter
VIEWS = ["model", "block", "attention", "ffn", "tokens"]


@click.command()
@model_options
@click.option("--view", type=click.Choice(VIEWS), required=True, help="What to draw.")
@click.option(
    "--output",
    "-o",
    type=click.Path(path_type=Path),
    required=True,
    help="FILE.svg, .png, .pdf (needs Graphviz's dot) or .dot.",
)
@click.option("--layer", type=click.IntRange(min=0), default=0, show_default=True)
@click.option("--all-layers", is_flag=True, help="Model view: every block, not runs of alike ones.")
@click.option(
    "--tokens",
    type=click.IntRange(1, 16),
    default=3,
    show_default=True,
    help="Tokens view: token positions (columns); replaces --seq-len for this view.",
)
@click.option(
    "--color",
    type=click.Choice(["flops", "bytes", "time"]),
    help="Shade ops by cost (time: roofline on --hardware).",
)
@device_options("For --color bytes/time: fused core attention, or every op through memory.")
@strategy_options
@deepseek_options
@click.option(
    "--lanes",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Draw every head (expert) up to this many, else one representative.",
)
@renderer_option("dot binary or graphviz-pure [default: $GRAPHLLM_RENDERER, else auto].")
@frontend_option
@user_errors
def render(
    view: str,
    output: Path,
    layer: int,
    all_layers: bool,
    tokens: int,
    color: str | None,
    hardware: str,
    attention: str,
    lanes: int,
    renderer: str | None,
    mla: str,
    mtp: bool,
    **options: Any,
) -> None:
    """Draw the model the way it is usually explained: model, block, attention, ffn or tokens."""

    fmt = output_format(output)
    check_target(output, inputs=(options["config_path"],))  # before the work, not after it
    name = find_renderer(fmt, renderer)[0] if fmt != "dot" else "none"  # fail before building
    strategy = strategy_from(options)
    split = strategy.devices > 1 or strategy.microbatches > 1
    if split and view != "block":
        raise ConfigError("strategies (--tp, --cp, ...) are drawn in the block view: --view block")
    hw = load_hardware(hardware) if color == "time" else None
    config, graph = _graph(options, view, tokens, mla, mtp)
    if split:
        graph = partition(graph, strategy, hw)
    text = view_dot(
        graph,
        view,
        layer=layer,
        all_layers=all_layers,
        color=color,
        hardware=hw,
        attention=attention,
        max_lanes=lanes,
    )
    render_file(text, output, renderer)
    click.echo(f"wrote {output} ({view} view of {config.name}, renderer: {name})")


def _graph(options: dict[str, Any], view: str, tokens: int, mla: str, mtp: bool) -> tuple[Any, Any]:
    """The config and graph to draw: built, or traced from transformers' code (--frontend)."""
    traced = traced_source(options, options.pop("frontend"))
    if traced is not None:
        workload = traced_workloads(options, traced[0])[0]
        if view == "tokens":
            workload = replace(workload, batch=1, seq_len=tokens, past_len=0)
        graph = traced_graph(traced[0], workload, traced[1])
        return graph.meta["config"], graph
    config, workload = resolve(options)
    if view == "tokens":
        workload = replace(workload, batch=1, seq_len=tokens, past_len=0)
    mla = mla_for(config, workload, False, mla)
    return config, build_graph(config, workload, mla=mla, mtp=mtp)
