"""Peak memory of an ONNX export against the largest tensor it writes.

Exports a model (default Llama-3.2-1B, fp16, seeded random weights: 2.47 GB, so the weights go to
external data tensor by tensor) in a child process, and reports the child's peak resident set
size (`getrusage(RUSAGE_CHILDREN).ru_maxrss`) beside the largest single tensor. The goal: the
peak stays within about 1 GB of the largest tensor, whatever the model's total size. Also
reported: the child's baseline (interpreter + imports, measured by a child that stops before
exporting), wall time, and the files written. The output folder is a temporary one, removed
afterwards unless --keep names a folder.

    python benchmarks/export_memory.py [--model llama3.2-1b] [--dtype fp16] [--keep DIR] [--json]

Exit status 1 when the goal is missed or the export fails.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from graphllm.build.builder import build_export_graph

ROOT = Path(__file__).resolve().parent.parent
GOAL_BYTES = 1 << 30  # peak RSS - largest tensor

CHILD = r"""
import sys
from pathlib import Path
import graphllm
from graphllm.build.builder import build_export_graph
from graphllm.exporters.onnx import export_onnx
model, dtype, out, dry = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4] == "1"
cfg = graphllm.load_config(model)
if not dry:
    r = export_onnx(build_export_graph(cfg, dtype), out / "model.onnx", seed=0)
    print(r.params, r.weight_bytes, int(r.data_path is not None))
"""


def _child_peak(args: list[str]) -> tuple[int, float, str]:
    """Run the child; (its peak RSS in bytes, wall seconds, stdout). ru_maxrss is in KiB on
    Linux; RUSAGE_CHILDREN reports the largest child so far, so each measurement runs the child
    from a fresh parent (`python this --measure ...`)."""
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", CHILD, *args], capture_output=True, text=True, cwd=ROOT
    )
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise SystemExit(f"export failed:\n{out.stderr}")
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return peak, wall, out.stdout


def _measure(args: list[str]) -> tuple[int, float, str]:
    """One child under a fresh parent, so RUSAGE_CHILDREN holds that child alone."""
    code = [sys.executable, __file__, "--measure", *args]
    out = subprocess.run(code, capture_output=True, text=True, check=True)
    peak, wall, stdout = json.loads(out.stdout)
    return int(peak), float(wall), str(stdout)


def _largest_tensor(model: str, dtype: str) -> tuple[str, int]:
    sys.path.insert(0, str(ROOT))
    import numpy as np

    import graphllm

    graph = build_export_graph(graphllm.load_config(model), dtype)
    item = np.dtype(np.float16 if dtype == "fp16" else np.float32).itemsize
    sizes = {n.name: int(np.prod([d.size for d in n.out.dims])) * item for n in graph.params()}
    name = max(sizes, key=sizes.__getitem__)
    return name, sizes[name]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama3.2-1b")
    ap.add_argument("--dtype", default="fp16", choices=["fp32", "fp16"])
    ap.add_argument("--keep", type=Path, help="Write the model here and keep it.")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:  # the fresh parent of one child
        print(json.dumps(_child_peak(a.measure)))
        return 0
    name, largest = _largest_tensor(a.model, a.dtype)
    with tempfile.TemporaryDirectory(prefix="graphllm-export-") as tmp:
        out = a.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        base, _, _ = _measure([a.model, a.dtype, str(out), "1"])
        peak, wall, stdout = _measure([a.model, a.dtype, str(out), "0"])
        params, nbytes, external = (int(x) for x in stdout.split())
        files = {p.name: p.stat().st_size for p in sorted(out.iterdir())}
    over = peak - largest
    row = {
        "model": a.model,
        "dtype": a.dtype,
        "params": params,
        "weight_bytes": nbytes,
        "external_data": bool(external),
        "largest_tensor": name,
        "largest_tensor_bytes": largest,
        "peak_rss_bytes": peak,
        "baseline_rss_bytes": base,
        "peak_minus_largest_bytes": over,
        "goal_bytes": GOAL_BYTES,
        "within_goal": over <= GOAL_BYTES,
        "wall_s": round(wall, 1),
        "files": files,
    }
    if a.json:
        print(json.dumps(row, indent=2))
    else:
        gb = 1e9
        print(f"{a.model} {a.dtype}: {params / 1e9:.2f}B params, {nbytes / gb:.2f} GB of weights")
        print(f"  largest tensor   {name}: {largest / gb:.3f} GB")
        print(f"  peak RSS         {peak / gb:.3f} GB (baseline after imports {base / gb:.3f} GB)")
        verdict = "within" if row["within_goal"] else "OVER"
        print(f"  peak - largest   {over / gb:.3f} GB ({verdict} the 1 GiB goal)")
        print(f"  wall             {wall:.1f} s; files {files}")
    return 0 if row["within_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
