"""`graphllm run --hardware NAME [--trace FILE]`: the run's timings beside the partition report's
prediction on a device (graphllm/report/dist_measured.py), as a table, in --json, and as a trace.

Kept apart from graphllm/cli/run.py, which calls these three functions, so that each grows alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from graphllm.errors import ConfigError
from graphllm.exporters.trace import write_trace
from graphllm.files import check_target
from graphllm.models.config import load_config
from graphllm.models.hardware import Hardware, load_hardware
from graphllm.report.dist_measured import compare, public, table_lines, trace


def measured_options(f: Callable) -> Callable:
    """--hardware and --trace, the options of the comparison."""
    f = click.option(
        "--trace",
        "trace_path",
        type=click.Path(path_type=Path),
        help="Write a Perfetto trace (FILE.json): each rank's measured lanes beside the "
        "partition report's predicted ones (needs --hardware).",
    )(f)
    return click.option(
        "--hardware",
        help="Print the measured seconds per step and collective kind beside the partition "
        "report's on this device (local: this machine, after `graphllm calibrate --link`).",
    )(f)


def prepare(
    hardware: str | None, trace_path: Path | None, source: Path | None, devices: int
) -> Hardware | None:
    """The device to predict on, refused before the run rather than after it."""
    if trace_path is not None:
        if hardware is None:
            raise ConfigError("--trace draws the prediction beside the run: give --hardware NAME")
        check_target(trace_path, inputs=(source,) if source else ())
    hw = load_hardware(hardware) if hardware else None
    if hw is not None and devices > 1 and hw.interconnect_bandwidth is None:
        how = "graphllm calibrate --link" if hw.name == "local" else "a spec with a link"
        raise ConfigError(
            f"--hardware {hardware} has no link between devices to predict the collectives on: "
            f"time one first ({how})"
        )
    return hw


def measure(
    doc: dict[str, Any], hw: Hardware | None, trace_path: Path | None, mla: str
) -> list[str]:
    """Add the comparison to the run's `doc` (under `measured`), write the trace; the lines to
    print (none without a device)."""
    if hw is None:
        return []
    cmp = compare(load_config(doc["source"]), doc["ranks"], hw, batch=doc["batch"], mla=mla)
    doc["measured"] = public(cmp)
    lines = table_lines(doc["measured"])
    if trace_path is not None:
        write_trace(trace_path, trace(cmp, doc["ranks"], hw))
        lines.append(f"wrote {trace_path} (open in ui.perfetto.dev or chrome://tracing)")
    return lines
