"""`graphllm report`: one self-contained HTML page of everything graphllm knows about a model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from graphllm.cli.common import (
    IntList,
    frontend_option,
    mla_for,
    renderer_option,
    resolve_sweep,
    traced_source,
    traced_workloads,
    user_errors,
)
from graphllm.cli.layout import partition_options, strategy_from, training_from
from graphllm.errors import ConfigError
from graphllm.exporters.html import write_page
from graphllm.exporters.render import find_renderer
from graphllm.files import check_target
from graphllm.frontends import require_engine_form
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.report.html import report_data
from graphllm.trace.model import traced_graph


@click.command()
@partition_options
@click.option(
    "--sweep",
    "sweep_lens",
    type=IntList(),
    help="T values of the sweep chart [default: the --seq-len list, else T/64 ... 4T].",
)
@click.option(
    "--output", "-o", type=click.Path(path_type=Path), required=True, help="FILE.html to write."
)
@renderer_option("Diagrams: dot binary or graphviz-pure [default: $GRAPHLLM_RENDERER, else auto].")
@frontend_option
@user_errors
def report(
    hardware: str | None,
    attention: str,
    mla: str,
    mtp: bool,
    sweep_lens: list[int] | None,
    output: Path,
    renderer: str | None,
    frontend: str,
    **options: Any,
) -> None:
    """Write an interactive HTML report: summary, diagrams, op table, charts, devices."""

    if output.suffix.lower() not in (".html", ".htm"):
        raise ConfigError(f"{output}: the report is a web page; give a .html file")
    check_target(output, inputs=(options["config_path"],))  # before the work
    find_renderer("svg", renderer)  # the diagrams need one: fail before building
    strategy = strategy_from(options)
    training = training_from(options)
    traced = traced_source(options, frontend)
    if traced is None:
        config, workloads = resolve_sweep(options)
        mla = mla_for(config, workloads[0], training is not None, mla)
    else:  # the config traced once; each view and sweep point at its own shape
        workloads = traced_workloads(options, traced[0])
        config = traced_graph(traced[0], Workload(), traced[1]).meta["config"]
        require_engine_form(config, mla, workloads[0].phase, mtp)
        mla = "naive"
    if len(workloads) > 1 and sweep_lens is None:
        sweep_lens = [w.seq_len for w in workloads]  # the workload is the list's first
    hw = load_hardware(hardware) if hardware else None
    data = report_data(
        config,
        workloads[0],
        hw,
        strategy,
        training,
        attention,
        mla,
        mtp,
        sweep_lens,
        renderer,
    )
    write_page(output, data)
    size = output.stat().st_size
    click.echo(f"wrote {output} ({size / 1e6:.2f} MB: report of {config.name})")
