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


class IntList(click.ParamType):
    """A positive integer, or a comma-separated list of them (a sweep)."""

    name = "N[,N...]"

    def convert(self, value: Any, param: Any, ctx: Any) -> list[int]:
        if isinstance(value, list):
            return value
        try:
            out = [int(v) for v in str(value).split(",") if v.strip()]
        except ValueError:
            self.fail(f"{value!r} is not an integer or a comma-separated list of them", param, ctx)
        if not out or min(out) < 1:
            self.fail(f"{value!r}: sizes must be positive", param, ctx)
        return out


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
        click.option(
            "--seq-len", "-t", type=IntList(), help="New tokens T (a list sweeps: 128,1024)."
        ),
        click.option(
            "--past-len", type=click.IntRange(min=0), help="Past tokens P in the KV cache."
        ),
        click.option(
            "--dtype", type=click.Choice(DTYPE_NAMES), help="Weights, activations and KV cache."
        ),
        click.option("--weight-dtype", type=click.Choice(DTYPE_NAMES)),
        click.option("--act-dtype", type=click.Choice(DTYPE_NAMES)),
        click.option("--kv-dtype", type=click.Choice(DTYPE_NAMES)),
        click.option(
            "--logits",
            type=click.Choice(["all", "last"]),
            help="LM head for every new position, or the last only (as a server).",
        ),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def resolve(options: dict[str, Any]) -> tuple[Any, Any]:
    """ModelConfig and Workload from the shared options: flags over the YAML's workload section."""
    config, workloads = resolve_sweep(options)
    if len(workloads) > 1:
        from graphllm.errors import ConfigError

        raise ConfigError("this command takes one --seq-len, not a list")
    return config, workloads[0]


def resolve_sweep(options: dict[str, Any]) -> tuple[Any, list[Any]]:
    """Like `resolve`, with one Workload per --seq-len value."""
    from graphllm.config import load_config, load_workload_section
    from graphllm.errors import ConfigError
    from graphllm.workload import Workload

    path, preset = options.pop("config_path"), options.pop("preset")
    if (path is None) == (preset is None):
        raise ConfigError("give exactly one of --config PATH or --model NAME")
    config = load_config(path if path is not None else preset)
    section = load_workload_section(path) if path is not None else {}
    seq_lens = options.pop("seq_len") or [None]
    flags = {
        "batch": options.pop("batch"),
        "past_len": options.pop("past_len"),
        "dtype": options.pop("dtype"),
        "weight_dtype": options.pop("weight_dtype"),
        "act_dtype": options.pop("act_dtype"),
        "kv_dtype": options.pop("kv_dtype"),
        "logits": options.pop("logits"),
    }
    base = {"seq_len": 2048}  # a typical prompt, when neither the file nor a flag says
    merged = base | dict(section) | {k: v for k, v in flags.items() if v}
    if flags["dtype"]:
        # --dtype on the command line resets the per-kind dtypes of the file
        for k in ("weight_dtype", "act_dtype", "kv_dtype"):
            if not flags[k]:
                merged.pop(k, None)
    if flags["past_len"] == 0:
        merged["past_len"] = 0
    out = []
    for t in seq_lens:
        one = dict(merged) | ({"seq_len": t} if t else {})
        out.append(Workload.with_dtype(None, **one))
    return config, out


def attention_option(help_text: str) -> Callable:
    return click.option(
        "--attention",
        type=click.Choice(["flash", "naive"]),
        default="flash",
        show_default=True,
        help=help_text,
    )


def hardware_option(default: str | None) -> Callable:
    return click.option(
        "--hardware",
        default=default,
        show_default=True,
        help="Device preset (see `graphllm hardware`), a YAML/JSON spec file, or `local`.",
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graphllm")
def main() -> None:
    """graphllm: what a decoder-only LLM really computes, and what it costs."""


@main.command()
@model_options
@hardware_option("h100")
@attention_option("Fused core attention, or every op through memory (the score matrix included).")
@click.option("--training", is_flag=True, help="Forward + backward FLOPs.")
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
        rows = sweep(config, workloads, hw, attention, training)
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
    doc, graph = trace_report(config, workloads[0], hw, attention, training)
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
        from graphllm.cli_export import onnx_token_check

        check = onnx_token_check(config, workload.seq_len, seed, not full_size, workload)
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


if __name__ == "__main__":
    main()

from graphllm.cli_render import render  # noqa: E402

main.add_command(render)
