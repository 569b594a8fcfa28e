"""`graphllm serving`: time to first token, time per output token and tokens/s of its replicas
under continuous batching, the largest batch their KV caches hold, and the curve over batch
sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource
from rich.table import Table

from graphllm.cli.common import (
    device_options,
    frontend_option,
    json_option,
    mla_option,
    model_options,
    resolve,
    traced_source,
    traced_workloads,
    user_errors,
)
from graphllm.cli.layout import strategy_from, strategy_options
from graphllm.errors import ConfigError
from graphllm.files import check_target, json_text
from graphllm.models.config import load_workload_section
from graphllm.models.hardware import Hardware, load_hardware
from graphllm.models.workload import Workload
from graphllm.report.console import console as new_console
from graphllm.report.serving import MEMORY_FRACTION, plot_curve, serving_report
from graphllm.report.summary import _b, _t
from graphllm.trace.model import traced_graph

DTYPES = ("weight_dtype", "act_dtype", "kv_dtype")


@click.command("serving")
@model_options
@strategy_options
@device_options()
@click.option("--prompt-len", type=click.IntRange(min=1), default=1024, show_default=True)
@click.option("--output-len", type=click.IntRange(min=1), default=256, show_default=True)
@click.option(
    "--memory-fraction",
    type=click.FloatRange(0, 1, min_open=True),
    default=MEMORY_FRACTION,
    show_default=True,
    help="Share of device memory for weights and KV cache (vLLM's gpu_memory_utilization).",
)
@mla_option()
@frontend_option
@click.option("--plot", "plot_path", type=click.Path(path_type=Path), help="Draw the curve.")
@json_option
@user_errors
def serving(
    hardware: str,
    attention: str,
    prompt_len: int,
    output_len: int,
    memory_fraction: float,
    mla: str,
    frontend: str,
    plot_path: Path | None,
    as_json: bool,
    **options: Any,
) -> None:
    """Serving figures: TTFT, time per output token, tokens/s, the largest batch, the curve."""
    _require_requests(options)
    if plot_path is not None:
        check_target(plot_path)
    ctx = click.get_current_context()
    given = ctx.get_parameter_source("microbatches") is not ParameterSource.DEFAULT
    batch = options.get("batch")
    path = options.get("config_path")
    section = load_workload_section(path) if path is not None else {}
    # a workload section describes one forward pass, not the requests a server takes; its dtypes
    # still apply, its shape is said to be unused once the figures are out
    unused = [k for k in ("batch", "seq_len", "past_len", "logits") if k in section]
    strategy = strategy_from(options)
    config, wl = _model(options, frontend)
    hw = load_hardware(hardware)
    doc = serving_report(
        config,
        wl,
        strategy,
        hw,
        prompt=prompt_len,
        output=output_len,
        batch=batch,
        attention=attention,
        memory_fraction=memory_fraction,
        microbatches_given=given,
        mla=mla,
    )
    if plot_path is not None:
        plot_curve(doc, plot_path)
    if unused:
        click.echo(
            f"note: serving takes the requests from --prompt-len, --output-len and --batch; "
            f"{path}'s workload {', '.join(unused)} are not used",
            err=True,
        )
    if as_json:
        click.echo(json_text(doc, indent=2))
        return
    print_serving(doc, hw)
    if plot_path is not None:
        click.echo(f"wrote {plot_path}")


def _model(options: dict[str, Any], frontend: str) -> tuple[Any, Workload]:
    """The config and base workload (its dtypes) to serve: built, or traced from transformers'
    code (--frontend), each step then traced at its own shape."""
    traced = traced_source(options, frontend)
    if traced is None:
        return resolve(options)
    raw, name = traced
    wl = traced_workloads(options, raw)[0]
    one_token = Workload(**{k: getattr(wl, k) for k in DTYPES})  # traced for its config alone
    return traced_graph(raw, one_token, name).meta["config"], wl


def _require_requests(options: dict[str, Any]) -> None:
    """One line for a forward pass's flags where serving takes requests."""
    if options.get("seq_len") or options.get("past_len") is not None:
        raise ConfigError("serving takes --prompt-len and --output-len, not --seq-len/--past-len")
    if options.get("logits") == "all":
        raise ConfigError(
            "serving computes the last position's logits, as a server does: drop --logits all"
        )


