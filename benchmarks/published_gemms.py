"""graphllm's GEMM times beside published GEMM microbenchmarks at LLM shapes
(benchmarks/published_gemms.yaml).

Each table is a run someone else published of M x K by K x N GEMMs (M the tokens, N x K a
weight) over a range of M: its rows quoted, with the device and the kernels. Beside each: the
time graphllm's roofline gives that matmul on the table's preset, and measured / predicted
(above 1: slower than predicted). The matmul is the query projection of a one-layer Llama whose
hidden size is K and whose heads give N, prefilled over M tokens in the table's dtype, and its
time is read from the roofline pass itself (the tile-and-wave efficiency, the streaming
bandwidth, the launch of a kernel that streams a weight), so what is checked is the model every
command uses.

It prints each table's rows and the median ratio, and the median over all rows.

    python benchmarks/published_gemms.py [--table FILE] [--ideal] [--json]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.published_cli import published_main, read_tables  # noqa: E402
from graphllm import Workload, build_graph  # noqa: E402
from graphllm.models.config import config_from_dict  # noqa: E402
from graphllm.models.hardware import load_hardware  # noqa: E402
from graphllm.passes.registry import meta_result, run  # noqa: E402

IDEAL_HELP = "predict on the data-sheet peaks"
TABLE = Path(__file__).with_name("published_gemms.yaml")
REQUIRED = ("id", "gpus", "hardware", "n", "k", "what", "columns", "header", "source", "lines")
DTYPES = ("bf16", "fp16", "fp8")
HEAD_DIM = 128


def _columns(where: str, header: str) -> list[str]:
    """The TFLOP/s columns a header names, in order (after batch_size)."""
    unit = " (TFLOP/s (larger is better))"
    first, _, rest = header.partition(" ")
    names = [n.strip() for n in rest.split(unit) if n.strip()]
    if first != "batch_size" or not names or not rest.endswith(unit):
        raise SystemExit(f"{where}: its header must be batch_size and its TFLOP/s columns")
    return names


def _rows(where: str, t: dict[str, Any], names: list[str]) -> list[tuple[int, str, float, str]]:
    """(M, dtype, measured seconds, quoted line) of each mapped column of each row. A row
    has every column, or ends in `...` where the source cuts it short (then the columns it has)."""
    out = []
    for line in str(t["lines"]).splitlines():
        f = line.split()
        if not f:
            continue
        cut = f[-1] == "..."
        values = f[2:-1] if cut else f[2:]
        if len(values) > len(names) or (not cut and len(values) != len(names)):
            raise SystemExit(f"{where}: a row of {len(values)} values for {len(names)}: {line!r}")
        try:
            m, tflops = float(f[1]), [float(v) for v in values]
        except (IndexError, ValueError):
            raise SystemExit(f"{where}: not a row of numbers: {line!r}") from None
        if m != int(m) or m < 1 or any(x <= 0 for x in tflops):
            raise SystemExit(f"{where}: M a whole count, TFLOP/s above 0: {line!r}")
        for col, dtype in t["columns"].items():
            i = names.index(col)
            if i < len(tflops):
                secs = 2 * int(m) * t["n"] * t["k"] / (tflops[i] * 1e12)
                out.append((int(m), dtype, secs, line.removesuffix("...").strip()))
    if not out:
        raise SystemExit(f"{where}: no measurement in its rows")
    return out


def _check(where: str, t: dict[str, Any]) -> None:
    if not all(type(t[k]) is int and t[k] > 0 for k in ("n", "k")) or t["n"] % HEAD_DIM:
        raise SystemExit(f"{where}: n and k must be whole numbers, n a multiple of {HEAD_DIM}")
    names = _columns(where, str(t["header"]))
    if not isinstance(t["columns"], dict) or not t["columns"]:
        raise SystemExit(f"{where}: columns must map a column to a dtype")
    for col, dtype in t["columns"].items():
        if col not in names or dtype not in DTYPES:
            raise SystemExit(f"{where}: column {col!r} -> {dtype!r}")
    t["rows"] = _rows(where, t, names)


def load_tables(path: Path = TABLE) -> list[dict[str, Any]]:
    """The tables, each checked, with its rows as (M, dtype, measured seconds, quoted line)."""
    return read_tables(path, REQUIRED, _check)


def predict_seconds(table: dict[str, Any], m: int, dtype: str) -> float:
    """The roofline's time of the M x K by K x N matmul in `dtype` on the table's preset."""
    heads = table["n"] // HEAD_DIM
    cfg = config_from_dict(
        {
            "model_type": "llama",
            "vocab_size": 256,
            "hidden_size": table["k"],
            "num_hidden_layers": 1,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "head_dim": HEAD_DIM,
            "intermediate_size": 256,
        },
        "gemm",
    )
    wl = Workload(batch=1, seq_len=m, weight_dtype=dtype, act_dtype=dtype, kv_dtype=dtype)
    g = build_graph(cfg, wl)
    run(g, ["cost", "roofline"], hardware=load_hardware(table["hardware"]))
    return meta_result(g["model.layers.0.self_attn.q_proj"], "time").seconds


def compare(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each table with its rows' predictions and ratios and their median."""
    out = []
    for t in tables:
        rows = []
        for m, dtype, measured, line in t["rows"]:
            predicted = predict_seconds(t, m, dtype)
            rows.append(
                {
                    "m": m,
                    "dtype": dtype,
                    "measured_us": measured * 1e6,
                    "predicted_us": predicted * 1e6,
                    "ratio": measured / predicted,
                    "quote": line.strip(),
                }
            )
        out.append(
            {k: v for k, v in t.items() if k not in ("lines", "rows")}
            | {"rows": rows, "median_ratio": statistics.median(r["ratio"] for r in rows)}
        )
    return out


def document(results: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["ratio"] for t in results for r in t["rows"]]
    return {"tables": results, "median_ratio": statistics.median(ratios), "rows": len(ratios)}


def print_tables(results: list[dict[str, Any]], model: str) -> None:
    print(f"GEMM microbenchmarks against graphllm's {model} roofline; ratio = measured / predicted")
    for t in results:
        print(f"\n[{t['id']}] {t['gpus']}")
        print(f"  N = {t['n']}, K = {t['k']} on {t['hardware']}: {t['what']}")
        print(f"  {'M':>5} {'dtype':>5} {'measured us':>12} {'predicted us':>13} {'ratio':>6}")
        for r in t["rows"]:
            print(
                f"  {r['m']:>5} {r['dtype']:>5} {r['measured_us']:>12.2f} "
                f"{r['predicted_us']:>13.2f} {r['ratio']:>6.2f}"
            )
        print(f"  median ratio: {t['median_ratio']:.2f}")
        print(f"  source: {t['source']}")
    d = document(results)
    print(f"\nmedian of measured/predicted over {d['rows']} GEMMs: {d['median_ratio']:.2f}")


load, show = load_tables, print_tables


def main(argv: list[str] | None = None) -> int:
    return published_main(argv, sys.modules[__name__])


if __name__ == "__main__":
    sys.exit(main())
