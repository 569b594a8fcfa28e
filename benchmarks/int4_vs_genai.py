"""graphllm's int4 export against onnxruntime-genai's model builder (`-p int4`), on this CPU.

One checkpoint (the runtime benchmark's Llama: hidden 512, 8 layers, 8/4 heads, ffn 1408, vocab
32000; random weights, `save_pretrained`, with a word-level tokenizer the builder insists on)
goes through both: `graphllm export --quantize int4` (its default, asymmetric with zero points,
and `--symmetric`, the builder's default) and `python -m onnxruntime_genai.models.builder -p int4
-e cpu` (MatMulNBits block 32, accuracy_level 4, symmetric; LM head quantized, embeddings not),
beside graphllm's fp32 export. All run in one loop, on sessions made alike (graphllm's
`session`, THREADS intra-op threads), with the same cache handling: one buffer per layer of
prompt + new positions, bound as both past and present, that GroupQueryAttention appends to in
place (`graphllm bench`'s handling of the `ort` lowering). A round prefills a random 128-token
prompt and decodes 64 tokens greedily, each model once in turn (interleaved, so a load that
comes and goes weighs on all alike; the order rotates from round to round); the figures are medians over the rounds after a warm-up
one. Beside them: the bandwidth floor of a decode step, the bytes of the int4 MatMulNBits
initializers (packed values, scales, zero points) over the read bandwidth of a buffer that size
measured as `graphllm calibrate` does, in each round. Needs `pip install onnxruntime-genai`
(0.18.0 runs on onnxruntime 1.32) and `onnx_ir`.

    python benchmarks/int4_vs_genai.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

import graphllm
from graphllm.build.builder import build_export_graph
from graphllm.exporters.onnx import export_onnx
from graphllm.exporters.onnx.quantize import Quantization
from graphllm.runtime.calibrate import calibrate
from graphllm.runtime.session import session

THREADS, PROMPT, NEW = 2, 128, 64
PAUSE = 0.5  # seconds between runs: idle threads of the one before stop spinning
LLAMA = {
    "vocab_size": 32000,
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "max_position_embeddings": 2048,
}
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
    place by GroupQueryAttention: the same for every model."""

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        self.sess = session(path, "cpu", THREADS)
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

    def run(self, ids: np.ndarray) -> tuple[float, float, np.ndarray]:
        """Prefill seconds, mean decode-step seconds, and the prefill's last logits."""
        prompt = self.feeds(ids, 0)
        t0 = time.perf_counter()
        logits = self.step(prompt)
        nxt = logits[:, -1].argmax(-1)[:, None]
        t1 = time.perf_counter()
        first = logits[0, -1].copy()
        steps = [self.feeds(np.zeros((1, 1), np.int64), PROMPT + i) for i in range(NEW)]
        spent = 0.0
        for feeds in steps:
            feeds["input_ids"] = self.value(np.ascontiguousarray(nxt, np.int64))
            s0 = time.perf_counter()
            out = self.step(feeds)
            nxt = out[:, -1].argmax(-1)[:, None]
            spent += time.perf_counter() - s0
        return t1 - t0, spent / NEW, first


def bandwidth(nbytes: int) -> float:
    hw = calibrate(
        weights_bytes=nbytes,
        repeats=9,
        threads=THREADS,
        progress=False,
        matmul_size=64,
        buffer_bytes=1 << 20,
    )
    return hw.extra["memory_bandwidth_model"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    ids = np.random.default_rng(0).integers(0, LLAMA["vocab_size"], (1, PROMPT), dtype=np.int64)
    with tempfile.TemporaryDirectory(prefix="graphllm-int4-") as tmp:
        root = Path(tmp)
        ckpt = root / "ckpt"
        checkpoint(ckpt)
        cfg = graphllm.load_config(ckpt)
        paths = {"genai int4": genai_int4(ckpt, root / "genai")}
        for label, q in (
            ("graphllm int4", Quantization("int4")),
            ("graphllm int4 sym", Quantization("int4", symmetric=True)),
            ("graphllm fp32", None),
        ):
            path = root / f"{label.replace(' ', '-')}.onnx"
            export_onnx(build_export_graph(cfg), path, weights=ckpt, quantize=q)
            paths[label] = path
        floor_bytes = nbits_bytes(paths["graphllm int4"])
        loops = {label: Loop(p) for label, p in paths.items()}
        decode: dict[str, list[float]] = {k: [] for k in loops}
        prefill: dict[str, list[float]] = {k: [] for k in loops}
        floors, last = [], {}
        for r in range(args.repeats + 1):
            bw = bandwidth(floor_bytes)
            labels = list(loops)
            turn = labels[r % len(labels) :] + labels[: r % len(labels)]  # no model always first
            for label in turn:
                loop = loops[label]
                time.sleep(PAUSE)
                p, d, last[label] = loop.run(ids)
                if r:  # the first round warms up
                    prefill[label].append(p)
                    decode[label].append(d)
            bw = (bw + bandwidth(floor_bytes)) / 2
            if r:
                floors.append(floor_bytes / bw)
    med = {k: statistics.median(v) * 1e3 for k, v in decode.items()}
    floor = statistics.median(floors) * 1e3
    print(f"decode ms/token, median of {args.repeats} interleaved rounds ({THREADS} threads):")
    for label in loops:
        pre = statistics.median(prefill[label]) * 1e3
        print(f"  {label:18s} {med[label]:7.3f}   (prefill {pre:7.1f} ms)")
    print(f"  bandwidth floor    {floor:7.3f}   ({floor_bytes / 1e6:.1f} MB of int4 MatMulNBits)")
    theirs = med["genai int4"]
    for label in ("graphllm int4", "graphllm int4 sym"):
        per_round = [a / b for a, b in zip(decode[label], decode["genai int4"])]
        print(
            f"{label} / genai int4: {med[label] / theirs:.3f} (median of per-round ratios "
            f"{statistics.median(per_round):.3f})"
        )
    print(f"graphllm fp32 / graphllm int4: {med['graphllm fp32'] / med['graphllm int4']:.2f}")
    sym = np.abs(last["graphllm int4 sym"] - last["genai int4"]).max()
    print(f"max |logit graphllm int4 sym - genai int4| after the prompt: {sym:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