def print_serving(doc: dict[str, Any], hw: Hardware) -> None:
    """The serving document as the command prints it."""
    con = new_console()
    con.print(
        f"[bold]{doc['model']}[/bold] on {doc['devices']} {doc['hardware']} "
        f"({doc['strategy']}), {doc['prompt']} tokens in, {doc['output']} out"
    )
    kv, state = doc["kv_bytes_per_sequence_per_device"], doc["state_bytes_per_sequence_per_device"]
    con.print(
        f"KV cache: {_b(doc['kv_capacity_bytes_per_device'])} a device after "
        f"{_b(doc['weight_bytes_per_device'])} of weights, "
        + (
            f"{_b(kv + state)} a sequence ({_b(kv)} of keys and values, {_b(state)} of conv "
            "and recurrent state)"
            if state
            else f"{_b(kv)} a sequence"
        )
        + f": at most {doc['max_batch']} sequences"
        + (f" over {doc['replicas']} replicas" if doc["replicas"] > 1 else "")
    )
    con.print(
        f"B={doc['batch']}: time to first token {_t(doc['ttft_seconds'])}, time per output "
        f"token {_t(doc['tpot_seconds'])}, {doc['tokens_per_second_per_user']:,.1f} tokens/s "
        f"per user, {doc['tokens_per_second']:,.0f} tokens/s in all"
    )
    table = Table("batch", "time per output token", "tokens/s per user", "tokens/s in all")
    for p in doc["curve"]:
        table.add_row(
            str(p["batch"]),
            _t(p["tpot_seconds"]),
            f"{p['tokens_per_second_per_user']:,.1f}",
            f"{p['tokens_per_second']:,.0f}",
        )
    con.print(table)
    con.print(
        "continuous batching as a steady state: each decode step also prefills batch / "
        "output-len prompts; queueing is not modelled"
    )
    _print_layout(doc, con)
    if "mla" in doc:
        m = doc["mla"]
        con.print(f"MLA: {m['prefill']} for prefill, {m['decode']} for decode ({m['why']})")
    con.print(_times_line(hw))


def _print_layout(doc: dict[str, Any], con: Any) -> None:
    """How replicas, stages and cp ranks share the work, where there are several."""
    if doc["replicas"] > 1 or doc["pipeline_stages"] > 1:
        m, chunks = doc["microbatches_in_flight"], doc["prefill_chunks"]
        prefill = (
            "the sum of the stages' prefill"
            if chunks == 1
            else f"the prompt in {chunks} chunks pipelined over the stages, with the fill"
        )
        con.print(
            f"{doc['replicas']} replica(s) of {doc['pipeline_stages']} stage(s), batch / "
            f"replicas sequences each: time to first token is {prefill}; {m} microbatches in "
            f"flight, a token every max({m} x the slowest stage's step, the stages' sum)"
        )
    if doc["context_parallel"] > 1:
        cp = doc["context_parallel"]
        combine = max(st["cp_combine_seconds"] for st in doc["stages"])
        con.print(
            f"cp {cp}: the prompt's tokens split over {cp} ranks for prefill; at decode each "
            f"holds 1/{cp} of every sequence's cache, attends over it and all-gathers the "
            f"partial outputs and LSEs ({_t(combine)} a step on the slowest stage)"
        )


def _times_line(hw: Hardware) -> str:
    """Which rate model the times come from."""
    if hw.rate_model == "ideal":
        return "times: ideal model (data-sheet peaks, no latencies or launch costs)"
    if hw.rate_model == "calibrated":
        return "times: calibrated model (graphllm calibrate's tables); --ideal for peaks"
    return "times: achievable model (measured rates, latencies, launches); --ideal for peaks"
