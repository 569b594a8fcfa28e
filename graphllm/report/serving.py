"""Serving figures of one model replica: time to first token, time per output token, tokens/s per
user and in all, the largest batch the KV cache holds, and the throughput-latency curve.

The model of continuous batching is a steady state: B sequences decode together; each step is
one decode step of the batch at the average context (the prompt plus half the output), and every
sequence that finishes (one in `output` steps per sequence) is replaced by a new one whose prompt
is prefilled in chunks between the decode steps, so a step also carries B / output prompts'
prefill. A new request's first token waits for its own prefill (queueing is not modelled).

An MLA model's steps are built in the form engines run each in (passes/parallel/engine.py):
a prefill re-expands the cached latent, a decode step attends over it absorbed; `mla` names
one form for both instead.

Memory: the device keeps `memory_fraction` of its memory for weights and cache (vLLM's
`gpu_memory_utilization`, 0.9 by default); what the weights and one step's activations leave
holds the KV cache, each sequence's at its full length (prompt + output), beside the conv and
recurrent states of its linear-attention or Mamba layers (a fixed size a sequence).

Replicas and stages. `--dp` runs that many replicas, each serving batch / dp of the
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
from dataclasses import dataclass
from typing import Any

from graphllm.errors import ConfigError
from graphllm.files import write_atomic
from graphllm.frontends import require_engine_form
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import MAX_POSITIONS, Workload
from graphllm.passes.parallel.engine import mla_form, mla_why
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
    # a traced model whose config gives no max_position_embeddings: graphllm's limit alone
    limit = config.max_position_embeddings or MAX_POSITIONS
    total, context = prompt + output, min(limit, MAX_POSITIONS)
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


@dataclass(frozen=True)
class _Steps:
    """What a replica's steps are priced with: the model, its dtypes, one replica's strategy
    (serving pipelines the microbatches itself), the device, and each phase's MLA form."""

    config: ModelConfig
    dtypes: dict[str, str]
    replica: Strategy
    hw: Hardware
    attention: str
    forms: dict[str, str]  # phase -> MLA form

    def decode(self, b: int, keys: int) -> list[dict]:
        """Each stage's step on a microbatch of `b` sequences attending over `keys` positions."""
        wl = Workload(batch=b, seq_len=1, logits="last", **self.dtypes)
        args = (self.config, wl, self.replica, self.hw, self.attention, keys)
        return decode_stages(*args, self.forms["decode"])

    def prefill(self, prompt: int, chunks: int) -> list[list[float]]:
        """[chunk][stage] seconds of a prompt's prefill in `chunks` chunks."""
        wl = Workload(logits="last", **self.dtypes)
        args = (self.config, wl, self.replica, self.hw, self.attention, prompt, chunks)
        return prefill_chunks(*args, self.forms["prefill"])


def mla_forms(config: ModelConfig, mla: str) -> dict[str, str]:
    """The MLA form of a prefill and of a decode step: `mla`, or the engines' under 'auto'."""
    return {phase: mla_form(config, phase, mla) for phase in ("prefill", "decode")}


def _require_request(
    config: ModelConfig,
    strategy: Strategy,
    prompt: int,
    output: int,
    memory_fraction: float,
    mla: str,
) -> None:
    """One line for a request, strategy, memory share or MLA form serving does not model."""
    require_engine_form(config, mla)  # its decode steps
    _require_combination(strategy)
    _require_context(config, prompt, output)
    require_cp_cache(config, strategy.cp, prompt)
    if not 0 < memory_fraction <= 1:
        raise ConfigError(f"--memory-fraction must be in (0, 1], got {memory_fraction}")


def _room(full: list[dict], hw: Hardware, memory_fraction: float) -> list[tuple]:
    """Per stage: (sequences a device's cache holds, its budget, one sequence's cache), from
    each stage's step on sequences at their full length."""
    room = []
    for st in full:
        budget = memory_fraction * hw.memory_bytes - st["weight_bytes"] - st["activation_bytes"]
        per_seq = st["kv_cache_bytes"] + st["state_bytes"]  # hybrid layers' states too
        room.append((math.floor(budget / per_seq) if per_seq > 0 else 0, budget, per_seq))
    return room


