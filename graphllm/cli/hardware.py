"""`graphllm hardware` and `graphllm calibrate`: the device specs predictions run on."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from graphllm.build.builder import build_graph
from graphllm.cli.common import DTYPE_NAMES, repeats_option, user_errors
from graphllm.models.config import load_config
from graphllm.models.hardware import list_hardware
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.runtime.calibrate import (
    QUICK,
    attention_heads_of,
    check_local_writable,
    gemm_shapes_of,
    save_local,
    sweep_side_of,
    tables_line,
)
from graphllm.runtime.calibrate import calibrate as measure
from graphllm.runtime.calibrate_link import require_ranks, sizes_up_to, with_links
from graphllm.runtime.calibrate_link import sweep as link_sweep
from graphllm.runtime.calibrate_link import table as link_table


@click.command()
@click.option("--model", "preset", help="Also read a buffer the size of this preset's weights.")
@click.option("--config", "config_path", type=click.Path(path_type=Path))
@click.option("--dtype", type=click.Choice(DTYPE_NAMES), default="bf16", show_default=True)
@repeats_option
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--link/--no-link",
    default=False,
    show_default=True,
    help="Also time gloo all_reduce, all_gather and send/recv between one rank a core "
    "(4 B..64 MiB, nccl-tests' bus bandwidth) for partitions on --hardware local.",
)
@click.option(
    "--link-max",
    type=click.IntRange(min=16, max=1 << 30),  # three buffers of it a rank
    default=64 << 20,
    show_default=True,
    help="The largest message of the --link sweep, bytes (from 4 B, every factor of 4).",
)
@click.option(
    "--budget",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds the read sweep, the GEMM table and the attention table may take, each.",
)
@click.option("--quick", is_flag=True, hidden=True, help="Tiny sizes, for tests.")
@user_errors
def calibrate(
    preset: str | None,
    config_path: Path | None,
    dtype: str,
    repeats: int,
    threads: int,
    link: bool,
    link_max: int,
    budget: float,
    quick: bool,
) -> None:
    """Measure this machine (read bandwidth by working set, GEMM rates by shape, fused
    attention by step) for `--hardware local`."""

    check_local_writable()  # a cache that is a file: refused now, not after measuring
    if link:
        require_ranks()  # and a link sweep that cannot run, before the quick figures
    weights, shapes, heads, side = None, None, None, None
    if preset or config_path:
        cfg = load_config(config_path or preset)
        graph = build_graph(cfg, Workload(dtype=dtype))
        weights = run(graph, ["memory"])["memory"].weights
        shapes = gemm_shapes_of(cfg)
        heads = attention_heads_of(cfg)
        side = sweep_side_of(cfg)
    # progress bars for a terminal; in a log stderr holds nothing but an error line, if any
    bars = sys.stderr is not None and sys.stderr.isatty()
    sizes = (QUICK if quick else {}) | {"budget": budget}
    if shapes:
        sizes["gemm_shapes"] = shapes  # the model's, in place of --quick's
    if heads is not None:
        sizes["attention_heads"] = heads
    if side is not None and not quick:
        sizes["sweep_side"] = side  # the model's matrices, its kernels a byte
    hw = measure(weights_bytes=weights, repeats=repeats, threads=threads, progress=bars, **sizes)
    if link:  # the links between local ranks (graphllm/runtime/calibrate_link.py)
        samples = link_sweep(sizes=sizes_up_to(link_max), repeats=repeats)
        hw = with_links(hw, samples)
        click.echo("\n".join(link_table(samples)))
        click.echo(
            f"{hw.devices_per_node} ranks, one a core (more would time their wait for a core): "
            + ", ".join(
                f"{k} {v.bus_bandwidth / 1e9:.3g} GB/s busbw, {v.step_latency * 1e6:.3g} us/step"
                for k, v in hw.links.items()
            )
        )
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
