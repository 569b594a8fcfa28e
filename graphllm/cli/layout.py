"""The parallel-layout flags the partition, plan and render commands share: the strategy
(--tp --sp --cp --pp --ep --dp --microbatches) and a training step (--training --recompute --zero),
and what they parse into."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from graphllm.cli.common import deepseek_options, device_options, model_options, options
from graphllm.errors import ConfigError
from graphllm.passes.parallel.partition import Strategy
from graphllm.passes.training import TrainingOptions


def strategy_options(fn: Callable) -> Callable:
    """--tp --sp --cp --pp --ep --dp --microbatches --whole-vocab (partition, verify partition,
    render, report, serving, run)."""
    size = click.IntRange(min=1)
    return options(
        click.option("--tp", type=size, default=1, help="Tensor parallel ranks (Megatron)."),
        click.option("--sp", is_flag=True, help="Sequence parallel with --tp: norms on T/tp."),
        click.option("--cp", type=size, default=1, help="Context parallel ranks: tokens split."),
        click.option("--pp", type=size, default=1, help="Pipeline stages (contiguous layers)."),
        click.option("--ep", type=size, default=1, help="Expert parallel ranks (MoE)."),
        click.option("--dp", type=size, default=1, help="Data parallel replicas: batch split."),
        click.option(
            "--microbatches", type=size, default=1, help="Microbatches per step (pipelining)."
        ),
        click.option(
            "--whole-vocab",
            is_flag=True,
            help="With --tp: the embedding and LM head whole on every rank (gpt-fast's tp).",
        ),
    )(fn)


def training_options(fn: Callable) -> Callable:
    """--training --recompute --zero (partition, plan)."""
    return options(
        click.option(
            "--training", is_flag=True, help="A training step: forward + backward, Adam state."
        ),
        click.option(
            "--recompute",
            type=click.Choice(["none", "selective", "full"]),
            help="Activation recomputation (with --training) [default: none].",
        ),
        click.option(
            "--zero",
            type=click.IntRange(0, 3),
            help="ZeRO stage over the data parallel group (with --training): 1 optimizer state, "
            "2 + gradients, 3 (FSDP) + weights [default: 0].",
        ),
    )(fn)


def partition_options(fn: Callable) -> Callable:
    """The options of a partitioned model on a device (partition, report): the model and its
    workload, the strategy, the device, a training step, DeepSeek's attention."""
    return options(
        model_options, strategy_options, device_options(), training_options, deepseek_options
    )(fn)


def training_from(options: dict[str, Any]) -> TrainingOptions | None:
    """TrainingOptions from the flags (taken out of `options`), or None for inference;
    --recompute and --zero need --training."""
    training, recompute, zero = (options.pop(k) for k in ("training", "recompute", "zero"))
    if not training:
        if recompute is not None or zero is not None:
            raise ConfigError("--recompute and --zero describe a training step: add --training")
        return None
    return TrainingOptions(recompute=recompute or "none", zero=zero or 0)


def strategy_from(options: dict[str, Any]) -> Strategy:
    """The Strategy of the --tp ... --whole-vocab flags (taken out of `options`)."""
    keys = ("tp", "sp", "cp", "pp", "ep", "dp", "microbatches", "whole_vocab")
    s = Strategy(**{k: options.pop(k) for k in keys})
    if s.whole_vocab and s.tp == 1:
        raise ConfigError("--whole-vocab keeps the vocabulary whole across --tp ranks: add --tp")
    return s
