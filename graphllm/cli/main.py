"""The `graphllm` command group: thin commands that parse, call the library, and print.

Each command lives in its own module, imported only when it runs, so `graphllm --help` lists
them from the table below without importing the library. Every error the user can fix
(GraphllmError) becomes one line on stderr and exit code 2 (graphllm.cli.common).
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from graphllm.cli.common import OneLineErrors

# name -> (module, function, the one-line help `graphllm --help` shows: the command's own
# first docstring line, which a test holds them to it)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "bench": (
        "graphllm.cli.export",
        "bench",
        "Time MODEL.onnx (or the --config/--model, exported first) on onnxruntime.",
    ),
    "calibrate": (
        "graphllm.cli.hardware",
        "calibrate",
        "Measure this machine (read bandwidth by working set, GEMM rates by shape, fused "
        "attention by step) for `--hardware local`.",
    ),
    "export": (
        "graphllm.cli.export",
        "export",
        "Write the model as ONNX: dynamic batch and lengths, KV cache in and out, left padding.",
    ),
    "hardware": (
        "graphllm.cli.hardware",
        "hardware_list",
        "List the device presets for --hardware.",
    ),
    "partition": (
        "graphllm.cli.partition",
        "partition",
        "Partition the graph over devices: per-device memory, FLOPs, communication and time.",
    ),
    "plan": (
        "graphllm.cli.plan",
        "plan",
        "Enumerate TP x CP x PP x EP x DP layouts of --devices, drop those that do not fit.",
    ),
    "presets": ("graphllm.cli.presets", "presets", "List the model presets (`--model NAME`)."),
    "render": (
        "graphllm.cli.render",
        "render",
        "Draw the model the way it is usually explained: model, block, attention, ffn or tokens.",
    ),
    "report": (
        "graphllm.cli.report",
        "report",
        "Write an interactive HTML report: summary, diagrams, op table, charts, devices.",
    ),
    "serving": (
        "graphllm.cli.serving",
        "serving",
        "Serving figures: TTFT, time per output token, tokens/s, the largest batch, the curve.",
    ),
    "trace": (
        "graphllm.cli.trace",
        "trace",
        "Build the model's op graph, verify and analyse it: params, token mixing, cost, memory.",
    ),
    "verify": ("graphllm.cli.verify", "verify", "Check an analysis against execution."),
    "run": (
        "graphllm.cli.run",
        "run",
        "Run a greedy generation on --nproc ranks over torch.distributed (gloo, or NCCL on GPUs).",
    ),
}


class LazyCommands(OneLineErrors):
    """A group whose commands are imported on first use; its help reads the table instead."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, attr, _ = COMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: Any) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyCommands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="graphllm")
def main() -> None:
    """graphllm: what a decoder-only LLM really computes, and what it costs."""


if __name__ == "__main__":
    main()
