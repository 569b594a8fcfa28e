"""The `graphllm` command line: thin commands that parse, call the library, and print.

Heavy imports happen inside the commands so that `graphllm --help` stays instant. Every error the
user can fix (GraphllmError) becomes one line on stderr and exit code 2.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

DTYPE_NAMES = ["fp32", "bf16", "fp16", "fp8", "int8", "int4"]


def _fail(msg: str) -> None:
    click.echo(f"error: {msg}", err=True)
    sys.exit(2)


def user_errors(fn: Callable) -> Callable:
    """Turn GraphllmError (and a missing optional dependency) into one line and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from graphllm.errors import GraphllmError

        try:
            return fn(*args, **kwargs)
        except GraphllmError as e:
            _fail(str(e))
        except ModuleNotFoundError as e:
            _fail(f"{e.name} is not installed (see README.md for the extras)")

    return wrapper


def model_options(fn: Callable) -> Callable:
    """--config / --model and the workload flags, shared by every command that builds a graph."""
    opts = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(path_type=Path),
            help="HF config.json, a checkpoint folder, or a YAML file (with optional workload:).",
        ),
        click.option("--model", "preset", help="A preset name (see `graphllm presets`)."),
        click.option("--batch", "-b", type=click.IntRange(min=1), help="Batch size B."),
        click.option("--seq-len", "-t", type=click.IntRange(min=1), help="New tokens T."),
        click.option(
            "--past-len", type=click.IntRange(min=0), help="Past tokens P in the KV cache."
        ),
        click.option(
            "--dtype", type=click.Choice(DTYPE_NAMES), help="Weights, activations and KV cache."
        ),
        click.option("--weight-dtype", type=click.Choice(DTYPE_NAMES)),
        click.option("--act-dtype", type=click.Choice(DTYPE_NAMES)),
        click.option("--kv-dtype", type=click.Choice(DTYPE_NAMES)),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def resolve(options: dict[str, Any]) -> tuple[Any, Any]:
    """ModelConfig and Workload from the shared options: flags over the YAML's workload section."""
    from graphllm.config import load_config, load_workload_section
    from graphllm.errors import ConfigError
    from graphllm.workload import Workload

    path, preset = options.pop("config_path"), options.pop("preset")
    if (path is None) == (preset is None):
        raise ConfigError("give exactly one of --config PATH or --model NAME")
    config = load_config(path if path is not None else preset)
    section = load_workload_section(path) if path is not None else {}
    flags = {
        "batch": options.pop("batch"),
        "seq_len": options.pop("seq_len"),
        "past_len": options.pop("past_len"),
        "dtype": options.pop("dtype"),
        "weight_dtype": options.pop("weight_dtype"),
        "act_dtype": options.pop("act_dtype"),
        "kv_dtype": options.pop("kv_dtype"),
    }
    base = {"seq_len": 2048}  # a typical prompt, when neither the file nor a flag says
    merged = base | {k: v for k, v in section.items()} | {k: v for k, v in flags.items() if v}
    if flags["dtype"]:
        # --dtype on the command line resets the per-kind dtypes of the file
        for k in ("weight_dtype", "act_dtype", "kv_dtype"):
            if not flags[k]:
                merged.pop(k, None)
    if flags["past_len"] == 0:
        merged["past_len"] = 0
    return config, Workload.with_dtype(None, **merged)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graphllm")
def main() -> None:
    """graphllm: what a decoder-only LLM really computes, and what it costs."""


@main.command()
@model_options
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead.")
@click.option("--print-graph", is_flag=True, help="Print the graph, one line per node.")
@user_errors
def trace(as_json: bool, print_graph: bool, **options: Any) -> None:
    """Build the model's op graph, verify it and summarise it."""
    from graphllm.report import trace_report

    config, workload = resolve(options)
    doc, graph = trace_report(config, workload)
    if print_graph:
        click.echo(graph.print())
    elif as_json:
        click.echo(json.dumps(doc, indent=2))
    else:
        from graphllm.summary import print_trace

        print_trace(doc)


@main.group()
def verify() -> None:
    """Check an analysis against execution."""


@verify.command("tokens")
@model_options
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--full-size", is_flag=True, help="Run the config as given, not a small instance.")
@user_errors
def verify_tokens(seed: int, full_size: bool, **options: Any) -> None:
    """Perturb each input position, watch which outputs change, compare with the tokens pass.

    Runs a small instance of the config (same family and features, toy sizes) in the numpy
    interpreter. Exit 0 when prediction and observation agree, 1 otherwise.
    """
    from graphllm.observe import check_token_mixing

    seq_len = options.get("seq_len") or 12
    config, _ = resolve(options)
    check = check_token_mixing(config, seq_len=seq_len, seed=seed, shrink=not full_size)
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


if __name__ == "__main__":
    main()
