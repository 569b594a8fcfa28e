"""How long tracing a model takes: Llama-3.1-405B at full size (the preset's published config),
traced from transformers' code, first with no cache, then read back from the disk cache (the
graph lowered at that workload before; a workload not lowered before: the recording read and
lowered), beside building the same graph by hand; then the `trace` command end to end on the cached model
beside the built family's (one layer of each kind analysed, standing for the rest). Each figure is a median over fresh processes;
the imports (torch, transformers) are timed apart from the trace.

    python benchmarks/traced_speed.py [--model llama3.1-405b] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch, transformers  # noqa: F401
t1 = time.perf_counter()
from graphllm.build.builder import build_graph
from graphllm.models.config import load_config, read_config_source
from graphllm.models.workload import Workload
from graphllm.trace import traced_graph
raw, name = read_config_source(sys.argv[1])
wl = Workload(seq_len=int(sys.argv[2]))
t2 = time.perf_counter()
g = traced_graph(raw, wl, name)
t3 = time.perf_counter()
b = build_graph(load_config(sys.argv[1]), wl)
t4 = time.perf_counter()
print(json.dumps({"imports": t1 - t0, "trace": t3 - t2, "built": t4 - t3, "nodes": len(g)}))
"""


def run(model: str, cache: str, fresh: bool, seq_len: int = 128) -> dict:
    env = dict(os.environ, XDG_CACHE_HOME=cache, TRANSFORMERS_VERBOSITY="error")
    if fresh:
        env["GRAPHLLM_TRACE_CACHE"] = "0"
    out = subprocess.run(
        [sys.executable, "-c", CHILD, model, str(seq_len)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def command(model: str, cache: str, frontend: str) -> float:
    """Seconds of one `graphllm trace` run in a fresh process, imports and all."""
    env = dict(os.environ, XDG_CACHE_HOME=cache, TRANSFORMERS_VERBOSITY="error")
    argv = [
        sys.executable,
        "-m",
        "graphllm_entry",
        "trace",
        "--model",
        model,
        "--frontend",
        frontend,
    ]
    t0 = time.perf_counter()
    subprocess.run(argv, env=env, capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="llama3.1-405b")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        first = [run(args.model, cache, fresh=True) for _ in range(args.repeats)]
        run(args.model, cache, fresh=False)  # fills the cache
        cached = [run(args.model, cache, fresh=False) for _ in range(args.repeats)]
        other = [run(args.model, cache, False, 256 + i) for i in range(args.repeats)]
        cli = {
            f: statistics.median(command(args.model, cache, f) for _ in range(args.repeats))
            for f in ("traced", "built")
        }
    med = {k: statistics.median(r[k] for r in first) for k in ("imports", "trace", "built")}
    hit = statistics.median(r["trace"] for r in cached)
    lowered = statistics.median(r["trace"] for r in other)
    print(f"{args.model}: {first[0]['nodes']:,} nodes, medians of {args.repeats} fresh processes")
    print(
        f"  trace, no cache:     {med['trace']:.2f} s (imports of torch and transformers {med['imports']:.2f} s apart)"
    )
    print(f"  trace, disk cache:   {hit:.2f} s (a workload lowered before)")
    print(f"  trace, other T:      {lowered:.2f} s (the recording read, lowered at T)")
    print(f"  built by hand:       {med['built']:.2f} s")
    print(f"  cached / built:      {hit / med['built']:.1f}x")
    print("`graphllm trace` end to end (a fresh process: imports, graph, analyses, printing):")
    print(f"  traced, disk cache:  {cli['traced']:.2f} s")
    print(f"  built by hand:       {cli['built']:.2f} s")
    print(f"  traced / built:      {cli['traced'] / cli['built']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
