"""The `graphllm` command line: thin commands that parse, call the library, and print.

Heavy imports happen inside the commands so that `graphllm --help` stays instant. Every error the
user can fix (GraphllmError) becomes one line on stderr and exit code 2 (graphllm.cli_common).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from graphllm.cli_common import (
    DTYPE_NAMES,
    OneLineErrors,
    attention_option,
    deepseek_options,
    hardware_option,
    model_options,
    resolve,
    resolve_sweep,
    user_errors,
)
from graphllm.cli_export import bench, export
from graphllm.cli_partition import partition, verify_partition
from graphllm.cli_plan import plan
from graphllm.cli_render import render


@click.group(cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graphllm")
def main() -> None:
    """graphllm: what a decoder-only LLM really computes, and what it costs."""


@main.command()
@model_options
@hardware_option("h100")
@attention_option("Fused core attention, or every op through memory (the score matrix included).")
@click.option("--training", is_flag=True, help="Forward + backward FLOPs.")
@deepseek_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead.")
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
    as_json: bool,
    print_graph: bool,
    per_op: tuple[str, Path] | None,
    plot: Path | None,
    **options: Any,
) -> None:
    """Build the model's op graph, verify and analyse it: params, token mixing, cost, memory."""
    from graphllm.errors import ConfigError
    from graphllm.hardware import load_hardware
    from graphllm.report import per_op_text, sweep, trace_report

    config, workloads = resolve_sweep(options)
    hw = load_hardware(hardware) if hardware else None
    if len(workloads) > 1:
        if per_op or print_graph:
            raise ConfigError("--per-op and --print-graph take one --seq-len, not a list")
        rows = sweep(config, workloads, hw, attention, training, mla, mtp)
        if plot:
            from graphllm.plot import plot_sweep

            plot_sweep(rows, plot, f"{config.name} on {hw.name if hw else 'no hardware'}", hw)
        if as_json:
            click.echo(json.dumps({"model": config.name, "sweep": rows}, indent=2))
        else:
            from graphllm.summary import print_sweep

            print_sweep(rows)
        return
    if plot:
        raise ConfigError("--plot draws a sweep: give --seq-len a list, e.g. 128,1024,8192")
    doc, graph = trace_report(config, workloads[0], hw, attention, training, mla, mtp)
    if per_op:
        from graphllm.files import write_text_atomic

        write_text_atomic(per_op[1], per_op_text(graph, per_op[0]))
    if print_graph:
        click.echo(graph.print())
    elif as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        from graphllm.summary import print_trace

        print_trace(doc)


@main.command()
@click.option("--model", "preset", help="Also read a buffer the size of this preset's weights.")
@click.option("--config", "config_path", type=click.Path(path_type=Path))
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="bf16", show_default=True)
@click.option("--repeats", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@user_errors
def calibrate(
    preset: str | None, config_path: Path | None, dtype: str, repeats: int, threads: int
) -> None:
    """Measure this machine (matmul FLOP/s, read bandwidth) for `--hardware local`."""
    from graphllm.calibrate import calibrate as measure
    from graphllm.calibrate import save_local

    weights = None
    if preset or config_path:
        from graphllm import Workload, build_graph, load_config
        from graphllm.passes import run

        cfg = load_config(config_path or preset)
        graph = build_graph(cfg, Workload(dtype=dtype))
        weights = run(graph, ["memory"])["memory"].weights
    hw = measure(weights_bytes=weights, repeats=repeats, threads=threads)
    path = save_local(hw)
    click.echo(
        f"matmul {hw.peak_flops['fp32'] / 1e9:.1f} GFLOP/s, read {hw.memory_bandwidth / 1e9:.1f} "
        f"GB/s ({threads} threads); saved {path}"
    )


@main.command("hardware")
@user_errors
def hardware_list() -> None:
    """List the device presets for --hardware."""
    from graphllm.hardware import list_hardware

    for name, desc in list_hardware():
        click.echo(f"{name:16s} {desc}")


@main.group()
def verify() -> None:
    """Check an analysis against execution."""


@verify.command("tokens")
@model_options
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--full-size", is_flag=True, help="Run the config as given, not a small instance.")
@click.option("--onnx", "use_onnx", is_flag=True, help="Observe on onnxruntime, exported to ONNX.")
@user_errors
def verify_tokens(seed: int, full_size: bool, use_onnx: bool, **options: Any) -> None:
    """Perturb each input position, watch which outputs change, compare with the tokens pass.

    Runs a small instance of the config (same family and features, toy sizes) in the numpy
    interpreter, or with --onnx exported to ONNX and run on onnxruntime. Exit 0 when prediction
    and observation agree, 1 otherwise.
    """
    from graphllm.errors import ConfigError

    if not options.get("seq_len") and options.get("config_path") is None:
        options["seq_len"] = [12]  # a short prompt: every cell is checked by a run
    config, workload = resolve(options)
    if workload.seq_len > 256:
        raise ConfigError(
            f"verify tokens runs T+1 forward passes: T={workload.seq_len} is over 256"
        )
    if use_onnx:
        from graphllm.runtime import check_token_mixing_onnx as check_token_mixing
    else:
        from graphllm.observe import check_token_mixing
    check = check_token_mixing(config, seed=seed, shrink=not full_size, workload=workload)
    seq_len = workload.seq_len
    cells = check.predicted.size
    what = check.config.name
    if check.agrees:
        click.echo(f"token mixing of {what}, T={seq_len}: predicted == observed on {cells} cells")
        return
    diffs = check.differences()
    click.echo(f"token mixing of {what}, T={seq_len}: {len(diffs)} of {cells} cells differ")
    for t, j, pred, obs in diffs[:50]:
        click.echo(f"  output {t} <- input {j}: predicted {int(pred)}, observed {int(obs)}")
    sys.exit(1)


@main.command()
@click.option("--json", "as_json", is_flag=True)
@user_errors
def presets(as_json: bool) -> None:
    """List the model presets (`--model NAME`)."""
    from graphllm.config import list_presets

    rows = list_presets()
    if as_json:
        click.echo(json.dumps([{"name": n, "description": d} for n, d in rows], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("preset", "model")
    for name, desc in rows:
        table.add_row(name, desc)
    Console().print(table)


main.add_command(export)
main.add_command(bench)
main.add_command(render)
main.add_command(partition)
main.add_command(plan)
verify.add_command(verify_partition, "partition")

if __name__ == "__main__":
    main()
