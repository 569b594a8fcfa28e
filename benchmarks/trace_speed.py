"""How fast graphllm traces a large model, against the peer path (transformers on the meta device).

For each model (batch 1, T=2048 prefill):

- graphllm: what `trace` runs, `trace_document(config, Workload(seq_len=2048), h100)`: the
  passes on one layer of each kind, rolled up to every layer (report/reuse.py); with `--full`
  or a `--passes` subset, `build_graph` + `passes.run(graph, PASSES)` on the full graph;
- beside it, with all of trace's passes, the Python API's two ways to the same reports:
  `graphllm.analyse(config, workload, h100)` (one layer of each kind, the goal is 50 ms) and
  `build_graph` + `passes.run` on the full graph;
- peer: `AutoModelForCausalLM.from_config(...)` under `torch.device("meta")` (sdpa attention, MoE
  experts as `batched_mm`) + one forward of input_ids (1, 2048) under `FlopCounterMode`, timed
  together, since a user of that path pays both.

Config loading is outside the timed region on both sides. Each side runs once to warm up, then
`--repeats` times; the table shows medians. Also reported: FlopCounterMode's total FLOPs, graphllm's
parameter total against the meta model's `sum(p.numel())`, and the wall time of
`python -c "import graphllm"` and `graphllm --help` against the 0.5 s start-up goal.

Missed goals are reported, not fatal: the exit status is 1 only when something crashes.

    python benchmarks/trace_speed.py [--repeats 5] [--models llama3.1-405b,mixtral-8x22b]
                                     [--passes verify,params] [--json] [--profile] [--full]
                                     [--skip-peer] [--skip-startup]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout
    sys.path.insert(0, str(ROOT))

MODELS = ("llama3.1-405b", "mixtral-8x22b")
PASSES = ("verify", "params", "tokens", "cost", "memory", "roofline")  # what `trace` runs
SEQ_LEN = 2048
BATCH = 1
RATIO_GOAL = 10.0  # peer time / graphllm time
GRAPHLLM_GOAL_MS = 50.0  # the full analysis of Llama-3.1-405B at T=2048
STARTUP_GOAL_S = 0.5


def _median_ms(fn: Callable[[], Any], repeats: int) -> tuple[float, list[float], Any]:
    """Run `fn` once to warm up, then `repeats` times; (median ms, all ms, last result)."""
    result = fn()
    times = []
    for _ in range(repeats):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times), times, result


# ---------------------------------------------------------------------------------------------
# graphllm path


def api_calls(preset: str) -> dict[str, Callable[[], Any]]:
    """A library user's two ways to trace's reports: `analyse`, and the full graph's passes."""
    import graphllm.passes  # binds graphllm too; one import keeps isort stable
    from graphllm.models.hardware import load_hardware

    config = graphllm.load_config(preset)
    workload = graphllm.Workload(batch=BATCH, seq_len=SEQ_LEN)
    hw = load_hardware("h100")
    return {
        "analyse": lambda: graphllm.analyse(config, workload, hw),
        "passes_run": lambda: graphllm.passes.run(
            graphllm.build_graph(config, workload), list(PASSES), hardware=hw
        ),
    }


def graphllm_trace(
    preset: str, passes: tuple[str, ...], full: bool = False
) -> Callable[[], dict[str, Any]]:
    import graphllm.passes  # binds graphllm too; one import keeps isort stable
    from graphllm.models.hardware import load_hardware

    config = graphllm.load_config(preset)
    workload = graphllm.Workload(batch=BATCH, seq_len=SEQ_LEN)
    # the roofline pass needs a device, as `trace` gives it; the others take none
    options = {"hardware": load_hardware("h100")} if "roofline" in passes else {}

    def trace() -> dict[str, Any]:
        graph = graphllm.build_graph(config, workload)
        results = graphllm.passes.run(graph, list(passes), **options)
        return {
            "nodes": len(graph),
            "params": results["params"].total if "params" in results else None,
        }

    if set(passes) == set(PASSES) and not full:
        from graphllm.report.reuse import trace_document

        def reused() -> dict[str, Any]:
            # what `trace` runs: one layer of each kind standing for the rest (report/reuse.py)
            doc = trace_document(config, workload, options["hardware"])
            return {"nodes": doc["graph"]["nodes"], "params": doc["params"]["total"]}

        return reused
    return trace


# ---------------------------------------------------------------------------------------------
# peer path: transformers on the meta device under FlopCounterMode


def _hf_config_dict(preset: str) -> dict[str, Any]:
    from graphllm.models.config import PRESETS_DIR

    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text(encoding="utf-8"))
    return {k: v for k, v in d.items() if not k.startswith("_")}  # drop graphllm's notes


