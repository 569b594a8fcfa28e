"""`graphllm hardware` and `graphllm calibrate`: the device specs predictions run on."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from graphllm.build.builder import build_graph
from graphllm.cli.common import (
    DTYPE_NAMES,
    REPEATS,
    user_errors,
)
from graphllm.models.config import load_config
from graphllm.models.hardware import list_hardware
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.runtime.calibrate import (
    QUICK,
    check_local_writable,
    gemm_shapes_of,
    save_local,
    tables_line,
)
from graphllm.runtime.calibrate import calibrate as measure


@click.command()
@click.option("--model", "preset", help="Also read a buffer the size of this preset's weights.")
@click.option("--config", "config_path", type=click.Path(path_type=Path))
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="bf16", show_default=True)
@click.option("--repeats", type=REPEATS, default=5, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--budget",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds the read sweep and the GEMM table may take, each.",
)
@click.option("--quick", is_flag=True, hidden=True, help="Tiny sizes, for tests.")
@user_errors
def calibrate(
    preset: str | None,
    config_path: Path | None,
    dtype: str,
    repeats: int,
    threads: int,
    budget: float,
    quick: bool,
) -> None:
    """Measure this machine (read bandwidth by working set, GEMM rates by shape) for
    `--hardware local`."""

    check_local_writable()  # a cache that is a file: refused now, not after measuring
    weights, shapes = None, None
    if preset or config_path:
        cfg = load_config(config_path or preset)
        graph = build_graph(cfg, Workload(dtype=dtype))
        weights = run(graph, ["memory"])["memory"].weights
        shapes = gemm_shapes_of(cfg)
    # progress bars for a terminal; in a log stderr holds nothing but an error line, if any
    bars = sys.stderr is not None and sys.stderr.isatty()
    sizes = (QUICK if quick else {}) | {"budget": budget}
    if shapes:
        sizes["gemm_shapes"] = shapes  # the model's, in place of --quick's
    hw = measure(weights_bytes=weights, repeats=repeats, threads=threads, progress=bars, **sizes)
    path = save_local(hw)
    click.echo(
        f"matmul {hw.peak_flops['fp32'] / 1e9:.1f} GFLOP/s, read {hw.memory_bandwidth / 1e9:.1f} "
        f"GB/s ({threads} threads); saved {path}"
    )
    click.echo(tables_line(hw))


@click.command("hardware")
@user_errors
def hardware_list() -> None:
    """List the device presets for --hardware."""

    for name, desc in list_hardware():
        click.echo(f"{name:16s} {desc}")
