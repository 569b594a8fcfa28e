"""`graphllm bench`'s measured over predicted time on `--hardware local`, on calibrate's tables.

Three fp32 Llamas with random weights, exported with the default lowering (`ort`), batch 1, a
128-token prompt then 32 greedy decode steps:

- `cache`: hidden 256, 4 layers, vocab 2048 (16 MB): a step's weights fit the last-level cache;
- `small`: the runtime benchmark's (hidden 512, 8 layers, 8/4 heads, ffn 1408, vocab 32000:
  56M params, 230 MB, of which a decode step streams 160 MB);
- `large`: hidden 1024, 12 layers, 16/8 heads, ffn 2816, vocab 32000 (205M params, 820 MB),
  far past the cache (`--large llama3.2-1b` takes that preset instead: 4.9 GB in fp32).

Each round, for each model: `calibrate` measures this machine (its read sweep over working sets
around the model's steps, its GEMM table at the model's shapes and at M = 1 and the prompt's
length, its attention table at the model's heads and steps) just before and just after `bench`
runs the model, which is predicted on the geometric mean of the two; the ratio is taken on that
pair, so a load that comes and goes between rounds weighs on both sides of it. `--local` reads
the local file instead (`graphllm calibrate --model ...` first) for every round. The figures
printed are medians over the rounds, beside the load average at the start and the end: the
machine is shared, and its load moves every figure.

    python benchmarks/bench_calibration.py [--rounds 3] [--models cache,small,large] [--local]
        [--large llama3.2-1b] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout: benchmarks.common
    sys.path.insert(0, str(ROOT))

from benchmarks.common import LLAMA_56M  # noqa: E402
from graphllm.build.builder import build_export_graph  # noqa: E402
from graphllm.exporters.onnx import export_onnx, read_metadata  # noqa: E402
from graphllm.models.config import config_from_dict, load_config  # noqa: E402
from graphllm.models.hardware import Hardware, hardware_from_dict, load_hardware  # noqa: E402
from graphllm.models.model_config import ModelConfig  # noqa: E402
from graphllm.models.workload import Workload  # noqa: E402
from graphllm.passes import run  # noqa: E402
from graphllm.runtime.bench import bench, export_storage, predict, predicted_graph  # noqa: E402
from graphllm.runtime.calibrate import (  # noqa: E402
    attention_heads_of,
    calibrate,
    gemm_shapes_of,
    sweep_side_of,
)

PROMPT, NEW = 128, 32
LLAMA = {"model_type": "llama", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5}
MODELS = {
    "cache": LLAMA
    | {
        "vocab_size": 2048,
        "hidden_size": 256,
        "intermediate_size": 704,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    "small": LLAMA | LLAMA_56M,
    "large": LLAMA
    | {
        "vocab_size": 32000,
        "hidden_size": 1024,
        "intermediate_size": 2816,
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
    },
}


def step_bytes(cfg: ModelConfig) -> list[float]:
    """The bytes a prefill of the prompt and a decode step move: the working sets that the
    roofline looks the bandwidth up at, which the round's sweep brackets."""
    out = []
    for seq, past in ((PROMPT, 0), (1, PROMPT), (1, PROMPT + NEW - 1)):
        wl = Workload.with_dtype(batch=1, seq_len=seq, past_len=past, dtype="fp32", logits="all")
        graph = predicted_graph(cfg, wl)
        run(graph, ["cost"])
        out.append(sum(n.meta["cost"].bytes for n in graph.nodes()))
    return out


def measure_machine(cfg: ModelConfig, threads: int) -> dict:
    """calibrate at this model's sizes: its read sweep around the model's steps, its GEMM table
    at the model's shapes and M = 1 and the prompt's length, its attention table at the
    model's heads for the prefill and the first and last decode step (the peak figures, which
    the calibrated roofline does not read for matmuls, at small sizes)."""
    sizes = step_bytes(cfg)
    hw = calibrate(
        repeats=5,
        threads=threads,
        progress=False,
        matmul_size=256,
        buffer_bytes=64 << 20,
        sweep=(int(min(sizes) / 1.5), int(max(sizes) * 1.5)),
        gemm_shapes=gemm_shapes_of(cfg),
        sweep_side=sweep_side_of(cfg),
        gemm_ms=(1, PROMPT),
        attention_heads=attention_heads_of(cfg),
        attention_steps=((1, PROMPT), (1, PROMPT + NEW), (PROMPT, 0)),
        budget=600.0,
    )
    return hw.to_dict()