def peer_trace(preset: str) -> Callable[[], dict[str, Any]]:
    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM

    d = _hf_config_dict(preset)
    is_moe = "num_local_experts" in d or "num_experts" in d
    # transformers 5 takes experts_implementation as a from_config kwarg (set on the config)
    kwargs: dict[str, Any] = {"attn_implementation": "sdpa"}
    if is_moe:
        kwargs["experts_implementation"] = "batched_mm"

    def trace() -> dict[str, Any]:
        # a fresh config each run (from_config writes dtype and implementations into it); the
        # timed region below starts at model construction, as for graphllm's build_graph
        cfg = AutoConfig.for_model(**d)
        t0 = time.perf_counter()
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(cfg, **kwargs)
            ids = torch.zeros((BATCH, SEQ_LEN), dtype=torch.long)
        t1 = time.perf_counter()
        counter = FlopCounterMode(display=False)
        with counter, torch.no_grad():
            model(input_ids=ids)
        t2 = time.perf_counter()
        return {
            "model": model,
            "flops": counter.get_total_flops(),
            "elapsed": t2 - t0,
            "build": t1 - t0,
            "forward": t2 - t1,
        }

    return trace


def _timed_peer(trace: Callable[[], dict[str, Any]], repeats: int) -> tuple[float, list, dict]:
    """Like _median_ms, but the time is the one measured inside `trace` (model + forward)."""
    out = trace()
    times, split = [], []
    for _ in range(repeats):
        del out
        gc.collect()
        out = trace()
        times.append(out["elapsed"] * 1e3)
        split.append((out["build"] * 1e3, out["forward"] * 1e3))
    out["build_ms"] = statistics.median(b for b, _ in split)
    out["forward_ms"] = statistics.median(f for _, f in split)
    return statistics.median(times), times, out


# ---------------------------------------------------------------------------------------------
# start-up


def _graphllm_cli() -> list[str]:
    exe = Path(sys.executable).parent / "graphllm"
    if exe.is_file():
        return [str(exe)]
    found = shutil.which("graphllm")
    return [found] if found else [sys.executable, "-m", "graphllm.cli"]


def startup_s(cmd: list[str], repeats: int) -> tuple[float, list[float]]:
    def once() -> float:
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
        return time.perf_counter() - t0

    once()  # warm the OS file cache and .pyc files
    times = [once() for _ in range(repeats)]
    return statistics.median(times), times


# ---------------------------------------------------------------------------------------------


def _profile(trace: Callable[[], Any], top: int = 20) -> str:
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.runcall(trace)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(top)
    return buf.getvalue()


def bench_model(
    preset: str,
    passes: tuple[str, ...],
    repeats: int,
    profile: bool,
    full: bool = False,
    peer: bool = True,
) -> dict:
    log = _log
    log(f"[{preset}] graphllm: build_graph + {','.join(passes)}")
    g_trace = graphllm_trace(preset, passes, full)
    g_ms, g_all, g_out = _median_ms(g_trace, repeats)
    g_params, g_nodes = g_out["params"], g_out["nodes"]
    prof = _profile(g_trace) if profile else None
    del g_out

    api = _api_timings(preset, repeats) if set(passes) == set(PASSES) else {}

    p_ms = p_all = p_build_ms = p_forward_ms = flops = p_params = None
    if peer:
        log(f"[{preset}] peer: transformers meta model + forward under FlopCounterMode")
        p_ms, p_all, p_out = _timed_peer(peer_trace(preset), repeats)
        model = p_out["model"]
        p_params = sum(p.numel() for p in model.parameters())
        flops = p_out["flops"]
        p_build_ms, p_forward_ms = p_out["build_ms"], p_out["forward_ms"]
        del p_out, model
        gc.collect()

    ratio = p_ms / g_ms if p_ms is not None else None
    return {
        "model": preset,
        "batch": BATCH,
        "seq_len": SEQ_LEN,
        "passes": list(passes),
        "path": "full graph" if full or set(passes) != set(PASSES) else "one layer of each kind",
        "graph_nodes": g_nodes,
        "graphllm_ms": g_ms,
        "graphllm_runs_ms": g_all,
        **api,
        "peer_ms": p_ms,
        "peer_runs_ms": p_all,
        "peer_build_ms": p_build_ms,
        "peer_forward_ms": p_forward_ms,
        "ratio": ratio,
        "ratio_goal": RATIO_GOAL,
        "ratio_pass": None if ratio is None else ratio >= RATIO_GOAL,
        "graphllm_goal_ms": GRAPHLLM_GOAL_MS,
        "graphllm_pass": g_ms <= GRAPHLLM_GOAL_MS,
        "peer_flops": flops,
        "graphllm_params": g_params,
        "peer_params": p_params,
        "params_match": None if g_params is None or p_params is None else g_params == p_params,
        "profile": prof,
        "load_average": os.getloadavg()[0],  # other work on the machine slows both sides
    }


def _api_timings(preset: str, repeats: int) -> dict[str, Any]:
    """Median ms of `analyse` and of build_graph + passes.run, and whether analyse makes 50 ms."""
    out: dict[str, Any] = {}
    for name, call in api_calls(preset).items():
        _log(f"[{preset}] Python API: {name}")
        ms, runs, _ = _median_ms(call, repeats)
        out |= {f"{name}_ms": ms, f"{name}_runs_ms": runs}
    out["analyse_pass"] = out["analyse_ms"] <= GRAPHLLM_GOAL_MS
    return out


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _fmt_int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _table(title: str, key: str, *figures: str) -> Any:
    """A rich table: its key column left-aligned, the figures right-aligned."""
    from rich.table import Table

    t = Table(title=title)
    t.add_column(key, justify="left")
    for col in figures:
        t.add_column(col, justify="right")
    return t


