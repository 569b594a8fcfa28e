"""`graphllm verify`: check an analysis against execution (token mixing, partitions)."""

from __future__ import annotations

import sys
from typing import Any

import click

from graphllm.cli.common import (
    VERIFY_T,
    frontend_option,
    model_options,
    resolve,
    seed_option,
    t_given,
    traced_source,
    traced_workloads,
    user_errors,
)
from graphllm.cli.partition import verify_partition
from graphllm.errors import ConfigError
from graphllm.runtime.observe import check_token_mixing, traced_mixing_check

MAX_T = 256  # verify tokens runs T+1 forward passes


@click.group()
def verify() -> None:
    """Check an analysis against execution."""


@verify.command("tokens")
@model_options
@seed_option()
@frontend_option
@click.option("--full-size", is_flag=True, help="Run the config as given, not a small instance.")
@click.option("--onnx", "use_onnx", is_flag=True, help="Observe on onnxruntime, exported to ONNX.")
@user_errors
def verify_tokens(seed: int, full_size: bool, use_onnx: bool, **options: Any) -> None:
    """Perturb each input position, watch which outputs change, compare with the tokens pass.

    Runs a small instance of the config (same family and features, toy sizes) in the numpy
    interpreter, or with --onnx exported to ONNX and run on onnxruntime. Exit 0 when prediction
    and observation agree (where the model selects keys at run time, when what a run reads lies
    within the predicted bound), 1 otherwise.
    """

    path = options.get("config_path")
    chosen = not t_given(options)
    if chosen:  # a short prompt: every cell is checked by a run (T+1 of them)
        options["seq_len"] = [VERIFY_T]
    check, workload = _checked(options, options.pop("frontend"), seed, full_size, use_onnx)
    if chosen:  # said on stderr once the check has run: a refused one is its error alone
        click.echo(
            f"note: the {'config' if path is not None else 'preset'} gives no seq_len; verify "
            f"tokens uses T={VERIFY_T} (-t to choose, at most {MAX_T})",
            err=True,
        )
    seq_len = f"{workload.seq_len}" + (f" P={workload.past_len}" if workload.past_len else "")
    cells = check.predicted.size
    what = check.config.name
    if check.agrees and check.selects:
        unused = int((check.predicted & ~check.observed).sum())
        click.echo(
            f"token mixing of {what}, T={seq_len}: observed within the predicted bound on "
            f"{cells} cells (keys selected at run time: this input left {unused} of the bound's "
            "cells unread)"
        )
        return
    if check.agrees:
        click.echo(f"token mixing of {what}, T={seq_len}: predicted == observed on {cells} cells")
        return
    diffs = check.differences()
    click.echo(f"token mixing of {what}, T={seq_len}: {len(diffs)} of {cells} cells differ")
    for t, j, pred, obs in diffs[:50]:
        click.echo(f"  output {t} <- input {j}: predicted {int(pred)}, observed {int(obs)}")
    sys.exit(1)


def _checked(
    options: dict[str, Any], frontend: str, seed: int, full_size: bool, use_onnx: bool
) -> tuple[Any, Any]:
    """The token-mixing check of the model (built, or traced from transformers' code, as the
    config gives it) and its workload."""
    traced = traced_source(options, frontend)
    if traced is not None:
        if use_onnx or not full_size:
            raise ConfigError(
                "a traced model is checked as its config gives it, in the numpy interpreter: "
                "give --full-size (a small config), without --onnx"
            )
        workload = traced_workloads(options, traced[0])[0]
    else:
        config, workload = resolve(options)
    if workload.seq_len > MAX_T:
        raise ConfigError(
            f"verify tokens runs T+1 forward passes: T={workload.seq_len} is over {MAX_T}"
        )
    if traced is not None:
        return traced_mixing_check(*traced, workload, seed), workload
    runtime = "onnxruntime" if use_onnx else "numpy"
    check = check_token_mixing(
        config, seed=seed, shrink=not full_size, workload=workload, runtime=runtime
    )
    return check, workload


verify.add_command(verify_partition, "partition")
