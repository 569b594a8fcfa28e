"""`graphllm export`: the model as an ONNX file that onnxruntime runs (prefill and decode)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import click

from graphllm.cli_common import resolve, user_errors


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="HF config.json, a checkpoint folder, or a YAML file (default: the --weights folder).",
)
@click.option("--model", "preset", help="A preset name (see `graphllm presets`).")
@click.option(
    "--weights",
    type=click.Path(path_type=Path, file_okay=False),
    help="A transformers checkpoint folder (safetensors) to read the weights from.",
)
@click.option("--no-weights", is_flag=True, help="No weights: they become graph inputs (Netron).")
@click.option("--dtype", type=click.Choice(["fp32", "fp16"]), default="fp32", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of random weights.")
@click.option(
    "--logits",
    type=click.Choice(["all", "last"]),
    help="LM head for every new position, or the last only (as a server).",
)
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), required=True)
@user_errors
def export(
    config_path: Path | None,
    preset: str | None,
    weights: Path | None,
    no_weights: bool,
    dtype: str,
    seed: int,
    logits: str | None,
    output: Path,
) -> None:
    """Write the model as ONNX: dynamic batch and lengths, KV cache in and out, left padding.

    Weights are seeded random unless --weights names a checkpoint folder; past 2 GB they go to
    OUTPUT.data beside the model. The config and workload ride along in the model's metadata.
    """
    from graphllm.errors import ConfigError
    from graphllm.exporters.onnx import export_onnx

    if weights is not None and no_weights:
        raise ConfigError("give --weights DIR or --no-weights, not both")
    if weights is not None and config_path is None and preset is None:
        config_path = weights  # a checkpoint folder holds its config.json
    options: dict[str, Any] = {
        "config_path": config_path,
        "preset": preset,
        "batch": None,
        "seq_len": None,
        "past_len": None,
        "dtype": dtype,
        "weight_dtype": None,
        "act_dtype": None,
        "kv_dtype": None,
        "logits": logits,
    }
    config, workload = resolve(options)
    # a `kill` ends the export like Ctrl-C does: the partial files are removed on the way out
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    r = export_onnx(
        config,
        output,
        dtype=dtype,
        workload=workload,
        weights=weights,
        seed=seed,
        no_weights=no_weights,
    )
    data = f" + {r.data_path.name}" if r.data_path else ""
    size = "" if no_weights else f" ({r.weight_bytes / 1e9:.2f} GB)"
    click.echo(
        f"wrote {r.path}{data}: {config.name}, {dtype}, {r.nodes} ONNX nodes, "
        f"{r.params / 1e6:.1f}M params{size}, weights {r.weights}"
    )


def onnx_token_check(
    config: Any, seq_len: int, seed: int, shrink: bool, workload: Any = None
) -> Any:
    """`verify tokens --onnx`: the perturbation check run through onnxruntime."""
    from graphllm.runtime import check_token_mixing_onnx

    return check_token_mixing_onnx(config, seq_len, seed, shrink, workload)
