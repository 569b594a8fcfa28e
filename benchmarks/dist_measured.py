"""`graphllm run`'s measured over predicted seconds on `--hardware local`.

First `graphllm calibrate --link` measures this machine (its GEMM table at the model's shapes,
its read sweep, and the gloo link between one rank a core), into a private cache folder, so
the user's own figures of the machine are left alone. Then, for a few rounds, each strategy in
turn (tp 2, pp 2: two ranks, since collectives are timed with no more ranks than cores and the
machine this was written on has 2), `graphllm run --hardware local --json` on the model of
docs/measured.md: a Llama of d = 512, 4 layers, 8 heads (4 K/V), FFN 1536, vocab 8192, B = 1,
a 64-token prompt and 16 new tokens, seeded random weights.

Printed per strategy and step kind (prefill; decode, the median over its steps): the
measured / predicted ratio of the compute, of each collective kind (its seconds per step, and
its median call as the last rank to reach it timed it, `KIND:last`, which leaves the wait
for the peers out) and of the whole step; each the median over the rounds of `run`'s ratio (itself the
median over the ranks). Beside them, the load average each round ended with: the machine may
be shared, and its load moves every figure.

    python benchmarks/dist_measured.py [--rounds 3] [--strategies tp2,pp2] [--seq-len 64]
        [--new-tokens 16] [--runtime auto] [--repeats 9] [--config FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

# docs/measured.md's model, as a config.json
MODEL = {
    "model_type": "llama",
    "vocab_size": 8192,
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}
STRATEGIES = {"tp2": ("--tp", "2"), "pp2": ("--pp", "2")}
RANKS = 2
STEPS = ("prefill", "decode")


def graphllm(args: list[str], env: dict[str, str]) -> str:
    """The command's stdout; its error line, and exit 2, where it fails."""
    done = subprocess.run(
        [sys.executable, "-m", "graphllm.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"status {done.returncode}"])[-1]
        raise SystemExit(f"graphllm {' '.join(args[:1])} failed: {why}")
    return done.stdout


def calibrate_args(config: Path, repeats: int, threads: int, quick: bool) -> list[str]:
    """calibrate --link at the model's GEMM shapes and at one rank's share of the cores (what
    each rank computes with); `quick`: the tests' tiny sweeps."""
    args = ["calibrate", "--config", str(config), "--dtype", "fp32", "--link"]
    args += ["--repeats", str(repeats), "--threads", str(threads)]
    return args + (["--quick", "--link-max", str(1 << 20)] if quick else [])


def run_args(config: Path, strategy: str, seq_len: int, new_tokens: int, runtime: str) -> list[str]:
    return [
        "run",
        "--config",
        str(config),
        *STRATEGIES[strategy],
        "-t",
        str(seq_len),
        "--new-tokens",
        str(new_tokens),
        "--runtime",
        runtime,
        "--hardware",
        "local",
        "--json",
    ]


def ratios_of(measured: dict[str, Any]) -> dict[str, dict[str, float]]:
    """One run's ratios per step kind: `compute`, `step` and each collective kind per step,
    and each collective kind's median call as the last rank to reach it timed it, as
    `KIND:last`."""
    out: dict[str, dict[str, float]] = {}
    for step in STEPS:
        per_step = measured["ratios"].get(step, {})
        if not per_step:
            continue
        row = dict(per_step)
        for kind, r in measured["last_ratios"].get(step, {}).items():
            row[f"{kind}:last"] = r
        out[step] = row
    return out


def medians(rounds: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """Per step kind and kind, the median over the rounds that have it."""
    out: dict[str, dict[str, float]] = {}
    for step in STEPS:
        kinds: dict[str, list[float]] = {}
        for r in rounds:
            for kind, value in r.get(step, {}).items():
                if value is not None:
                    kinds.setdefault(kind, []).append(value)
        if kinds:
            out[step] = {k: statistics.median(v) for k, v in kinds.items()}
    return out


def _order(kind: str) -> tuple[int, str]:
    return ({"compute": 0, "step": 2}.get(kind, 1), kind)


def table(
    results: dict[str, list[dict[str, dict[str, float]]]], loads: dict[str, list[float]]
) -> list[str]:
    """One line a strategy, step kind and kind: the median ratio, the rounds, the loads."""
    lines = ["strategy  step     kind                     measured/predicted  rounds  load"]
    for strategy, rounds in results.items():
        load = loads[strategy]
        span = f"{min(load):.2f}-{max(load):.2f}" if load else "-"
        for step, kinds in medians(rounds).items():
            for kind in sorted(kinds, key=_order):
                lines.append(
                    f"{strategy:9s} {step:8s} {kind:24s} {kinds[kind]:18.2f}  "
                    f"{len(rounds):6d}  {span}"
                )
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--runtime", default="auto", choices=("auto", "numpy", "onnxruntime"))
    ap.add_argument("--repeats", type=int, default=9, help="calibrate's repeats")
    ap.add_argument("--config", type=Path, help="another model (default: docs/measured.md's)")
    ap.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)  # tests
    args = ap.parse_args(argv)
    strategies = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or args.rounds < 1:
        ap.error(f"strategies are {', '.join(STRATEGIES)}; rounds at least 1")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    with tempfile.TemporaryDirectory(prefix="graphllm-dist-measured-") as tmp:
        config = args.config or Path(tmp, "config.json")
        if args.config is None:
            config.write_text(json.dumps(MODEL))
        env = os.environ | {"XDG_CACHE_HOME": str(Path(tmp, "cache"))}
        print(
            f"{RANKS} ranks on {cores} cores"
            + (" (oversubscribed: the ratios hold waits for a core)" if cores < RANKS else "")
            + f"; load average {os.getloadavg()[0]:.2f} at the start"
        )
        threads = max(1, cores // RANKS)
        out = graphllm(calibrate_args(config, args.repeats, threads, args.quick), env)
        print(out.strip())
        results: dict[str, list[dict[str, dict[str, float]]]] = {s: [] for s in strategies}
        loads: dict[str, list[float]] = {s: [] for s in strategies}
        for k in range(args.rounds):
            for strategy in strategies:
                run = run_args(config, strategy, args.seq_len, args.new_tokens, args.runtime)
                doc = json.loads(graphllm(run, env))
                results[strategy].append(ratios_of(doc["measured"]))
                loads[strategy].append(doc["measured"]["load_average"][0])
                print(f"round {k + 1}: {strategy} done, load average {loads[strategy][-1]:.2f}")
    print("\n".join(table(results, loads)))
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