def _no_room(
    config: ModelConfig,
    strategy: Strategy,
    hw: Hardware,
    memory_fraction: float,
    flight: int,
    tight: int,
    full: list[dict],
    room: list[tuple],
) -> ConfigError:
    """The error for stage `tight`, whose weights leave no room for `flight` sequences' cache."""
    stage, per_seq = full[tight], room[tight][2]
    where = f" stage {tight}'s" if strategy.pp > 1 else ""
    return ConfigError(
        f"{config.name} on {strategy.devices} {hw.name}:{where} weights "
        f"({stage['weight_bytes'] / 1e9:.2f} GB a device) leave no room for "
        f"{'one sequence' if flight == 1 else f'{flight} sequences (one a microbatch)'}'s "
        f"{'KV cache and states' if stage['state_bytes'] else 'KV cache'} "
        f"({per_seq / 1e9:.3f} GB a sequence) in {100 * memory_fraction:g}% of "
        f"{hw.memory_bytes / 1e9:g} GB; spread it over more devices (--tp, --pp"
        f"{', --ep' if config.is_moe else ''}), or see `graphllm plan`"
    )


def _require_batch(want: int, largest: int, s: Strategy, flight: int, total: int) -> None:
    """One line for a batch the replicas cannot split into equal microbatches, or hold."""
    dp, ep, unit = s.dp, s.ep, flight * s.ep
    in_flight = f"--pp {s.pp}" if flight == s.pp else f"--microbatches {flight}"
    if ep > 1:
        in_flight += f" x --ep {ep}"
    if want % (dp * unit):
        raise ConfigError(
            f"--batch {want} must be a multiple of --dp {dp} x {in_flight}: each of the {dp} "
            f"replicas keeps {flight} equal microbatch{'es' if flight > 1 else ''} in flight"
            + (f", each cut over the {ep} ep ranks" if ep > 1 else "")
        )
    if want > dp * largest:
        raise ConfigError(
            f"--batch {want} does not fit: the KV cache holds at most {dp * largest} sequences "
            f"of {total} tokens"
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
    mla: str = "auto",
) -> dict[str, Any]:
    """The serving figures of `config` on `strategy` x `hw` for requests of `prompt` tokens in
    and `output` out; `batch` concurrent sequences (None: the largest that fits). Decode keeps
    the strategy's microbatches in flight through the stages where above 1 or
    `microbatches_given` (`--microbatches 1` with `--pp`: one, the other stages idle), else pp.
    `mla`: an MLA model's form in both phases, or 'auto': each phase's as engines run it."""
    _require_request(config, strategy, prompt, output, memory_fraction, mla)
    dtypes = {k: getattr(base, k) for k in ("weight_dtype", "act_dtype", "kv_dtype")}
    forms = mla_forms(config, mla)
    replica = dataclasses.replace(strategy, dp=1, microbatches=1)
    steps = _Steps(config, dtypes, replica, hw, attention, forms)
    given = microbatches_given or strategy.microbatches > 1  # else pp decode microbatches
    flight = strategy.microbatches if given else strategy.pp
    prefill = steps.prefill(prompt, strategy.microbatches)  # [chunk][stage]
    # a sequence at its full length, per stage; partition cuts a decode batch over the ep
    # ranks, so ep sequences leave one in each ep rank's cache
    full = steps.decode(strategy.ep, prompt + output)
    room = _room(full, hw, memory_fraction)
    tight = min(range(strategy.pp), key=lambda i: room[i][0])  # the fullest stage bounds it
    unit = flight * strategy.ep  # equal microbatches in flight, each cut over the ep ranks
    largest = room[tight][0] // flight * unit
    if largest < 1:
        raise _no_room(config, strategy, hw, memory_fraction, flight, tight, full, room)
    want = strategy.dp * largest if batch is None else batch
    _require_batch(want, largest, strategy, flight, prompt + output)
    grid = (unit * 2**i for i in range(int(math.log2(largest // unit)) + 1))
    sizes = sorted({*grid, largest, want // strategy.dp})
    decoded = {b: steps.decode(b // flight, prompt + output // 2 + 1) for b in sizes}
    curve = [_point(decoded[b], b, strategy.dp, flight, output, prefill) for b in sizes]
    at = next(p for p in curve if p["batch"] == want)
    doc = {
        "model": config.name,
        "hardware": hw.name,
        "rate_model": hw.rate_model,
        "strategy": strategy.describe(),
        "devices": strategy.devices,
        "prompt": prompt,
        "output": output,
        "memory_fraction": memory_fraction,
        **_capacity(full[tight], room[tight][1]),
        "max_batch": strategy.dp * largest,
        "batch": want,
        "ttft_seconds": pipelined(prefill),  # one chunk: the prompt passes each stage in turn
    }
    doc |= {k: at[k] for k in ("tpot_seconds", "tokens_per_second_per_user", "tokens_per_second")}
    doc |= _layout(strategy, flight, curve, full, prefill, decoded[want // strategy.dp], room)
    return doc | _mla_section(config, mla, forms)


def _capacity(one: dict[str, Any], budget: float) -> dict[str, Any]:
    """A device's weights, its cache's budget and a sequence's cache, on the fullest stage."""
    return {
        "weight_bytes_per_device": one["weight_bytes"],
        "kv_bytes_per_sequence_per_device": one["kv_cache_bytes"],
        "state_bytes_per_sequence_per_device": one["state_bytes"],
        "kv_capacity_bytes_per_device": budget,
    }


def _point(
    stages: list[dict], b: int, dp: int, flight: int, output: int, prefill: list[list[float]]
) -> dict[str, Any]:
    """The steady state of a replica serving `b` sequences in `flight` microbatches, each
    stage's decode step on one microbatch being `stages`."""
    secs = [st["seconds"] for st in stages]
    prefill_turn = max(sum(col) for col in zip(*prefill))  # a prompt's turn on the slowest stage
    # the slowest stage's turn on every microbatch, or one microbatch's lap of the ring
    step = max(flight * max(secs), sum(secs)) + b / output * prefill_turn
    return {
        "batch": dp * b,
        "tpot_seconds": step,
        "tokens_per_second_per_user": 1 / step,
        "tokens_per_second": dp * b / step,
    }


def _layout(
    s: Strategy,
    flight: int,
    curve: list[dict],
    full: list[dict],
    prefill: list[list[float]],
    decoded: list[dict],
    room: list[tuple],
) -> dict[str, Any]:
    """The document's curve, replicas, stages and microbatches, and each stage's figures."""
    return {
        "curve": curve,
        "replicas": s.dp,
        "pipeline_stages": s.pp,
        "context_parallel": s.cp,
        "microbatches_in_flight": flight,
        "prefill_chunks": s.microbatches,
        "stages": [
            {
                "stage": i,
                "layers": full[i]["layers"],
                "prefill_seconds": sum(row[i] for row in prefill),
                "decode_seconds": decoded[i]["seconds"],
                "cp_combine_seconds": decoded[i]["combine_seconds"],
                "kv_capacity_bytes": room[i][1],
                "cache_bytes_per_sequence": room[i][2],  # KV cache and state
                "sequences_held": room[i][0],
            }
            for i in range(s.pp)
        ],
    }


def _mla_section(config: ModelConfig, mla: str, forms: dict[str, str]) -> dict[str, Any]:
    """An MLA model's forms per phase and why (nothing for another model: its document is as
    it was)."""
    if not config.is_mla:
        return {}
    return {"mla": forms | {"why": mla_why(mla)}}


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
