"""graphllm's int4 export against onnxruntime-genai's model builder (`-p int4`), on this CPU.

One checkpoint (the runtime benchmark's Llama: hidden 512, 8 layers, 8/4 heads, ffn 1408, vocab
32000; random weights, `save_pretrained`, with a word-level tokenizer the builder insists on)
goes through both: `python -m onnxruntime_genai.models.builder -p int4 -e cpu` (MatMulNBits
block 32, accuracy_level 4, symmetric: the builder's default, `is_symmetric` True; LM head
quantized, embeddings not) and `graphllm export --quantize int4`, with `--symmetric` (the same
format as the builder's: the goal figure) and without (graphllm's default, asymmetric with zero
points: a second line), beside graphllm's fp32 export.

All run in one loop, on sessions made alike (THREADS intra-op threads, the CPU provider, thread
spinning off for all, since the models take turns every few steps), with the same cache
handling: one buffer per layer of prompt + new positions, bound as both past and present, that
GroupQueryAttention appends to in place (`graphllm bench`'s handling of the `ort` lowering). A
round prefills the same random 128-token prompt on each model in turn, then decodes 64 tokens
greedily, the models taking turns in bursts of BURST steps (by default one: step by step; the
order rotated, and reversed every other few cycles, from burst to burst: `turn_order`). A load
that comes and goes weighs on the bursts of one cycle of turns alike, so each ratio is taken
per pair (ours over theirs, the same burst of the same round) and the figure is the median of
those paired ratios, with their interquartile range. Beside it: the medians over the rounds of
each model's mean decode step, the first round (a warm-up) left out for all, and the bandwidth
floor of a decode step, the bytes of the int4 MatMulNBits initializers (packed values, scales,
zero points) over the read bandwidth of a buffer that size measured as `graphllm calibrate`
does, before and after each round. The load average is printed at the start and the end.
Needs `pip install onnxruntime-genai` (0.18.0 runs on onnxruntime 1.32) and `onnx_ir`.

    python benchmarks/int4_vs_genai.py [--repeats 11] [--burst 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout: benchmarks.common
    sys.path.insert(0, str(ROOT))

import graphllm  # noqa: E402
from benchmarks.common import LLAMA_56M, read_bandwidth  # noqa: E402
from graphllm.build.builder import build_export_graph  # noqa: E402
from graphllm.exporters.onnx import export_onnx  # noqa: E402
from graphllm.exporters.onnx.nbits import Quantization  # noqa: E402

THREADS, PROMPT, NEW = 2, 128, 64
BURST = 1  # decode steps a model runs before the next takes its turn (1: step by step)
GENAI, SYM, ASYM, FP32 = "genai int4", "graphllm int4 sym", "graphllm int4", "graphllm fp32"
LLAMA = LLAMA_56M
HEAD_DIM = LLAMA["hidden_size"] // LLAMA["num_attention_heads"]


def checkpoint(folder: Path) -> None:
    """Random weights and a tokenizer (the builder writes one beside its model)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA)).save_pretrained(folder)
    vocab = {f"t{i}": i for i in range(LLAMA["vocab_size"])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="t0", bos_token="t1", eos_token="t2"
    )
    fast.save_pretrained(folder)


def genai_int4(ckpt: Path, out: Path) -> Path:
    cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(ckpt)]
    cmd += ["-o", str(out), "-p", "int4", "-e", "cpu", "-c", str(out.parent / "hf-cache")]
    subprocess.run(cmd, check=True, capture_output=True)
    return out / "model.onnx"


def nbits_bytes(path: Path) -> int:
    """Bytes of the initializers MatMulNBits nodes read: what a decode step streams of them."""
    model = onnx.load(str(path))
    inits = {t.name: t for t in model.graph.initializer}
    names = {
        i for n in model.graph.node if n.op_type == "MatMulNBits" for i in n.input[1:] if i in inits
    }
    return sum(numpy_helper.to_array(inits[i]).nbytes for i in names)


