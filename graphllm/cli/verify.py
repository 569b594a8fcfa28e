"""`graphllm verify`: check an analysis against execution (token mixing, partitions)."""

from __future__ import annotations

import sys
from typing import Any

import click

from graphllm.cli.common import SEED, model_options, resolve, user_errors
from graphllm.cli.partition import verify_partition
from graphllm.errors import ConfigError
from graphllm.runtime.observe import check_token_mixing


@click.group()
def verify() -> None:
    """Check an analysis against execution."""


@verify.command("tokens")
@model_options
@click.option("--seed", type=SEED, default=0, show_default=True)
@click.option("--full-size", is_flag=True, help="Run the config as given, not a small instance.")
@click.option("--onnx", "use_onnx", is_flag=True, help="Observe on onnxruntime, exported to ONNX.")
@user_errors
def verify_tokens(seed: int, full_size: bool, use_onnx: bool, **options: Any) -> None:
    """Perturb each input position, watch which outputs change, compare with the tokens pass.

    Runs a small instance of the config (same family and features, toy sizes) in the numpy
    interpreter, or with --onnx exported to ONNX and run on onnxruntime. Exit 0 when prediction
    and observation agree, 1 otherwise.
    """

    if not options.get("seq_len") and options.get("config_path") is None:
        options["seq_len"] = [12]  # a short prompt: every cell is checked by a run
    config, workload = resolve(options)
    if workload.seq_len > 256:
        raise ConfigError(
            f"verify tokens runs T+1 forward passes: T={workload.seq_len} is over 256"
        )
    runtime = "onnxruntime" if use_onnx else "numpy"
    check = check_token_mixing(
        config, seed=seed, shrink=not full_size, workload=workload, runtime=runtime
    )
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


verify.add_command(verify_partition, "partition")
