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

Replicas and stages (issue 20). `--dp` runs that many replicas, each serving batch / dp of the
sequences (the batch must divide), so the aggregate tokens/s is dp times one replica's and the
largest batch dp times a replica's. `--pp` cuts a replica into stages (the partition report's):
- a prompt runs through every stage in turn, so the time to first token is the sum of the
  stages' prefill times, each with its send of the residual stream to the next stage;
- decode keeps pp microbatches in flight, batch / (dp pp) sequences each (the replica's batch
  must be a multiple of pp): every stage works on one microbatch at a time, and the slowest
  stage paces the ring, so each sequence gets a token every pp x the slowest stage's decode
  time of a microbatch (the sum over the stages when they are balanced), and a replica
  delivers its batch's tokens in that time; the prompts that replace finished sequences add,
  each, one turn of the slowest stage's prefill;
- each stage's KV cache holds its own layers' cache of all the replica's sequences, in what
  that stage's weights and activations leave: the replica holds as many sequences as its
  fullest stage.
"""

from __future__ import annotations

import dataclasses
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


def _stages(
    config: ModelConfig, wl: Workload, s: Strategy, hw: Hardware, attention: str
) -> list[dict]:
    """One device's figures of a step in each pipeline stage (partition report)."""
    graph = partition(build_graph(config, wl), s, hw)
    return partition_report(graph, hw, attention).to_dict()["stages"]


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
    if strategy.cp > 1 or strategy.microbatches > 1:
        raise ConfigError(
            "graphllm serving models replicas (--dp) of --tp (with --sp), --ep and --pp; --cp "
            "and --microbatches are not modelled yet"
        )
    if not 0 < memory_fraction <= 1:
        raise ConfigError(f"--memory-fraction must be in (0, 1], got {memory_fraction}")
    dtypes = {k: getattr(base, k) for k in ("weight_dtype", "act_dtype", "kv_dtype")}
    avg = prompt + output // 2
    dp, pp = strategy.dp, strategy.pp
    replica = dataclasses.replace(strategy, dp=1)  # each replica's program is the same

    def decode(b: int, past: int = avg) -> list[dict]:
        """Each stage's step on a microbatch of `b` sequences."""
        wl = Workload(batch=b, seq_len=1, past_len=past, logits="last", **dtypes)
        return _stages(config, wl, replica, hw, attention)

    prefill = _stages(
        config, Workload(seq_len=prompt, logits="last", **dtypes), replica, hw, attention
    )
    full = decode(1, prompt + output - 1)  # a sequence at its full length, per stage
    room = []  # per stage: (sequences its cache holds, its cache budget, one sequence's cache)
    for st in full:
        budget = memory_fraction * hw.memory_bytes - st["weight_bytes"] - st["activation_bytes"]
        per_seq = st["kv_cache_bytes"]
        room.append((math.floor(budget / per_seq) if per_seq > 0 else 0, budget, per_seq))
    tight = min(range(pp), key=lambda i: room[i][0])  # the fullest stage bounds the replica
    held, budget, per_seq = room[tight]
    one = full[tight]
    largest = held // pp * pp  # pp microbatches of equal size in flight
    if largest < 1:
        where = f" stage {tight}'s" if pp > 1 else ""
        raise ConfigError(
            f"{config.name} on {strategy.devices} {hw.name}:{where} weights "
            f"({one['weight_bytes'] / 1e9:.2f} GB a device) leave no room for "
            f"{'one sequence' if pp == 1 else f'{pp} sequences (one a microbatch)'}'s KV "
            f"cache ({per_seq / 1e9:.3f} GB a sequence) in {memory_fraction:.0%} of "
            f"{hw.memory_bytes / 1e9:g} GB; add --tp, or `graphllm plan`"
        )
    want = dp * largest if batch is None else batch
    if want % (dp * pp):
        raise ConfigError(
            f"--batch {want} must be a multiple of --dp {dp} x --pp {pp}: each of the {dp} "
            f"replicas keeps {pp} equal microbatches in flight"
        )
    if want > dp * largest:
        raise ConfigError(
            f"--batch {want} does not fit: the KV cache holds at most {dp * largest} sequences "
            f"of {prompt + output} tokens"
        )
    ttft = sum(st["seconds"] for st in prefill)  # the prompt passes each stage in turn
    prefill_turn = max(st["seconds"] for st in prefill)  # a prompt's turn on the slowest stage

    def point(b: int) -> dict[str, Any]:
        """The steady state of a replica serving `b` sequences in pp microbatches."""
        slowest = max(st["seconds"] for st in decode(b // pp))
        step = pp * slowest + b / output * prefill_turn
        return {
            "batch": dp * b,
            "tpot_seconds": step,
            "tokens_per_second_per_user": 1 / step,
            "tokens_per_second": dp * b / step,
        }

    grid = (pp * 2**i for i in range(int(math.log2(largest // pp)) + 1))
    sizes = sorted({*grid, largest, want // dp})
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
        "max_batch": dp * largest,
        "batch": want,
        "ttft_seconds": ttft,
        "tpot_seconds": at["tpot_seconds"],
        "tokens_per_second_per_user": at["tokens_per_second_per_user"],
        "tokens_per_second": at["tokens_per_second"],
        "curve": curve,
        "replicas": dp,
        "pipeline_stages": pp,
        "stages": [
            {
                "stage": i,
                "layers": pre["layers"],
                "prefill_seconds": pre["seconds"],
                "kv_capacity_bytes": room[i][1],
                "kv_bytes_per_sequence": room[i][2],
                "sequences_held": room[i][0],
            }
            for i, pre in enumerate(prefill)
        ],
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