class Loop:
    """Prefill + greedy decode with the K/V cache in one bound buffer per layer, appended to in
    place by GroupQueryAttention: the same for every model. `prefill` starts a sequence and
    `decode` advances it a few steps at a time, so that models can take turns within one."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        opts.intra_op_num_threads = THREADS
        # the models take turns every few steps: a session's threads spinning after its turn
        # would take the cores from the next one (every session alike)
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.inputs = {i.name for i in self.sess.get_inputs()}
        self.io = self.sess.io_binding()
        self.io.bind_output("logits", "cpu")  # first bound: first among the outputs
        kv = LLAMA["num_key_value_heads"]
        for name in sorted(n for n in self.inputs if n.startswith("past_key_values.")):
            shape = [1, kv, PROMPT + NEW, HEAD_DIM]
            buf = ort.OrtValue.ortvalue_from_shape_and_type(shape, np.float32, "cpu", 0)
            self.io.bind_ortvalue_input(name, buf)
            self.io.bind_ortvalue_output(name.replace("past_key_values.", "present."), buf)
        self.value = ort.OrtValue.ortvalue_from_numpy
        self.steps = [self.feeds(np.zeros((1, 1), np.int64), PROMPT + i) for i in range(NEW)]
        self.done = NEW
        self.nxt = np.zeros((1, 1), np.int64)

    def feeds(self, ids: np.ndarray, start: int) -> dict:
        total = start + ids.shape[1]
        arrays = {"input_ids": ids, "attention_mask": np.ones((1, total), np.int64)}
        if "position_ids" in self.inputs:  # the builder's model takes its positions from the mask
            arrays["position_ids"] = np.arange(start, total, dtype=np.int64)[None]
        return {k: self.value(np.ascontiguousarray(v, np.int64)) for k, v in arrays.items()}

    def step(self, feeds: dict) -> np.ndarray:
        for name, v in feeds.items():
            self.io.bind_ortvalue_input(name, v)
        self.io.bind_output("logits", "cpu")
        self.sess.run_with_iobinding(self.io)
        return self.io.get_outputs()[0].numpy()

    def prefill(self, ids: np.ndarray) -> tuple[float, np.ndarray]:
        """Seconds of the prompt's step, and its last logits; the next `decode` continues it."""
        prompt = self.feeds(ids, 0)
        t0 = time.perf_counter()
        logits = self.step(prompt)
        self.nxt = logits[:, -1].argmax(-1)[:, None]
        seconds = time.perf_counter() - t0
        self.done = 0
        return seconds, logits[0, -1].copy()

    def decode(self, n: int) -> float:
        """Seconds of the next n greedy decode steps (the argmax of each included)."""
        spent = 0.0
        for feeds in self.steps[self.done : self.done + n]:
            feeds["input_ids"] = self.value(np.ascontiguousarray(self.nxt, np.int64))
            s0 = time.perf_counter()
            out = self.step(feeds)
            self.nxt = out[:, -1].argmax(-1)[:, None]
            spent += time.perf_counter() - s0
        self.done += n
        return spent


def paired_ratios(ours: list[float], theirs: list[float]) -> list[float]:
    """Ours over theirs, burst by burst: the two bursts of a pair ran next to each other, so a
    load that comes and goes weighs on both of a pair alike and cancels in its ratio."""
    if len(ours) != len(theirs) or not ours:
        raise ValueError(f"{len(ours)} bursts against {len(theirs)}: pairs need the same count")
    return [a / b for a, b in zip(ours, theirs, strict=True)]


def median_iqr(values: list[float]) -> tuple[float, float, float]:
    """The median and the first and third quartiles (inclusive: a single value is all three)."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, med, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return med, q1, q3


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


class Rounds:
    """Per label: each burst's seconds (all rounds after the warm-up, in order), and per round
    the prefill's seconds and the mean decode step; the bandwidth floor of each round, and each
    model's logits after the prompt of the last round."""

    # a plain class: the tests load this script by path, outside sys.modules, where a
    # dataclass cannot resolve its module
    def __init__(self, labels: list[str]) -> None:
        self.bursts: dict[str, list[float]] = {k: [] for k in labels}
        self.decode: dict[str, list[float]] = {k: [] for k in labels}
        self.prefill: dict[str, list[float]] = {k: [] for k in labels}
        self.floors: list[float] = []
        self.last: dict[str, np.ndarray] = {}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=11, help="rounds after the warm-up one")
    ap.add_argument("--burst", type=int, default=BURST, help="decode steps a model runs a turn")
    args = ap.parse_args()
    if args.repeats < 1 or args.burst < 1 or NEW % args.burst:
        ap.error(f"--repeats and --burst must be at least 1, and --burst divide {NEW}")
    return args


