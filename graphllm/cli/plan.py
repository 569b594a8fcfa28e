"""`graphllm plan`: the legal parallel layouts of N devices, those that fit ranked by time."""

from __future__ import annotations

import math
from typing import Any

import click
from rich.table import Table

from graphllm.cli.common import (
    ATTENTION_HELP,
    attention_option,
    frontend_option,
    hardware_option,
    json_option,
    mla_option,
    model_options,
    resolve,
    traced_model,
    traced_source,
    user_errors,
)
from graphllm.cli.layout import training_from, training_options
from graphllm.cli.progress import bar, showing
from graphllm.errors import ConfigError
from graphllm.files import json_text
from graphllm.frontends import is_traced
from graphllm.models.hardware import load_hardware
from graphllm.passes.parallel.engine import mla_form, mla_why
from graphllm.passes.parallel.plan import TRACED_NO_PP
from graphllm.passes.parallel.plan import plan as make_plan
from graphllm.passes.training import TrainingOptions
from graphllm.report.console import console as new_console
from graphllm.report.fit import fewest_devices, one_device
from graphllm.report.summary import _b, _t, hardware_model_line


@click.command()
@model_options
@click.option("--devices", "-n", type=int, required=True, help="Devices to lay the model out on.")
@hardware_option("h100")
@training_options
@attention_option(ATTENTION_HELP)
@click.option("--top", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--tp", type=click.IntRange(min=1), help="Pin the tensor parallel size.")
@click.option("--cp", type=click.IntRange(min=1), help="Pin the context parallel size.")
@click.option("--pp", type=click.IntRange(min=1), help="Pin the pipeline stages.")
@click.option("--ep", type=click.IntRange(min=1), help="Pin the expert parallel size.")
@click.option("--dp", type=click.IntRange(min=1), help="Pin the data parallel size.")
@mla_option()
@frontend_option
@json_option
@user_errors
def plan(
    devices: int,
    hardware: str,
    attention: str,
    top: int,
    mla: str,
    frontend: str,
    as_json: bool,
    **options: Any,
) -> None:
    """Enumerate TP x CP x PP x EP x DP layouts of --devices, drop those that do not fit, rank the
    rest by predicted time (a decoded token, a prefill, or a training step)."""

    pinned = {k: options.pop(k) for k in ("tp", "cp", "pp", "ep", "dp")}
    training = training_from(options)
    config, wl = _model(options, frontend, mla, training is not None)
    hw = load_hardware(hardware)
    with bar(f"planning {devices} devices: layouts", showing(as_json)) as told:
        report = make_plan(config, wl, devices, hw, training, attention, pinned, told, mla)
    if not report.candidates:
        raise ConfigError(_none_fits(report, config, wl, hw, training, attention, pinned, mla))
    doc = {
        "model": {"name": config.name, "model_type": config.model_type},
        "workload": wl.to_dict() | {"attention": attention, "training": training is not None},
        "hardware": hw.to_dict(),
        "rate_model": hw.rate_model,
        "training": None if training is None else training.__dict__,
        "plan": report.to_dict(),
    }
    if is_traced(config):
        doc["model"]["frontend"] = config.frontend
        doc["notes"] = [TRACED_NO_PP]
    if config.is_mla:
        form = mla_form(config, report.phase, mla)
        doc["mla"] = {"form": form, "why": mla_why(mla)}
    if as_json:
        click.echo(json_text(doc, indent=2))
    else:
        print_plan(doc, top)


def _model(options: dict[str, Any], frontend: str, mla: str, training: bool) -> tuple[Any, Any]:
    """The config and workload to plan: built, or traced from transformers' code (--frontend),
    its layouts cut as transformers' own parallel plans say."""
    traced = traced_source(options, frontend)
    if traced is None:
        return resolve(options)
    graph, wl = traced_model(traced, options, "plan", mla, "training" if training else "")
    return graph.meta["config"], wl


def _none_fits(
    report: Any,
    config: Any,
    wl: Any,
    hw: Any,
    training: TrainingOptions | None,
    attention: str,
    pinned: dict[str, int | None],
    mla: str,
) -> str:
    """Why no layout of the plan's devices was kept (plan itself refuses a count with no legal
    layout), and the fewest devices that hold the model with the sizes pinned."""
    n = report.devices
    small = report.too_big[0]  # plan lists them smallest first
    head = (
        f"no layout of {n} {hw.name} fits {config.name}: the smallest, "
        f"{describe(small['strategy'])}, needs {_b(small['memory_bytes'])} a device of "
        f"{_b(hw.memory_bytes)}"
    )
    if is_traced(config):  # the search below enumerates a built family's layouts
        return f"{head}; give more devices (-n)"
    # from what one device would need, as trace's count starts: no fewer devices can hold it
    whole = one_device(config, wl, hw, training, attention, mla)["memory_bytes"]
    low = max(n + 1, math.ceil(whole / hw.memory_bytes))
    pins = {k: v for k, v in pinned.items() if v}
    found = fewest_devices(config, wl, hw, low, training, attention, pins, mla)
    if isinstance(found, str):
        return f"{head} ({found})"
    more, best = found
    return f"{head}; {more} devices are the fewest that hold it ({describe(best['strategy'])})"


def describe(s: dict[str, Any]) -> str:
    parts = [f"{k}={s[k]}" for k in ("tp", "cp", "pp", "ep", "dp") if s[k] > 1]
    if s.get("sp"):
        parts.append("sp")
    if s["microbatches"] > 1:
        parts.append(f"mb={s['microbatches']}")
    return " ".join(parts) or "one device"


def print_plan(doc: dict[str, Any], top: int) -> None:

    con = new_console()
    p, w, hw = doc["plan"], doc["workload"], doc["hardware"]
    what = {"training": "training step", "prefill": "prefill", "decode": "decoded token"}[
        p["phase"]
    ]
    con.print(
        f"[bold]{doc['model']['name']}[/bold] on {p['devices']} {hw['name']} "
        f"({_b(hw['memory_bytes'])} each), B={w['batch']} T={w['seq_len']} P={w['past_len']}: "
        f"{len(p['candidates'])} layouts fit, {len(p['too_big'])} too big, "
        f"{len(p['illegal'])} illegal"
    )
    if doc.get("training"):
        t = doc["training"]
        con.print(f"training: Adam (fp32 state), recompute {t['recompute']}, ZeRO-{t['zero']}")
    table = Table(
        "#", "layout", "memory/device", f"time per {what}", "compute", "bubble", "main comm."
    )
    for i, c in enumerate(p["candidates"][:top], 1):
        mc = c["main_comm"]
        main = f"{mc['kind']} ({mc['mesh_axis']}) {_t(mc['seconds'])}" if mc["seconds"] else "none"
        table.add_row(
            str(i),
            describe(c["strategy"]),
            _b(c["memory_bytes"]),
            _t(c["seconds"]),
            _t(c["compute_seconds"]),
            f"{100 * c['bubble']:.0f}%",
            main,
        )
    con.print(table)  # a plan with none that fits is refused before it is printed
    con.print(hardware_model_line(hw))
    if "mla" in doc:
        m = doc["mla"]
        con.print(f"MLA: {m['form']} for this {p['phase']} step ({m['why']})")
    for note in doc.get("notes", ()):
        con.print(f"note: {note}")
    if p["too_big"]:
        c = p["too_big"][0]
        con.print(
            f"dropped {len(p['too_big'])} that do not fit, the smallest {describe(c['strategy'])} "
            f"needs {_b(c['memory_bytes'])} > {_b(hw['memory_bytes'])}"
        )
    reasons: dict[str, int] = {}
    for x in p["illegal"]:
        reasons[x["reason"]] = reasons.get(x["reason"], 0) + 1
    for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])[:5]:
        con.print(f"illegal ({n}): {r}")
