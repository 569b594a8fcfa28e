"""Serving figures of one model replica: time to first token, time per output token, tokens/s per
user and in all, the largest batch the KV cache holds, and the throughput-latency curve.

The model of continuous batching is a steady state: B sequences decode together; each step is
one decode step of the batch at the average context (the prompt plus half the output), and every
sequence that finishes (one in `output` steps per sequence) is replaced by a new one whose prompt
is prefilled in chunks between the decode steps, so a step also carries B / output prompts'
prefill. A new request's first token waits for its own prefill (queueing is not modelled).

Memory: the device keeps `memory_fraction` of its memory for weights and cache (vLLM's
`gpu_memory_utilization`, 0.9 by default); what the weights and one step's activations leave
holds the KV cache, each sequence's at its full length (prompt + output), beside the conv and
recurrent states of its linear-attention or Mamba layers (a fixed size a sequence).

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

`--microbatches M` (with `--pp`) sets how many microbatches decode keeps in flight, M in place
of pp: a sequence's token comes every max(M x the slowest stage's step, the sum of the stages'
steps) on a microbatch of batch / (dp M), so M = pp is the default's figure, fewer leave stages
idle and more make each stage's turn longer with smaller microbatches; and a prompt's prefill is
pipelined over the stages in M chunks (serving_steps.py), the first token after the fill.

`--ep E`: partition cuts a decode batch over the E ranks (each attends for its own sequences),
so a replica's batch is a multiple of E x the microbatches in flight, and each device's cache
holds 1/E of the sequences: the replica holds E times what one device's cache does.

`--cp N` (serving_steps.py): the prompt's tokens split over N ranks for prefill (the partition
report's cp program, its gathers of K and V included); at decode each cp rank holds 1/N of
every sequence's cache, so the replica holds N times the sequences, and a step attends over
its shard and all-gathers the partial outputs and their log-sum-exps over the cp group.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from graphllm.errors import ConfigError
from graphllm.files import write_atomic
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import MAX_POSITIONS, Workload
from graphllm.passes.parallel.partition import Strategy
from graphllm.report.plot import pyplot_for
from graphllm.report.serving_steps import (
    decode_stages,
    pipelined,
    prefill_chunks,
    require_cp_cache,
)

MEMORY_FRACTION = 0.9  # vLLM's default gpu_memory_utilization


def _require_combination(s: Strategy) -> None:
    """One line for a strategy serving does not model."""
    if s.microbatches > 1 and s.pp == 1:
        raise ConfigError(
            "serving --microbatches sets the microbatches in flight through the --pp stages; "
            "give --pp N with N > 1"
        )
    if s.microbatches > 1 and s.cp > 1:
        raise ConfigError(
            "serving --cp with --microbatches: a prompt's chunks after the first would attend "
            "over a past that cp holds sharded, which the cp prefill program does not model; "
            "drop one of them"
        )


def _require_context(config: ModelConfig, prompt: int, output: int) -> None:
    """One line for requests longer than the model's context (a server refuses them)."""
    total, context = prompt + output, min(config.max_position_embeddings, MAX_POSITIONS)
    if total > context:
        raise ConfigError(
            f"--prompt-len {prompt} + --output-len {output} = {total:,} tokens, past "
            f"{config.name}'s context of {context:,}"
            + (
                " (max_position_embeddings)"
                if context == config.max_position_embeddings
                else " (graphllm's limit on positions)"
            )
        )
    if output < 2:
        raise ConfigError(
            "--output-len 1 is the first token alone: no decode step, so no time per output "
            "token; give 2 or more (graphllm trace -t PROMPT times the prefill alone)"
        )


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
    microbatches_given: bool = False,
) -> dict[str, Any]:
    """The serving figures of `config` on `strategy` x `hw` for requests of `prompt` tokens in
    and `output` out; `batch` concurrent sequences (None: the largest that fits). Decode keeps
    the strategy's microbatches in flight through the stages where above 1 or
    `microbatches_given` (`--microbatches 1` with `--pp`: one, the other stages idle), else pp."""
    _require_combination(strategy)
    _require_context(config, prompt, output)
    require_cp_cache(config, strategy.cp, prompt)
    if not 0 < memory_fraction <= 1:
        raise ConfigError(f"--memory-fraction must be in (0, 1], got {memory_fraction}")
    dtypes = {k: getattr(base, k) for k in ("weight_dtype", "act_dtype", "kv_dtype")}
    avg = prompt + output // 2
    dp, pp, ep = strategy.dp, strategy.pp, strategy.ep
    given = microbatches_given or strategy.microbatches > 1
    flight = strategy.microbatches if given else pp  # decode microbatches in flight
    chunks = strategy.microbatches  # of a prompt's prefill
    # each replica's program is the same; serving pipelines the microbatches itself
    replica = dataclasses.replace(strategy, dp=1, microbatches=1)

    def decode(b: int, keys: int = avg + 1) -> list[dict]:
        """Each stage's step on a microbatch of `b` sequences attending over `keys` positions."""
        wl = Workload(batch=b, seq_len=1, logits="last", **dtypes)
        return decode_stages(config, wl, replica, hw, attention, keys)

    prefill = prefill_chunks(
        config, Workload(logits="last", **dtypes), replica, hw, attention, prompt, chunks
    )  # [chunk][stage]
    # a sequence at its full length, per stage; partition cuts a decode batch over the ep
    # ranks, so ep sequences leave one in each ep rank's cache
    full = decode(ep, prompt + output)
    room = []  # per stage: (sequences a device's cache holds, its budget, one sequence's cache)
    for st in full:
        budget = memory_fraction * hw.memory_bytes - st["weight_bytes"] - st["activation_bytes"]
        per_seq = st["kv_cache_bytes"] + st["state_bytes"]  # hybrid layers' states too
        room.append((math.floor(budget / per_seq) if per_seq > 0 else 0, budget, per_seq))
    tight = min(range(pp), key=lambda i: room[i][0])  # the fullest stage bounds the replica
    held, budget, per_seq = room[tight]
    one = full[tight]
    unit = flight * ep  # equal microbatches in flight, each cut over the ep ranks
    largest = held // flight * unit
    in_flight = f"--pp {pp}" if flight == pp else f"--microbatches {flight}"
    if ep > 1:
        in_flight += f" x --ep {ep}"
    if largest < 1:
        where = f" stage {tight}'s" if pp > 1 else ""
        raise ConfigError(
            f"{config.name} on {strategy.devices} {hw.name}:{where} weights "
            f"({one['weight_bytes'] / 1e9:.2f} GB a device) leave no room for "
            f"{'one sequence' if flight == 1 else f'{flight} sequences (one a microbatch)'}'s "
            f"{'KV cache and states' if one['state_bytes'] else 'KV cache'} "
            f"({per_seq / 1e9:.3f} GB a sequence) in {100 * memory_fraction:g}% of "
            f"{hw.memory_bytes / 1e9:g} GB; spread it over more devices (--tp, --pp"
            f"{', --ep' if config.is_moe else ''}), or see `graphllm plan`"
        )
    want = dp * largest if batch is None else batch
    if want % (dp * unit):
        raise ConfigError(
            f"--batch {want} must be a multiple of --dp {dp} x {in_flight}: each of the {dp} "
            f"replicas keeps {flight} equal microbatch{'es' if flight > 1 else ''} in flight"
            + (f", each cut over the {ep} ep ranks" if ep > 1 else "")
        )
    if want > dp * largest:
        raise ConfigError(
            f"--batch {want} does not fit: the KV cache holds at most {dp * largest} sequences "
            f"of {prompt + output} tokens"
        )
    ttft = pipelined(prefill)  # one chunk: the prompt passes each stage in turn
    # a prompt's turn on the slowest stage: every chunk of it
    prefill_turn = max(sum(col) for col in zip(*prefill))
    steps: dict[int, list[dict]] = {}

    def point(b: int) -> dict[str, Any]:
        """The steady state of a replica serving `b` sequences in `flight` microbatches."""
        steps[b] = decode(b // flight)
        secs = [st["seconds"] for st in steps[b]]
        # the slowest stage's turn on every microbatch, or one microbatch's lap of the ring
        step = max(flight * max(secs), sum(secs)) + b / output * prefill_turn
        return {
            "batch": dp * b,
            "tpot_seconds": step,
            "tokens_per_second_per_user": 1 / step,
            "tokens_per_second": dp * b / step,
        }

    grid = (unit * 2**i for i in range(int(math.log2(largest // unit)) + 1))
    sizes = sorted({*grid, largest, want // dp})
    curve = [point(b) for b in sizes]
    at = next(p for p in curve if p["batch"] == want)
    return {
        "model": config.name,
        "hardware": hw.name,
        "rate_model": hw.rate_model,
        "strategy": strategy.describe(),
        "devices": strategy.devices,
        "prompt": prompt,
        "output": output,
        "memory_fraction": memory_fraction,
        "weight_bytes_per_device": one["weight_bytes"],
        "kv_bytes_per_sequence_per_device": one["kv_cache_bytes"],
        "state_bytes_per_sequence_per_device": one["state_bytes"],
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
        "context_parallel": strategy.cp,
        "microbatches_in_flight": flight,
        "prefill_chunks": chunks,
        "stages": [
            {
                "stage": i,
                "layers": full[i]["layers"],
                "prefill_seconds": sum(row[i] for row in prefill),
                "decode_seconds": steps[want // dp][i]["seconds"],
                "cp_combine_seconds": steps[want // dp][i]["combine_seconds"],
                "kv_capacity_bytes": room[i][1],
                "cache_bytes_per_sequence": room[i][2],  # KV cache and state
                "sequences_held": room[i][0],
            }
            for i in range(pp)
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
        f"{doc['model']} on {doc['devices']} {doc['hardware']} ({doc['strategy']}; "
        f"{doc['rate_model']} model), {doc['prompt']} in / {doc['output']} out"
    )
    ax.grid(True, alpha=0.3)

    def save(tmp: Any) -> None:
        fig.savefig(tmp, format=fmt, bbox_inches="tight")

    try:
        write_atomic(path, save)
    finally:
        plt.close(fig)
    return path