def export_all(ckpt: Path, root: Path) -> dict[str, Path]:
    """The builder's int4 model and graphllm's three exports of the same checkpoint."""
    cfg = graphllm.load_config(ckpt)
    paths = {GENAI: genai_int4(ckpt, root / "genai")}
    for label, q in (
        (SYM, Quantization("int4", symmetric=True)),
        (ASYM, Quantization("int4")),
        (FP32, None),
    ):
        path = root / f"{label.replace(' ', '-')}.onnx"
        export_onnx(build_export_graph(cfg), path, weights=ckpt, quantize=q)
        paths[label] = path
    return paths


def run_rounds(
    loops: dict[str, Loop], ids: np.ndarray, floor_bytes: int, repeats: int, burst: int
) -> Rounds:
    """A warm-up round and `repeats` more: each model prefills in turn, then decodes in turns
    of `burst` steps."""
    labels = list(loops)
    rounds = Rounds(labels)
    for r in range(repeats + 1):
        bw = read_bandwidth(floor_bytes, THREADS)
        spent = dict.fromkeys(loops, 0.0)
        for label in turn_order(labels, r):
            p, rounds.last[label] = loops[label].prefill(ids)
            if r:  # the first round warms up
                rounds.prefill[label].append(p)
        for b in range(NEW // burst):
            # the order changes burst by burst: no model always runs first, or after fp32
            for label in turn_order(labels, r * (NEW // burst) + b):
                t = loops[label].decode(burst)
                spent[label] += t
                if r:
                    rounds.bursts[label].append(t)
        bw = (bw + read_bandwidth(floor_bytes, THREADS)) / 2
        if r:
            rounds.floors.append(floor_bytes / bw)
            for label in loops:
                rounds.decode[label].append(spent[label] / NEW)
    return rounds


def print_results(rounds: Rounds, floor_bytes: int, repeats: int, burst: int) -> None:
    n_pairs = len(rounds.bursts[GENAI])
    print(
        f"decode ms/token, median of {repeats} rounds ({THREADS} threads), the models "
        f"taking turns every {burst} steps:"
    )
    for label in rounds.decode:
        med = statistics.median(rounds.decode[label]) * 1e3
        pre = statistics.median(rounds.prefill[label]) * 1e3
        print(f"  {label:18s} {med:7.3f}   (prefill {pre:7.1f} ms)")
    floor = statistics.median(rounds.floors) * 1e3
    print(f"  bandwidth floor    {floor:7.3f}   ({floor_bytes / 1e6:.1f} MB of int4 MatMulNBits)")
    print(f"ours over genai's, median [interquartile range] of {n_pairs} burst pairs:")
    bursts = rounds.bursts
    for label, why in ((SYM, "like for like, the goal"), (ASYM, "graphllm's default")):
        med, q1, q3 = median_iqr(paired_ratios(bursts[label], bursts[GENAI]))
        print(f"  {label} / {GENAI}: {med:.3f} [{q1:.3f}, {q3:.3f}]   ({why})")
    med, q1, q3 = median_iqr(paired_ratios(bursts[FP32], bursts[ASYM]))
    print(f"  {FP32} / {ASYM}: {med:.2f} [{q1:.2f}, {q3:.2f}]")
    sym = np.abs(rounds.last[SYM] - rounds.last[GENAI]).max()
    print(f"max |logit {SYM} - {GENAI}| after the prompt: {sym:.2e}")


def main() -> int:
    args = parse_args()
    print(f"load average at start: {load_average()}")
    ids = np.random.default_rng(0).integers(0, LLAMA["vocab_size"], (1, PROMPT), dtype=np.int64)
    with tempfile.TemporaryDirectory(prefix="graphllm-int4-") as tmp:
        root = Path(tmp)
        checkpoint(root / "ckpt")
        paths = export_all(root / "ckpt", root)
        floor_bytes = nbits_bytes(paths[ASYM])
        loops = {label: Loop(p) for label, p in paths.items()}
        rounds = run_rounds(loops, ids, floor_bytes, args.repeats, args.burst)
    print(f"load average at end: {load_average()}")
    print_results(rounds, floor_bytes, args.repeats, args.burst)
    return 0


def turn_order(labels: list[str], k: int) -> list[str]:
    """The k-th cycle's order of turns: rotated by k, and reversed every other len(labels)
    cycles, so that over 2 * len(labels) cycles each model takes every place as often and each
    goes before each other as often (rotation alone puts a before b in n-1 cycles of n)."""
    n = len(labels)
    order = labels[k % n :] + labels[: k % n]
    return order[::-1] if (k // n) % 2 else order


if __name__ == "__main__":
    sys.exit(main())
