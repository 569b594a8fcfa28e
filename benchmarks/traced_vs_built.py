"""The traced frontend against graphllm's hand-built families, on every preset at full size.

For each preset (a published config of a family graphllm builds), the graph is built and traced
at the same workload (a quantized checkpoint's as it stores its weights, in both), and the two
are compared: parameters (total), matmul FLOPs as transformers'
code computes them (every (query, key) pair), KV cache bytes, weight bytes, and the ops the tokens
pass finds mixing. The times of both are printed beside them; a difference is one line.

    python benchmarks/traced_vs_built.py [--only llama3.2-1b,qwen3-0.6b] [-t 128] [--past-len 0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

from graphllm.build.builder import build_graph
from graphllm.errors import GraphllmError
from graphllm.models.config import load_config, preset_names, read_config_source
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.trace import traced_graph

PASSES = ["params", "tokens", "cost", "memory"]


def compare(name: str, wl: Workload) -> dict[str, Any]:
    raw, _ = read_config_source(name)
    start = time.perf_counter()
    built = build_graph(load_config(raw), wl)
    t_built = time.perf_counter() - start
    start = time.perf_counter()
    traced = traced_graph(raw, wl, name)
    t_traced = time.perf_counter() - start
    b, t = run(built, PASSES, exact_sets=False), run(traced, PASSES, exact_sets=False)
    figures = {
        "params": (b["params"].total, t["params"].total),
        "matmul": (b["cost"].flops["matmul"], t["cost"].flops["matmul"]),
        "kv_cache": (b["memory"].kv_cache, t["memory"].kv_cache),
        "weights": (b["memory"].weights, t["memory"].weights),
        "mixing": (
            sorted(b["tokens"].to_dict()["mixing_ops"]),
            sorted(t["tokens"].to_dict()["mixing_ops"]),
        ),
    }
    return {"preset": name, "built_s": t_built, "traced_s": t_traced, "figures": figures}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated presets")
    ap.add_argument("-t", type=int, default=128)
    ap.add_argument("--past-len", type=int, default=0)
    args = ap.parse_args()
    names = args.only.split(",") if args.only else preset_names()
    wl = Workload(seq_len=args.t, past_len=args.past_len)
    same = 0
    ratios = []
    for name in names:
        try:
            row = compare(name, wl)
        except GraphllmError as e:
            print(f"{name:34} FAIL {str(e)[:140]}")
            continue
        diffs = [k for k, (x, y) in row["figures"].items() if x != y]
        same += not diffs
        ratios.append(row["traced_s"] / row["built_s"])
        what = (
            "same"
            if not diffs
            else "differs: "
            + ", ".join(f"{k} {row['figures'][k][0]} vs {row['figures'][k][1]}" for k in diffs)
        )
        print(
            f"{name:34} built {row['built_s']:5.2f}s traced {row['traced_s']:6.2f}s  {what[:200]}"
        )
    print(
        f"\n{same}/{len(names)} presets: the same params, matmul FLOPs, KV cache, weight bytes, mixing ops"
    )
    if ratios:
        print(f"median traced/built time: {statistics.median(ratios):.1f}x")


if __name__ == "__main__":
    sys.exit(main())
