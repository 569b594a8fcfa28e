"""Serving figures of one model replica: time to first token, time per output token, tokens/s per
user and in all, the largest batch the KV cache holds, and the throughput-latency curve.

The model of continuous batching is a steady state: B sequences decode together; each step is
one decode step of the batch at the average context (the prompt plus half the output), and every
sequence that finishes (one in `output` steps per sequence) is replaced by a new one whose prompt
is prefilled in chunks between the decode steps, so a step also carries B / output prompts'
prefill. A new request's first token waits for its own prefill (queueing is not modelled).

Memory: the device keeps `memory_fraction` of its memory for weights and cache (vLLM's
`gpu_memory_utilization`, 0.9 by default); what the weights and one step's activations leave
holds the KV cache, each sequence's at its full length (prompt + output).
"""

from __future__ import annotations

import math
from typing import Any

from graphllm.build.builder import build_graph
from graphllm.errors import ConfigError
from graphllm.files import write_atomic
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.report.plot import pyplot_for

MEMORY_FRACTION = 0.9  # vLLM's default gpu_memory_utilization


def _step(config: ModelConfig, wl: Workload, s: Strategy, hw: Hardware, attention: str) -> dict:
    """One device's figures of a step (partition report of the single stage)."""
    graph = partition(build_graph(config, wl), s, hw)
    return partition_report(graph, hw, attention).to_dict()["stages"][0]


def serving_report(
    config: ModelConfig,
    base: Workload,
    strategy: Strategy,
    hw: Hardware,
    *,
    prompt: int,
    output: int,
    batch: int | None = None,
    attention: str = "flash",
    memory_fraction: float = MEMORY_FRACTION,
) -> dict[str, Any]:
    """The serving figures of `config` on `strategy` x `hw` for requests of `prompt` tokens in
    and `output` out; `batch` concurrent sequences (None: the largest that fits)."""
    if strategy.pp > 1 or strategy.cp > 1 or strategy.dp > 1 or strategy.microbatches > 1:
        raise ConfigError(
            "graphllm serving models one replica over --tp (with --sp) and --ep; --pp, --cp, --dp "
            "and --microbatches are not modelled yet"
        )
    if not 0 < memory_fraction <= 1:
        raise ConfigError(f"--memory-fraction must be in (0, 1], got {memory_fraction}")
    dtypes = {k: getattr(base, k) for k in ("weight_dtype", "act_dtype", "kv_dtype")}
    avg = prompt + output // 2

    def decode(b: int, past: int = avg) -> dict:
        wl = Workload(batch=b, seq_len=1, past_len=past, logits="last", **dtypes)
        return _step(config, wl, strategy, hw, attention)

    prefill = _step(
        config, Workload(seq_len=prompt, logits="last", **dtypes), strategy, hw, attention
    )
    one = decode(1, prompt + output - 1)  # a sequence at its full length
    budget = memory_fraction * hw.memory_bytes - one["weight_bytes"] - one["activation_bytes"]
    per_seq = one["kv_cache_bytes"]
    largest = math.floor(budget / per_seq) if per_seq > 0 else 0
    if largest < 1:
        raise ConfigError(
            f"{config.name} on {strategy.devices} {hw.name}: the weights "
            f"({one['weight_bytes'] / 1e9:.2f} GB a device) leave no room for one sequence's KV "
            f"cache ({per_seq / 1e9:.3f} GB) in {memory_fraction:.0%} of "
            f"{hw.memory_bytes / 1e9:g} GB; add --tp, or `graphllm plan`"
        )
    want = largest if batch is None else batch
    if want > largest:
        raise ConfigError(
            f"--batch {want} does not fit: the KV cache holds at most {largest} sequences of "
            f"{prompt + output} tokens"
        )
    ttft = prefill["seconds"]

    def point(b: int) -> dict[str, Any]:
        step = decode(b)["seconds"] + b / output * ttft
        return {
            "batch": b,
            "tpot_seconds": step,
            "tokens_per_second_per_user": 1 / step,
            "tokens_per_second": b / step,
        }

    sizes = sorted({*(2**i for i in range(int(math.log2(largest)) + 1)), largest, want})
    curve = [point(b) for b in sizes]
    at = next(p for p in curve if p["batch"] == want)
    return {
        "model": config.name,
        "hardware": hw.name,
        "rate_model": hw.rate_model,
        "strategy": str(strategy),
        "devices": strategy.devices,
        "prompt": prompt,
        "output": output,
        "memory_fraction": memory_fraction,
        "weight_bytes_per_device": one["weight_bytes"],
        "kv_bytes_per_sequence_per_device": per_seq,
        "kv_capacity_bytes_per_device": budget,
        "max_batch": largest,
        "batch": want,
        "ttft_seconds": ttft,
        "tpot_seconds": at["tpot_seconds"],
        "tokens_per_second_per_user": at["tokens_per_second_per_user"],
        "tokens_per_second": at["tokens_per_second"],
        "curve": curve,
    }


def plot_curve(doc: dict[str, Any], path: Any) -> Any:
    """The throughput-latency curve: aggregate tokens/s against each user's tokens/s."""
    plt, fmt = pyplot_for(path)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    xs = [p["tokens_per_second_per_user"] for p in doc["curve"]]
    ys = [p["tokens_per_second"] for p in doc["curve"]]
    ax.plot(xs, ys, "o-")
    for p, x, y in zip(doc["curve"], xs, ys):
        ax.annotate(f"B={p['batch']}", (x, y), textcoords="offset points", xytext=(4, 4))
    ax.set_xlabel("tokens/s per user (1 / time per output token)")
    ax.set_ylabel("tokens/s in all")
    ax.set_title(
        f"{doc['model']} on {doc['devices']} {doc['hardware']} ({doc['rate_model']}), "
        f"{doc['prompt']} in / {doc['output']} out"
    )
    ax.grid(True, alpha=0.3)

    def save(tmp: Any) -> None:
        fig.savefig(tmp, format=fmt, bbox_inches="tight")

    try:
        write_atomic(path, save)
    finally:
        plt.close(fig)
    return path