def mean_of(before: dict, after: dict) -> Hardware:
    """The machine as measured just before and just after a bench: each table's figures the
    geometric mean of the two (the same sizes and shapes, measured twice)."""
    d = dict(before)
    cal = dict(before["calibration"])
    for table, key in (("read_bandwidth", "bandwidth"), ("gemm", "flops"), ("attention", "flops")):
        if table not in before["calibration"]:
            continue
        # the points measured both times (a budget may cut one sweep short)
        later = {tuple(v for k, v in b.items() if k != key): b for b in after["calibration"][table]}
        cal[table] = [
            a | {key: math.sqrt(a[key] * b[key])}
            for a in before["calibration"][table]
            if (b := later.get(tuple(v for k, v in a.items() if k != key)))
        ]
    d["calibration"] = cal
    return hardware_from_dict(d, "local")


def predicted(path: Path, hw: Hardware) -> tuple[float, float]:
    """bench's prediction of the export at `path` on `hw` (prefill s, decode s per step)."""
    meta = read_metadata(path)
    wl = meta.workload
    return predict(
        meta.config, meta.lowering, wl.act_dtype, wl.logits, 1, PROMPT, NEW, hw, meta.build,
        export_storage(meta),
    )  # fmt: skip


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--models", default="cache,small,large")
    ap.add_argument("--large", default=None, help="a preset or config in place of `large`")
    ap.add_argument("--local", action="store_true", help="predict on the local file instead")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    names = args.models.split(",")
    cfgs = {
        n: load_config(args.large)
        if n == "large" and args.large
        else config_from_dict(MODELS[n], n)
        for n in names
    }
    print(f"load average at the start {load()} (1/5/15 min), {os.cpu_count()} CPUs")
    ratios: dict[str, list[tuple[float, float, float, float]]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory(prefix="graphllm-calib-bench-") as tmp:
        paths = {}
        for n, cfg in cfgs.items():
            paths[n] = Path(tmp) / f"{n}.onnx"
            export_onnx(build_export_graph(cfg, "fp32"), paths[n])
        for r in range(args.rounds):
            for n in names:
                before = None if args.local else measure_machine(cfgs[n], args.threads)
                rep = bench(
                    paths[n], PROMPT, NEW, repeats=args.repeats, threads=args.threads, hardware=None
                )
                if args.local:
                    hw = load_hardware("local")
                else:
                    hw = mean_of(before, measure_machine(cfgs[n], args.threads))
                pre, dec = predicted(paths[n], hw)
                row = (rep.prefill_s, pre, rep.decode_s, dec)
                ratios[n].append(row)
                print(
                    f"round {r + 1} {n:6s} prefill {1e3 * row[0]:8.2f} ms / predicted "
                    f"{1e3 * row[1]:8.2f} = {row[0] / row[1]:.2f}; decode {1e3 * row[2]:7.3f} ms "
                    f"/ {1e3 * row[3]:7.3f} = {row[2] / row[3]:.2f}  (load {load()})",
                    flush=True,
                )
    which = "the local file" if args.local else "each round's calibration"
    print(f"\nmedians over {args.rounds} rounds, predicted on {which} ({load_hardware_note(args)})")
    print("model   weights   prefill meas/pred  ratio   decode meas/pred ms/token  ratio")
    for n in names:
        rows = ratios[n]
        med = [statistics.median(x[i] for x in rows) for i in range(4)]
        pre = statistics.median(x[0] / x[1] for x in rows)
        dec = statistics.median(x[2] / x[3] for x in rows)
        gb = weights_gb(cfgs[n])
        print(
            f"{n:6s} {gb:6.3f} GB  {1e3 * med[0]:8.2f} / {1e3 * med[1]:8.2f} ms  {pre:5.2f}   "
            f"{1e3 * med[2]:8.3f} / {1e3 * med[3]:8.3f}          {dec:5.2f}"
        )
    print(f"load average at the end {load()}")
    return 0


def weights_gb(cfg: ModelConfig) -> float:
    graph = predicted_graph(cfg, Workload.with_dtype(batch=1, seq_len=1, dtype="fp32"))
    return run(graph, ["memory"])["memory"].weights / 1e9


def load_hardware_note(args: argparse.Namespace) -> str:
    if not args.local:
        return "sweeps around each model's steps, GEMMs at its shapes"
    return load_hardware("local").source.split(":")[0]


if __name__ == "__main__":
    sys.exit(main())
