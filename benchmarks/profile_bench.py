"""Where `bench`'s time goes, op by op, beside the calibrated roofline's per-op prediction.

onnxruntime's profiler (SessionOptions.enable_profiling) times every node of bench's prefill and
decode runs of one of bench_calibration.py's Llamas; the nodes are summed by op type (a MatMul
by its input and output shapes: onnxruntime fuses Q, K and V, and gate and up, into one each),
medians over the timed repeats, a decode step the median over all steps. Then `calibrate` at
the model's sizes (as bench_calibration.py measures it) and the roofline's time per graph op,
summed by op (a linear by its K x N). The two lists name different ops (the lowering fuses
some), so compare them by kind: the GEMMs, the attention, the rest. The profiler itself adds a
few microseconds a node, so its sums run above an unprofiled bench; use ratios within one
profile.

    python benchmarks/profile_bench.py [--model small] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from bench_calibration import MODELS, NEW, PROMPT, measure_machine

from graphllm.build.builder import build_export_graph
from graphllm.exporters.onnx import export_onnx
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import hardware_from_dict
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.passes.roofline import _output_mnk
from graphllm.runtime import hugepages
from graphllm.runtime.bench import predicted_graph, time_generation
from graphllm.runtime.session import OnnxModel


def _shape(args: dict, key: str) -> list[int]:
    return next(iter(args[key][0].values()))


def measured(path: Path, threads: int, repeats: int, tmp: str) -> dict[str, dict[str, float]]:
    """{'prefill' | 'decode step': {op kind: median ms}} from onnxruntime's profile."""
    import onnxruntime as ort

    model = OnnxModel(path, "cpu", threads)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = threads, 4
    so.enable_profiling, so.profile_file_prefix = True, str(Path(tmp) / "profile")
    model.session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    hugepages.collapse()
    time_generation(model, PROMPT, NEW, 1, repeats=repeats, warmup=1)
    events = json.loads(Path(model.session.end_profiling()).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    starts = [r["ts"] for r in runs]
    per_run: dict[int, list[dict]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_run[bisect.bisect_right(starts, e["ts"]) - 1].append(e)
    stride = 1 + NEW  # a prefill then NEW decode steps, the first repeat a warm-up
    phases = {
        "prefill": [r * stride for r in range(1, 1 + repeats)],
        "decode step": [r * stride + j for r in range(1, 1 + repeats) for j in range(1, stride)],
    }
    out = {}
    for phase, idx in phases.items():
        sums: dict[str, list[float]] = collections.defaultdict(list)
        for i in idx:
            acc: dict[str, float] = collections.defaultdict(float)
            for e in per_run[i]:
                a = e["args"]
                kind = a["op_name"]
                if kind == "MatMul":
                    kind = f"MatMul {_shape(a, 'input_type_shape')} -> {_shape(a, 'output_type_shape')}"
                acc[kind] += e["dur"] / 1e3
            acc["(onnxruntime run)"] = runs[i]["dur"] / 1e3
            for k, v in acc.items():
                sums[k].append(v)
        out[phase] = {k: statistics.median(v) for k, v in sums.items()}
    return out


def predicted(cfg, hw) -> dict[str, dict[str, float]]:
    """{'prefill' | 'decode step': {graph op: ms}} of the calibrated roofline (mid decode)."""
    out = {}
    for phase, seq, past in (("prefill", PROMPT, 0), ("decode step", 1, PROMPT + NEW // 2)):
        wl = Workload.with_dtype(batch=1, seq_len=seq, past_len=past, dtype="fp32", logits="all")
        g = predicted_graph(cfg, wl)
        res = run(g, ["cost", "roofline"], hardware=hw, attention="flash")
        acc: dict[str, float] = collections.defaultdict(float)
        for n in g.nodes():
            oc, kind = n.meta["cost"], n.op
            if oc.matmul and n.op.startswith("linear"):
                _, cols, k = _output_mnk(g, n, oc.matmul)
                kind = f"{n.op} {int(k)} x {int(cols)}"
            acc[kind] += 1e3 * n.meta["time"].seconds
        acc["(roofline step)"] = 1e3 * res["roofline"].seconds
        out[phase] = dict(acc)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="small", choices=sorted(MODELS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    cfg = config_from_dict(MODELS[args.model], args.model)
    load = "/".join(f"{x:.1f}" for x in os.getloadavg())
    with tempfile.TemporaryDirectory(prefix="graphllm-profile-") as tmp:
        path = Path(tmp) / f"{args.model}.onnx"
        export_onnx(build_export_graph(cfg, "fp32"), path)
        got = measured(path, args.threads, args.repeats, tmp)
    hw = hardware_from_dict(measure_machine(cfg, args.threads), "local")
    want = predicted(cfg, hw)
    load += " -> " + "/".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{args.model}, {args.threads} threads, load {load}")
    for phase in got:
        print(f"\n{phase}: measured (onnxruntime profile, ms)")
        for k, v in sorted(got[phase].items(), key=lambda kv: -kv[1]):
            print(f"  {v:9.3f}  {k}")
        print(f"{phase}: predicted (calibrated roofline, ms)")
        for k, v in sorted(want[phase].items(), key=lambda kv: -kv[1]):
            if v > 0:
                print(f"  {v:9.3f}  {k}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
