"""Readable terminal summaries (rich tables) of the documents in graphllm.report."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _n(x: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:g}"


def print_trace(doc: dict[str, Any], console: Console | None = None) -> None:
    """Model, workload, graph size and parameters by kind."""
    con = console or Console()
    m, w, g, p = doc["model"], doc["workload"], doc["graph"], doc["params"]
    con.print(f"[bold]{m['name']}[/bold] ({m['model_type']})")
    con.print(
        f"workload: {w['phase']}, B={w['batch']} T={w['seq_len']} P={w['past_len']} "
        f"(S={w['key_len']}); weights {w['weight_dtype']}, activations {w['act_dtype']}, "
        f"KV cache {w['kv_dtype']}"
    )
    con.print(f"graph: {g['nodes']} nodes, {g['edges']} edges")
    table = Table("parameters", "count", "share", title=None)
    total = p["total"] or 1
    for kind, count in p["by_kind"].items():
        if count:
            table.add_row(kind, f"{count:,} ({_n(count)})", f"{100 * count / total:.1f}%")
    table.add_row("[bold]total[/bold]", f"[bold]{p['total']:,}[/bold] ({_n(p['total'])})", "")
    table.add_row("active per token", f"{p['active']:,} ({_n(p['active'])})", "")
    con.print(table)
    if "token_mixing" in doc:
        print_token_mixing(doc["token_mixing"], con)


def print_token_mixing(tm: dict[str, Any], con: Console) -> None:
    """Which ops mix token positions, and how far the last position reaches."""
    names = tm["nodes"]
    ops = ", ".join(tm["mixing_ops"]) or "none"
    con.print(f"token mixing: {len(names)} nodes mix positions (ops: {ops}); all others are local")
    layers = tm["per_layer"]
    reach = ", ".join(str(r["reach"]) for r in layers[:8]) + (" ..." if len(layers) > 8 else "")
    con.print(
        f"receptive field of the last position: {tm['receptive_field']} input positions "
        f"(per layer: {reach})"
    )
