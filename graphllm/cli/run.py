"""`graphllm run`: a greedy generation on N ranks that talk through torch.distributed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from graphllm.cli import run_measured  # measured beside predicted
from graphllm.cli.common import (
    WEIGHTS_CONFIG_HELP,
    json_option,
    mla_option,
    seed_option,
    source_options,
    user_errors,
)
from graphllm.cli.layout import strategy_from, strategy_options
from graphllm.errors import ConfigError
from graphllm.files import check_target, json_text, write_text_atomic
from graphllm.report.console import console as new_console
from graphllm.runtime.dist.launch import run_job
from graphllm.runtime.dist.rank import Job, preflight
from graphllm.runtime.dist.segments import default_runtime


@click.command()
@source_options(WEIGHTS_CONFIG_HELP)
@click.option(
    "--weights",
    type=click.Path(path_type=Path),
    help="A safetensors checkpoint folder: each rank reads only its blocks of each tensor "
    "[default: seeded random weights, those `verify partition` draws].",
)
@strategy_options
@click.option(
    "--nproc",
    type=click.IntRange(min=1),
    help="Ranks to start on this machine: the mesh's size (1: the unpartitioned program in "
    "this process, the reference) [default: the product of the strategy's sizes].",
)
@click.option(
    "--batch", "-b", type=click.IntRange(min=1), default=1, show_default=True, help="Prompts B."
)
@click.option(
    "--seq-len",
    "-t",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Prompt tokens T (seeded random ids).",
)
@click.option(
    "--new-tokens",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Tokens to generate: the prefill's, then one per cached decode step.",
)
@seed_option("Seed of the prompt and of random weights.")
@mla_option("DeepSeek latent attention (as `export --mla`).", auto=False)
@click.option(
    "--runtime",
    type=click.Choice(["auto", "numpy", "onnxruntime"]),
    default="auto",
    show_default=True,
    help="What runs each segment between two collectives (auto: "
    "onnxruntime where its segment runner is built in, else numpy).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds any rank waits (rendezvous, each collective) before it gives up; "
    "the first rank to fail ends the run.",
)
@json_option
@run_measured.measured_options
@click.option(
    "--write-job",
    type=click.Path(path_type=Path),
    help="Write the job for `torchrun ... -m graphllm.runtime.dist.worker JOB` "
    "(several machines) instead of running it.",
)
@user_errors
def run(
    preset: str | None,
    config_path: Path | None,
    weights: Path | None,
    nproc: int | None,
    batch: int,
    seq_len: int,
    new_tokens: int,
    seed: int,
    mla: str,
    runtime: str,
    timeout: float,
    as_json: bool,
    write_job: Path | None,
    hardware: str | None,
    trace_path: Path | None,
    **options: Any,
) -> None:
    """Run a greedy generation on --nproc ranks over torch.distributed (gloo, or NCCL on GPUs)."""

    strategy = strategy_from(options)
    nproc = strategy.devices if nproc is None else nproc
    if config_path is None and preset is None and weights is not None:
        config_path = weights  # a checkpoint folder holds its config.json
    if (config_path is None) == (preset is None):
        raise ConfigError("give exactly one of --config PATH, --model NAME or --weights DIR")
    job = Job(
        source=str(config_path if config_path is not None else preset),
        strategy=strategy.to_dict(),
        batch=batch,
        seq_len=seq_len,
        new_tokens=new_tokens,
        seed=seed,
        mla=mla,
        weights=str(weights) if weights is not None else None,
        runtime=default_runtime() if runtime == "auto" else runtime,
        timeout=timeout,
    )
    if write_job is not None:
        check_target(write_job)
        preflight(job, nproc, local=False)
        write_text_atomic(write_job, json_text([job.to_dict()], indent=2))
        cmd = "torchrun --nproc-per-node N --nnodes M ... -m graphllm.runtime.dist.worker"
        click.echo(f"wrote {write_job}; on every machine: {cmd} {shlex.quote(str(write_job))}")
        return
    hw = run_measured.prepare(hardware, trace_path, config_path, strategy.devices)
    doc = run_job(job, nproc)
    lines = run_measured.measure(doc, hw, trace_path, mla)
    if as_json:
        click.echo(json_text(doc, indent=2))
        return
    print_run(doc)
    for line in lines:
        click.echo(line)


def print_run(doc: dict[str, Any]) -> None:
    """The generated tokens, and each rank's compute and communication time."""
    con = new_console()
    s = doc["strategy"]["describe"]
    con.print(
        f"[bold]{doc['source']}[/bold]: {s} on {doc['nproc']} rank(s), {doc['backend']}, "
        f"segments on {doc['runtime']}; B={doc['batch']} T={doc['seq_len']}, "
        f"{doc['new_tokens']} new tokens"
    )
    for i, row in enumerate(doc["tokens"]):
        con.print(f"  tokens[{i}]: {' '.join(str(t) for t in row)}")
    table = Table("rank", "coords", "weights", "compute", "communication", "collectives")
    for r in doc["ranks"]:
        coords = " ".join(f"{k}={v}" for k, v in r["coords"].items()) or "-"
        calls = sum(len(st["collectives"]) for st in r["steps"])
        table.add_row(
            str(r["rank"]),
            coords,
            f"{r['weight_bytes'] / 1e6:.2f} MB",
            f"{r['compute_seconds'] * 1e3:.1f} ms",
            f"{r['comm_seconds'] * 1e3:.1f} ms",
            str(calls),
        )
    con.print(table)
