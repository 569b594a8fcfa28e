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

from benchmarks.published_cli import published_main  # noqa: E402
from graphllm import Workload, build_graph  # noqa: E402
from graphllm.models.config import config_from_dict  # noqa: E402
from graphllm.models.hardware import load_hardware  # noqa: E402
from graphllm.models.parse import read_mapping  # noqa: E402
from graphllm.passes.registry import meta_result, run  # noqa: E402

IDEAL_HELP = "predict on the data-sheet peaks"
TABLE = Path(__file__).with_name("published_gemms.yaml")
REQUIRED = ("id", "gpus", "hardware", "n", "k", "what", "columns", "header", "source", "lines")
DTYPES = ("bf16", "fp16", "fp8")
HEAD_DIM = 128


def load_tables(path: Path = TABLE) -> list[dict[str, Any]]:
    """The tables, each checked, with its rows as (M, dtype, measured seconds, quoted line)."""
    tables = read_mapping(path)["tables"]
    for t in tables:
        missing = [k for k in REQUIRED if k not in t]
        if missing:
            raise SystemExit(f"{path}: table {t.get('id', '?')} lacks {', '.join(missing)}")
        if not str(t["source"]).startswith("https://"):
            raise SystemExit(f"{path}: table {t['id']}: source must be a URL")
        if t["n"] % HEAD_DIM:
            raise SystemExit(f"{path}: table {t['id']}: n must be a multiple of {HEAD_DIM}")
        names = t["header"].split(" (TFLOP/s (larger is better)) ")
        names[-1] = names[-1].removesuffix(" (TFLOP/s (larger is better))")
        if names[0].split()[0] != "batch_size":
            raise SystemExit(f"{path}: table {t['id']}: its header must start with batch_size")
        names = [names[0].split()[1], *names[1:]]  # the TFLOP/s columns, in order
        for col, dtype in t["columns"].items():
            if col not in names or dtype not in DTYPES:
                raise SystemExit(f"{path}: table {t['id']}: column {col!r} -> {dtype!r}")
        t["rows"] = []
        for line in t["lines"].splitlines():
            f = line.split()
            if not f:
                continue
            m = float(f[1])
            if m != int(m) or m < 1:
                raise SystemExit(f"{path}: table {t['id']}: M must be a whole count: {line!r}")
            for col, dtype in t["columns"].items():
                i = 2 + names.index(col)
                if i < len(f):  # a row the source cuts short gives the columns it has
                    tflops = float(f[i])
                    secs = 2 * int(m) * t["n"] * t["k"] / (tflops * 1e12)
                    t["rows"].append((int(m), dtype, secs, line))
    return tables


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
