"""onnxruntime sessions for models exported by graphllm: provider choice, a forward step with KV
cache, greedy generation, and token mixing observed through onnxruntime.

onnxruntime is imported inside the functions, so importing this module costs nothing.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from graphllm.errors import GraphllmError
from graphllm.model_config import ModelConfig
from graphllm.observe import MixingCheck, small_instance
from graphllm.workload import Workload

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
DEVICES = ("auto", "cpu", "cuda")
_NP = {"tensor(float)": np.float32, "tensor(float16)": np.float16}


def providers(device: str = "auto") -> list[str]:
    """onnxruntime providers for `device`: 'cpu', 'cuda' (onnxruntime-gpu), or 'auto' (CUDA if
    this onnxruntime has it, else CPU)."""
    import onnxruntime as ort

    if device not in DEVICES:
        raise GraphllmError(f"unknown device {device!r}; choose one of {', '.join(DEVICES)}")
    have = ort.get_available_providers()
    if device == "cuda" and PROVIDERS["cuda"] not in have:
        raise GraphllmError(
            "onnxruntime here has no CUDA provider (install the gpu extra: onnxruntime-gpu)"
        )
    if device == "cuda" or (device == "auto" and PROVIDERS["cuda"] in have):
        return [PROVIDERS["cuda"], PROVIDERS["cpu"]]
    return [PROVIDERS["cpu"]]


def session(path: str | Path, device: str = "auto", threads: int | None = None) -> Any:
    """An onnxruntime InferenceSession on `path` (external data is found beside it)."""
    import onnxruntime as ort

    if not Path(path).is_file():
        raise GraphllmError(f"{path}: no such ONNX model")
    opts = ort.SessionOptions()
    if threads:
        opts.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), sess_options=opts, providers=providers(device))


def positions(attention_mask: np.ndarray, new: int) -> np.ndarray:
    """Position ids of the last `new` columns: tokens counted from the first real one (padding
    gets 1), as transformers' generate computes them."""
    pos = np.cumsum(attention_mask, axis=1) - 1
    pos[attention_mask == 0] = 1
    return pos[:, -new:].astype(np.int64)


class OnnxModel:
    """A graphllm `.onnx` model on onnxruntime: one forward step, and greedy generation."""

    def __init__(self, path: str | Path, device: str = "auto", threads: int | None = None) -> None:
        self.path = Path(path)
        self.session = session(path, device, threads)
        self.past_names = [i.name for i in self.session.get_inputs() if i.name.startswith("past")]
        self._past = {i.name: i for i in self.session.get_inputs() if i.name.startswith("past")}
        self.output_names = [o.name for o in self.session.get_outputs()]

    def empty_past(self, batch: int) -> dict[str, np.ndarray]:
        """Past K/V of length 0 (a prefill)."""
        out = {}
        for name, info in self._past.items():
            heads, head_dim = info.shape[1], info.shape[3]
            out[name] = np.zeros((batch, heads, 0, head_dim), _NP[info.type])
        return out

    def forward(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray | None = None,
        position_ids: np.ndarray | None = None,
        past: dict[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Logits and present K/V for new tokens (B, T) after `past` (`present.*` or
        `past_key_values.*` keys; none: a prefill). The mask defaults to all ones over past and
        new tokens, positions to the mask's running count."""
        ids = np.atleast_2d(np.asarray(input_ids, dtype=np.int64))
        b, t = ids.shape
        feeds = self.empty_past(b)
        for k, v in (past or {}).items():
            feeds[k.replace("present.", "past_key_values.")] = v
        p = next(iter(feeds.values())).shape[2] if feeds else 0
        mask = np.ones((b, p + t), np.int64) if attention_mask is None else attention_mask
        feeds["attention_mask"] = np.asarray(mask, dtype=np.int64)
        feeds["input_ids"] = ids
        pos = positions(feeds["attention_mask"], t) if position_ids is None else position_ids
        feeds["position_ids"] = np.asarray(pos, dtype=np.int64)
        outs = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, outs))

    def generate(
        self,
        input_ids: np.ndarray,
        max_new_tokens: int,
        attention_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        """Greedy decoding through the KV cache: (B, max_new_tokens) new token ids. A batch of
        prompts of different lengths is left-padded, with `attention_mask` 0 on the padding."""
        ids = np.atleast_2d(np.asarray(input_ids, dtype=np.int64))
        mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask)
        out = self.forward(ids, mask)
        new = []
        for step in range(max_new_tokens):
            nxt = out["logits"][:, -1].argmax(-1)[:, None]  # (B, 1)
            new.append(nxt)
            if step == max_new_tokens - 1:
                break
            mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
            past = {k: v for k, v in out.items() if k.startswith("present.")}
            out = self.forward(nxt, mask, past=past)
        return np.concatenate(new, axis=1) if new else np.zeros((ids.shape[0], 0), np.int64)


def check_token_mixing_onnx(
    cfg: ModelConfig,
    seq_len: int = 12,
    seed: int = 0,
    shrink: bool = True,
    workload: Workload | None = None,
) -> MixingCheck:
    """`observe.check_token_mixing` observed through onnxruntime: the same small instance, random
    weights, token ids, random past K/V and perturbations, run from an exported `.onnx` file.

    The ONNX model takes one past length for every layer; where a window layer's cache holds
    only the last W-1 positions, the positions before them are fed as zeros, which its window
    masks out.
    """
    from graphllm.builder import build_graph
    from graphllm.exporters.onnx import export_onnx
    from graphllm.passes import run

    wl = workload or Workload(seq_len=seq_len)
    wl = replace(wl, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")
    small = small_instance(cfg, wl.seq_len) if shrink else cfg
    graph = build_graph(small, wl)
    predicted = run(graph, ["tokens"], exact_sets=True)["tokens"].dependence[:, wl.past_len :]
    rng = np.random.default_rng(seed)
    t, p = wl.seq_len, wl.past_len
    ids = rng.integers(0, small.vocab_size, size=(wl.batch, t))
    past = {}
    for n in graph.nodes("input"):
        if n.name.startswith("past_key_values."):
            b, h, held, e = (int(x) for x in n.out.shape(graph.bindings))
            kv = np.zeros((b, h, p, e), np.float32)
            kv[:, :, p - held :] = rng.standard_normal((b, h, held, e))
            past[n.name] = kv
    rows = np.arange(t) if wl.logits == "all" else np.array([t - 1])
    observed = np.zeros((t, t), dtype=bool)
    with tempfile.TemporaryDirectory(prefix="graphllm-tokens-") as tmp:
        path = Path(tmp) / "model.onnx"
        export_onnx(small, path, seed=seed, workload=wl, check=False)
        model = OnnxModel(path, device="cpu")

        def logits(x: np.ndarray) -> np.ndarray:
            out = model.forward(x, past=past)["logits"][0]
            full = np.zeros((t, out.shape[-1]), out.dtype)
            full[rows] = out  # with logits for the last position only, the others stay empty
            return full

        base = logits(ids)
        for j in range(t):
            changed = ids.copy()
            changed[0, j] = (changed[0, j] + 1 + rng.integers(small.vocab_size - 1)) % (
                small.vocab_size
            )
            # bit-exact: a position that does not read input j computes the same bits
            observed[:, j] = (logits(changed) != base).any(axis=-1)
    return MixingCheck(small, predicted, observed)