def print_report(models: list[dict], startup: list[dict]) -> None:
    from graphllm.report.console import console as new_console

    console = new_console()  # full width in a pipe or log: no header cut, no FLOP count wrapped
    ok = {True: "[green]pass[/]", False: "[red]FAIL[/]"}

    t = _table(
        f"trace speed: batch {BATCH}, T={SEQ_LEN} prefill (median; load average "
        f"{os.getloadavg()[0]:.1f})",
        "model",
        *(
            "graphllm path",
            "graphllm ms",
            f"<= {GRAPHLLM_GOAL_MS:g} ms",
            "peer ms",
            "(build + forward)",
            "ratio (peer/graphllm)",
            "goal",
            "result",
        ),
    )
    for m in models:
        peer = m["peer_ms"] is not None
        t.add_row(
            m["model"],
            m["path"],
            f"{m['graphllm_ms']:.1f}",
            ok[m["graphllm_pass"]],
            f"{m['peer_ms']:.1f}" if peer else "-",
            f"{m['peer_build_ms']:.0f} + {m['peer_forward_ms']:.0f}" if peer else "-",
            f"{m['ratio']:.1f}x" if peer else "-",
            f">= {RATIO_GOAL:g}x",
            ok[m["ratio_pass"]] if peer else "-",
        )
    console.print(t)

    if any("analyse_ms" in m for m in models):
        console.print(_api_table(models, ok))

    if any(m["peer_flops"] is not None for m in models):
        console.print(_flops_table(models))

    t = _table("start-up (subprocess wall time, median)", "command", "median s", "goal", "result")
    for s in startup:
        t.add_row(s["command"], f"{s['median_s']:.3f}", f"< {STARTUP_GOAL_S:g} s", ok[s["pass"]])
    if startup:
        console.print(t)

    for m in models:
        if m["profile"]:
            console.print(f"\ncProfile of the graphllm path, {m['model']} (by tottime):")
            print(m["profile"], flush=True)


def _flops_table(models: list[dict]) -> Any:
    t = _table(
        "FLOPs (FlopCounterMode) and parameters",
        "model",
        *("peer FLOPs", "TFLOP", "graphllm params", "meta model params", "match"),
    )
    for m in models:
        if m["peer_flops"] is None:
            continue
        t.add_row(
            m["model"],
            f"{m['peer_flops']:,}",
            f"{m['peer_flops'] / 1e12:.1f}",
            _fmt_int(m["graphllm_params"]),
            _fmt_int(m["peer_params"]),
            {True: "[green]yes[/]", False: "[red]NO[/]", None: "-"}[m["params_match"]],
        )
    return t


def _api_table(models: list[dict], ok: dict[bool, str]) -> Any:
    t = _table(
        "the Python API on the same reports (median)",
        "model",
        *("graphllm.analyse ms", f"<= {GRAPHLLM_GOAL_MS:g} ms", "build_graph + passes.run ms"),
    )
    for m in models:
        if "analyse_ms" in m:
            t.add_row(
                m["model"],
                f"{m['analyse_ms']:.1f}",
                ok[m["analyse_pass"]],
                f"{m['passes_run_ms']:.1f}",
            )
    return t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed runs after one warm-up")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of presets")
    ap.add_argument("--passes", default=",".join(PASSES), help="comma list of graphllm passes")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON")
    ap.add_argument("--profile", action="store_true", help="cProfile one graphllm trace per model")
    ap.add_argument("--skip-startup", action="store_true", help="skip the start-up timings")
    ap.add_argument("--skip-peer", action="store_true", help="skip transformers on the meta device")
    ap.add_argument(
        "--full", action="store_true", help="analyse the full graph, not one layer of each kind"
    )
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    presets = [m.strip() for m in args.models.split(",") if m.strip()]
    passes = tuple(p.strip() for p in args.passes.split(",") if p.strip())

    models = [
        bench_model(p, passes, args.repeats, args.profile, args.full, not args.skip_peer)
        for p in presets
    ]

    startup = []
    if not args.skip_startup:
        for label, cmd in (
            ('python -c "import graphllm"', [sys.executable, "-c", "import graphllm"]),
            ("graphllm --help", [*_graphllm_cli(), "--help"]),
        ):
            _log(f"start-up: {label}")
            med, runs = startup_s(cmd, args.repeats)
            startup.append(
                {
                    "command": label,
                    "median_s": med,
                    "runs_s": runs,
                    "goal_s": STARTUP_GOAL_S,
                    "pass": med < STARTUP_GOAL_S,
                }
            )

    if args.json:
        versions: dict[str, str] = {}
        with contextlib.suppress(ImportError):
            import torch
            import transformers

            versions = {"torch": torch.__version__, "transformers": transformers.__version__}
        print(json.dumps({"models": models, "startup": startup, "versions": versions}, indent=2))
    else:
        print_report(models, startup)
    return 0


if __name__ == "__main__":
    sys.exit(main())
