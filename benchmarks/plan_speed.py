"""How fast `plan` searches: Llama-3-70B on 64 devices (the docs' case) and DeepSeek-V3 training on
256 H200s (5.6 s before the search was sped up, goal at most 2 s), median of a few runs, with the machine's
load average beside them (it is shared, so a figure means little without it) and the median CPU
time of the process and of the workers plan forks (which the other processes on the machine
inflate less). GRAPHLLM_JOBS=1 runs the programs in this process, one after the other.

    python benchmarks/plan_speed.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout
    sys.path.insert(0, str(ROOT))

from graphllm.forked import workers  # noqa: E402
from graphllm.models.config import load_config  # noqa: E402
from graphllm.models.hardware import load_hardware  # noqa: E402
from graphllm.models.workload import Workload  # noqa: E402
from graphllm.passes.parallel.plan import plan  # noqa: E402
from graphllm.passes.training import TrainingOptions  # noqa: E402

# (label, preset, devices, hardware, workload, training, goal in seconds or None)
CASES = [
    ("llama3-70b on 64 h100, inference", "llama3-70b", 64, "h100", Workload(), None, None),
    (
        "llama3-70b on 64 h100, training T=4096 B=64",
        "llama3-70b", 64, "h100", Workload(seq_len=4096, batch=64), TrainingOptions("selective"),
        None,
    ),
    (
        "deepseek-v3 on 256 h200, training T=4096 B=256",
        "deepseek-v3", 256, "h200", Workload(seq_len=4096, batch=256), TrainingOptions(), 2.0,
    ),
]  # fmt: skip


def _cpu() -> float:
    """CPU seconds of this process and of its workers that have ended (plan forks them, in
    passes/parallel/plan.py, and waits for them)."""
    me, done = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + done.ru_utime + done.ru_stime


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    for label, preset, n, hw_name, wl, training, goal in CASES:
        cfg, hw = load_config(preset), load_hardware(hw_name)
        plan(cfg, wl, n, hw, training)  # warm: imports, caches
        times, cpu = [], []
        for _ in range(args.repeats):
            t, c = time.perf_counter(), _cpu()
            r = plan(cfg, wl, n, hw, training)
            times.append(time.perf_counter() - t)
            cpu.append(_cpu() - c)  # less than the wall time under load, more with workers
        med = statistics.median(times)
        load = os.getloadavg()[0]
        tried = len(r.candidates) + len(r.too_big) + len(r.illegal)
        verdict = (
            "" if goal is None else (" pass" if med <= goal else " MISSED") + f" (<= {goal} s)"
        )
        print(
            f"{label}: {med:.2f} s median of {args.repeats} (CPU {statistics.median(cpu):.2f} s, "
            f"workers: up to {workers(10**6, 1)}), {tried} layouts; load {load:.1f}{verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
