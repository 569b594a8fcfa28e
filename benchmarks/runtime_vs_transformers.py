"""graphllm's ONNX export on onnxruntime against transformers, on this machine's CPU.

A Llama config (hidden 512, 8 layers, 8 heads, 4 KV heads, intermediate 1408, vocab 32000) with
the same random weights for both: transformers' model (its default `sdpa` attention) is saved with
`save_pretrained` and graphllm exports that checkpoint, once per lowering. Each run prefills a
random 128-token prompt, then decodes 64 tokens greedily through the KV cache (batch 1, fp32,
2 threads: `torch.set_num_threads(2)`, onnxruntime intra_op_num_threads=2; the cache kept as
`graphllm bench` keeps it: under `ort` one buffer per layer that each step appends to in place,
otherwise each step's present K/V stay OrtValues, fed back as the next step's past). Figures are medians over the repeats after
a warm-up round; in each round every model runs once in turn, so a load that comes and goes on
the machine weighs on all of them alike. Beside them: the bandwidth floor of a decode step (the
weight bytes it streams over the read bandwidth of a buffer that size, measured as `graphllm
calibrate` does, just before and just after each model's run in each round, averaged; the
ratio is the median over the rounds of decode time over that run's floor) and measured over the roofline prediction on this
machine's calibration (`--hardware local`), as `graphllm bench` reports it.

Once every model is loaded, the process's weights (torch's and onnxruntime's alike) are moved
onto transparent huge pages (graphllm.hugepages), as `graphllm bench` does: numpy's arrays, the
bandwidth floor's buffer among them, get huge pages anyway. `--no-huge-pages` measures without.

    python benchmarks/runtime_vs_transformers.py [--repeats 5] [--lowerings standard,ort,decomposed]
        [--no-huge-pages]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout: benchmarks.common
    sys.path.insert(0, str(ROOT))

import graphllm  # noqa: E402
from benchmarks.common import LLAMA_56M, read_bandwidth  # noqa: E402
from graphllm.build.builder import build_export_graph  # noqa: E402
from graphllm.exporters.onnx import default_lowering, export_onnx  # noqa: E402
from graphllm.passes import run  # noqa: E402
from graphllm.runtime import hugepages  # noqa: E402
from graphllm.runtime.bench import predict, time_generation  # noqa: E402
from graphllm.runtime.calibrate import calibrate  # noqa: E402
from graphllm.runtime.session import OnnxModel  # noqa: E402

THREADS, PROMPT, NEW = 2, 128, 64
PAUSE = 0.5  # seconds between runs: idle threads of the one before stop spinning
LLAMA = LLAMA_56M


def transformers_run(model, ids: np.ndarray) -> tuple[float, float]:
    """Prefill seconds and mean decode-step seconds of one run (the same loop as onnxruntime's:
    the model's forward with its cache, then the argmax of the last logits)."""
    import torch

    with torch.no_grad():
        t0 = time.perf_counter()
        out = model(torch.from_numpy(ids), use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
        t1 = time.perf_counter()
        spent = 0.0
        for _ in range(NEW):
            s0 = time.perf_counter()
            out = model(nxt, cache=out.cache, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            spent += time.perf_counter() - s0
    return t1 - t0, spent / NEW


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--lowerings", default="standard,ort,decomposed")
    ap.add_argument(
        "--no-huge-pages", action="store_true", help="leave the weights on the pages they got"
    )
    args = ap.parse_args()

    import torch
    import transformers

    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).eval()
    ids = np.random.default_rng(0).integers(0, LLAMA["vocab_size"], (1, PROMPT), dtype=np.int64)
    with tempfile.TemporaryDirectory(prefix="graphllm-bench-") as tmp:
        ckpt = Path(tmp) / "ckpt"
        hf.save_pretrained(ckpt)
        cfg = graphllm.load_config(ckpt)
        streamed, hw = weights_streamed(cfg)
        models, predicted = onnx_models(hf, cfg, ckpt, ids, args.lowerings.split(","), hw)
        huge = 0 if args.no_huge_pages else hugepages.collapse()
        label = f"transformers {hf.config._attn_implementation}"
        rounds = run_rounds(hf, label, ids, models, args.repeats, streamed)
    print_results(args, huge, streamed, rounds, predicted)
    return 0


def weights_streamed(cfg) -> tuple[float, object]:
    """The weight bytes a decode step streams (half way through the decode), and this machine's
    calibration with a read of that size."""

    wl = graphllm.Workload.with_dtype(seq_len=1, past_len=PROMPT + NEW // 2, dtype="fp32")
    streamed = run(graphllm.build_graph(cfg, wl), ["cost"])["cost"].bytes["weights"]
    hw = calibrate(
        weights_bytes=streamed,
        repeats=5,
        threads=THREADS,
        progress=False,
        matmul_size=1024,
        buffer_bytes=512 << 20,
    )
    return streamed, hw


def onnx_models(hf, cfg, ckpt: Path, ids: np.ndarray, lowerings: list[str], hw) -> tuple:
    """Per lowering, the checkpoint exported and loaded (its prefill logits checked against
    transformers'), and the roofline prediction of its prefill and decode step."""
    import torch

    default = default_lowering(build_export_graph(cfg), "cpu")
    with torch.no_grad():
        ref = hf(torch.from_numpy(ids)).logits.numpy()
    models, predicted = {}, {}
    for ops in lowerings:
        path = ckpt.parent / f"{ops}.onnx"
        export_onnx(build_export_graph(cfg), path, weights=ckpt, ops=ops)
        label = f"graphllm {ops}" + (" (default)" if ops == default else "")
        models[label] = OnnxModel(path, device="cpu", threads=THREADS)
        diff = float(np.abs(models[label].forward(ids)["logits"] - ref).max())
        print(f"{label}: prefill logits max |diff| vs transformers {diff:.1e}", file=sys.stderr)
        predicted[label] = predict(cfg, ops, "fp32", "all", 1, PROMPT, NEW, hw)
    return models, predicted


@dataclass
class Rounds:
    """What the timed rounds measured (the warm-up round left out)."""

    runs: dict[str, list[tuple[float, float]]]  # per model: (prefill s, decode s) of each round
    ratios: dict[str, list[float]]  # per ONNX model: decode time over its floor, each round
    reads: list[float]  # model-sized reads, around each model's run in each round


def run_rounds(hf, hf_label: str, ids: np.ndarray, models: dict, repeats: int, streamed) -> Rounds:
    """One run of each model in turn, a warm-up round first: a load that comes and goes on the
    machine then weighs on all of them alike. Each ONNX model's decode is set over the floor
    read just before and just after its run: the machine's bandwidth moves from one second to
    the next, a ratio within a round less."""

    out = Rounds({hf_label: [], **{label: [] for label in models}}, {m: [] for m in models}, [])
    for r in range(1 + repeats):
        time.sleep(PAUSE)
        got = [transformers_run(hf, ids)]
        for label, m in models.items():
            time.sleep(PAUSE)  # torch's OpenMP workers spin a while after its last op
            before = read_bandwidth(streamed, THREADS)
            t = time_generation(m, PROMPT, NEW, repeats=1, warmup=0)
            read = (before + read_bandwidth(streamed, THREADS)) / 2  # reads around the run
            got.append((t.prefill[0], t.decode[0]))
            if r:
                out.reads.append(read)
                out.ratios[label].append(t.decode[0] * read / streamed)
        if r:
            for label, one in zip(out.runs, got):
                out.runs[label].append(one)
    return out


def print_results(args, huge: int, streamed: float, rounds: Rounds, predicted: dict) -> None:
    reads, ratios = rounds.reads, rounds.ratios
    rows = [
        (label, statistics.median(p for p, _ in v), statistics.median(d for _, d in v))
        for label, v in rounds.runs.items()
    ]
    read_bw = statistics.median(reads)
    floor = streamed / read_bw
    print(
        f"Llama hidden 512, 8 layers, 8/4 heads, ffn 1408, vocab 32000; batch 1, fp32, "
        f"{THREADS} threads; prefill {PROMPT} tokens, then {NEW} decode steps; median of "
        f"{args.repeats} after a warm-up; "
        + (
            "huge pages off (--no-huge-pages)"
            if args.no_huge_pages
            else f"{huge / 1e6:.0f} MB more of the loaded memory on huge pages"
        )
    )
    print(
        f"decode bandwidth floor: {streamed / 1e6:.1f} MB of weights per token / "
        f"{read_bw / 1e9:.1f} GB/s read over a buffer that size = {1e3 * floor:.2f} ms/token "
        f"(median; {1e3 * streamed / max(reads):.2f}-{1e3 * streamed / min(reads):.2f} ms "
        "over the rounds)"
    )
    hf_label, hf_p, hf_d = rows[0]
    head = f"{'':34s} {'prefill ms':>10s} {'decode ms/tok':>13s} {'tok/s':>7s}"
    cols = f" {'prefill x':>9s} {'decode x':>8s} {'/floor':>6s} {'rounds':>9s} {'meas/pred':>16s}"
    print(head + cols)
    for label, p, d in rows:
        line = f"{label:34s} {1e3 * p:10.1f} {1e3 * d:13.2f} {1 / d:7.1f}"
        if label != hf_label:
            pp, pd = predicted[label]
            r = ratios[label]
            line += f" {hf_p / p:9.2f} {hf_d / d:8.2f} {statistics.median(r):6.2f}"
            line += f" {min(r):4.2f}-{max(r):4.2f}"
            line += f"   {p / pp:5.2f} / {d / pd:5.2f}"
        print(line)
    print(
        "prefill x, decode x: transformers' time over graphllm's (goals: >= 1.3 and >= 2); "
        "/floor: median over the rounds of decode time over the bandwidth floor read around it "
        "(goal: <= 1.2), rounds: its least and greatest; meas/pred: measured over "
        "the roofline prediction on this machine's calibration, prefill / decode"
    )


if __name__ == "__main__":
    sys.exit(main())
