"""Pictures of a sweep over T: FLOPs, bytes and predicted time, and a roofline chart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from graphllm.errors import GraphllmError
from graphllm.files import write_atomic
from graphllm.models.hardware import Hardware


def pyplot_for(path: Path) -> tuple[Any, str]:
    """matplotlib's pyplot on the file-only Agg backend, and the picture format path's suffix names.

    Checked before anything is computed to draw, so a wrong suffix or a missing extra is one line.
    """
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg", "pdf"):
        raise GraphllmError(f"--plot {path}: give a .png, .svg or .pdf file")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        raise GraphllmError("--plot needs matplotlib: pip install 'graphllm[plot]'") from None
    return plt, fmt


def plot_sweep(rows: list[dict[str, Any]], path: Path, title: str, hw: Hardware | None) -> Path:
    """Left: FLOPs, bytes and time against T. Right: each op kind by arithmetic intensity."""
    plt, fmt = pyplot_for(path)
    fig, (ax, rf) = plt.subplots(1, 2, figsize=(12, 4.8))
    ts = [r["seq_len"] for r in rows]
    ax.loglog(ts, [r["flops"] for r in rows], "o-", label="FLOPs")
    ax.loglog(ts, [r["bytes"] for r in rows], "s-", label="bytes moved")
    ax.set_xlabel("new tokens T")
    ax.set_ylabel("FLOPs / bytes")
    if rows[0]["seconds"] is not None:
        tx = ax.twinx()
        tx.loglog(ts, [r["seconds"] for r in rows], "^--", color="tab:red", label="predicted time")
        tx.set_ylabel("seconds")
        tx.legend(loc="lower right")
    ax.legend(loc="upper left")
    ax.set_title(title)
    last = rows[-1]["by_op"]
    if hw is not None:
        peak, bw = hw.peak(rows[-1].get("act_dtype", "bf16")), hw.bandwidth()
        xs = [1e-2, peak / bw, 1e5]
        rf.loglog(xs, [min(peak, x * bw) for x in xs], "k-", label=f"{hw.name} roofline")
    for op, e in sorted(last.items()):
        flops = e.get("timed_flops", e["flops"])  # those the time was taken on
        if e["bytes"] and flops and e["seconds"]:
            rf.loglog(flops / e["bytes"], flops / e["seconds"], "o")
            rf.annotate(op, (flops / e["bytes"], flops / e["seconds"]), fontsize=7)
    rf.set_xlabel("arithmetic intensity (FLOP/byte)")
    rf.set_ylabel("attained FLOP/s")
    rf.set_title(f"op kinds at T={rows[-1]['seq_len']}")
    rf.legend(loc="lower right")
    fig.tight_layout()
    out = write_atomic(path, lambda p: fig.savefig(p, dpi=110, format=fmt))
    plt.close(fig)
    return out
