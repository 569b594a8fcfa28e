"""Tiny configs and the single-device reference the distributed runs are held to."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from graphllm import Workload, build_graph, load_config
from graphllm.build.weights import load_weights, random_weights
from graphllm.runtime.dist.rank import Job, prompt_ids, vocab_of
from graphllm.runtime.interpret import run_graph
from tests.support.tiny_configs import DEEPSEEK_V3, LLAMA

MIXTRAL = {**LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}
CONFIGS = {"dense": LLAMA, "moe": MIXTRAL, "deepseek": DEEPSEEK_V3}
NEW_TOKENS = 17  # the prefill's token and 16 cached decode steps
TOL = 1e-4


def write_configs(folder: Path) -> dict[str, str]:
    out = {}
    for name, fields in CONFIGS.items():
        path = folder / f"{name}.json"
        path.write_text(json.dumps(fields))
        out[name] = str(path)
    return out


def write_moe_checkpoint(folder: Path, config: str, seed: int = 3) -> Path:
    """A checkpoint of the tiny MoE as transformers names it: one tensor per expert."""
    folder.mkdir()
    fields = json.loads(Path(config).read_text())
    (folder / "config.json").write_text(json.dumps(fields))
    g = build_graph(load_config(folder), Workload(batch=1, seq_len=1))
    tensors = {}
    for name, arr in random_weights(g, seed=seed).items():
        if "*" in name:
            for e, block in enumerate(arr):
                tensors[name.replace("*", str(e))] = np.ascontiguousarray(block)
        else:
            tensors[name] = arr
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def job(source: str, name: str = "", **kw) -> Job:
    base = {"batch": 4, "seq_len": 8, "new_tokens": NEW_TOKENS, "keep_logits": True}
    return Job(source=source, strategy=kw.pop("strategy", {}), name=name, **(base | kw))


def reference(j: Job) -> tuple[list[np.ndarray], np.ndarray]:
    """Each step's logits and the greedy tokens of the unpartitioned graph on one numpy
    process (run_graph with the past K/V fed back), independent of graphllm.runtime.dist."""
    return _reference(j.source, j.batch, j.seq_len, j.new_tokens, j.seed, j.mla, j.weights)


@functools.cache  # the strategies of one config share it
def _reference(
    source: str, batch: int, seq_len: int, new_tokens: int, seed: int, mla: str, ckpt: str | None
) -> tuple[list[np.ndarray], np.ndarray]:
    j = Job(source, {}, batch, seq_len, new_tokens, seed, mla, ckpt)
    cfg = load_config(j.source)

    def graph(t: int, p: int):
        wl = Workload.with_dtype(batch=j.batch, seq_len=t, past_len=p, dtype="fp32")
        return build_graph(cfg, wl, mla=j.mla)

    g = graph(j.seq_len, 0)
    weights = random_weights(g, seed=j.seed) if j.weights is None else load_weights(g, j.weights)
    ids = prompt_ids(j, vocab_of(g))
    out = run_graph(g, weights, ids)
    logits, tokens = [out["logits"]], []
    for k in range(1, j.new_tokens + 1):
        nxt = np.argmax(logits[-1][:, -1, :], axis=-1)[:, None]
        tokens.append(nxt)
        if k == j.new_tokens:
            break
        past = {n: v for n, v in out.items() if n.startswith("present.")}
        out = run_graph(graph(1, j.seq_len + k - 1), weights, nxt, past)
        logits.append(out["logits"])
    return logits, np.concatenate(tokens, axis=1)


def assert_equal_to_reference(case: dict, j: Job) -> None:
    want, tokens = reference(j)
    assert len(case["logits"]) == len(want) == j.new_tokens
    for step, (a, b) in enumerate(zip(case["logits"], want)):
        assert a.shape == b.shape, (case["name"], step)
        diff = float(np.max(np.abs(a - b)))
        assert diff < TOL, (case["name"], step, diff)
    assert case["tokens"] == tokens.tolist(), case["name"]
