"""The steps a serving replica runs, per pipeline stage, from the partition report: a prompt's
prefill (whole, or in chunks pipelined over the stages) and a decode step (with the KV cache
sharded over the cp ranks).

Context parallelism at decode. A decode step has one new token a sequence, which cp
cannot cut, and `partition` cuts the tokens on T, so it cannot build that step under cp (nor
under sp); seeding the cache on its key axis instead gives the op table's concat partial sums,
and the program would all-reduce every score and the whole cache, which no engine does. What
is built instead is the step of the strategy without cp and sp (`decode_strategy`), on one cp
rank's shard of the cache, plus the combine that the shards need. vLLM's decode context
parallelism works so: "For context, the KV is distributed across different DCP ranks ...
all-gathering Q and lse, then correcting the attn out" (https://github.com/vllm-project/vllm/
pull/24864), with "Multiplying the GPU KV cache size by the dcp_world_size"; its all-to-all
backend "exchanges partial attention outputs and their LSE values across ranks, then combines
them with exact LSE-weighted reduction", the fp32 LSE "packed into a single output-dtype
buffer" (vllm/v1/attention/ops/dcp_alltoall.py's API page, as built for vLLM pull 42262:
https://vllm--42262.org.readthedocs.build/en/42262/api/vllm/v1/attention/ops/dcp_alltoall/). Here:
- each cp rank holds ceil(keys / cp) of a sequence's positions of every layer's cache, and
  its decode step attends over them (the step of `decode_strategy` at that past length);
- the token's projections, FFN and LM head run whole on every cp rank (cp cuts no weight, and
  one token cannot be cut), so cp buys cache room and shorter attention, not less FFN work;
- each attention layer then all-gathers, over the cp group, every rank's partial output (the
  core attention's output in the activation dtype) and its fp32 log-sum-exp, one packed buffer,
  and each rank sums the partials weighted by their LSEs (that sum, cp x B x H x E
  multiply-adds a layer, is not priced).
A layer whose cache is not every position's keys and values (sliding or chunked windows,
linear attention, Mamba2) is refused under cp: how its window or state would shard is not
modelled.

Microbatches at prefill. `--microbatches M` with `--pp` cuts a prompt into M chunks of
prompt / M tokens; chunk j is the step of prompt / M new tokens over a past of j chunks, and
stage s starts it once stage s-1 has sent it and stage s has finished chunk j-1, so the first
token comes after the pipeline's fill: the last chunk leaving the last stage. Each chunk's step
computes the logits of its last position, as a whole prompt's does, so the M - 1 chunks before
the last count one position's LM head each that an engine would skip.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from graphllm.errors import ConfigError
from graphllm.frontends import is_traced, model_graph
from graphllm.ir import Graph
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload, nbytes
from graphllm.ops import OPS
from graphllm.passes.parallel.figures import collective_seconds
from graphllm.passes.parallel.partition import (
    Strategy,
    decode_strategy,
    make_mesh,
    partition,
    partition_report,
)
from graphllm.passes.registry import meta_result


def programs(
    config: ModelConfig,
    wl: Workload,
    s: Strategy,
    hw: Hardware,
    attention: str,
    mla: str = "naive",
) -> tuple[Graph, list[dict[str, Any]]]:
    """One rank's program of a step (an MLA model's attention in form `mla`), and each pipeline
    stage's figures (partition report)."""
    graph = partition(model_graph(config, wl, mla=mla), s, hw)
    return graph, partition_report(graph, hw, attention).to_dict()["stages"]


def require_cp_cache(config: ModelConfig, cp: int, prompt: int) -> None:
    """One line for a model or prompt whose cache the cp ranks cannot shard by position."""
    if cp == 1:
        return
    if is_traced(config):
        raise ConfigError(
            f"serving --cp shards each layer's cache of every position over the cp ranks; "
            f"{config.name} is traced from transformers' code, and which of its layers keep "
            "a window or a state is not read from it"
        )
    other = sorted({t for t in config.layer_types if t != "full_attention"})
    if other:
        raise ConfigError(
            f"serving --cp shards each layer's cache of every position over the cp ranks; "
            f"{config.name} has {', '.join(other)} layers, whose window or state is not "
            "modelled sharded"
        )
    if prompt % cp:
        raise ConfigError(f"--cp {cp} does not divide the {prompt} prompt tokens (--prompt-len)")


def cp_shard(keys: int, cp: int) -> int:
    """Positions of a sequence's cache that one of `cp` ranks holds (the last rank may hold
    fewer)."""
    return math.ceil(keys / cp)


def combine_seconds(graph: Graph, replica: Strategy, hw: Hardware) -> list[float]:
    """Per stage: the time of a decode step's cp combines in `graph` (the step's program
    without cp): one all-gather over the cp group, per core attention, of each rank's partial
    output and its fp32 log-sum-exp, on the link the cp axis of `replica`'s mesh spans."""
    cp = replica.cp
    out = [0.0] * replica.pp
    if cp == 1:
        return out
    mesh, binds = make_mesh(replica), graph.bindings
    for n in graph.nodes():
        ins = [graph.type_of(r) for r in n.inputs]
        reads_keys = any(d.role == "key_token" for t in ins for d in t.dims)
        if not reads_keys or any(d.role == "key_token" for d in n.out.dims):
            continue  # core attention's output is what contracts the positions attended over
        numel = n.out.numel(binds)
        width = math.prod(int(d.size) for d in n.out.dims if d.role == "head_dim")
        share = nbytes(n.out.dtype, numel) + nbytes("fp32", numel / width)  # output and LSE
        wire = OPS["all_gather"].wire(cp) * cp * share
        stage = meta_result(n, "stage")
        out[stage] += collective_seconds("all_gather", cp, wire, mesh, "cp", hw)
    return out


def decode_stages(
    config: ModelConfig,
    wl: Workload,
    replica: Strategy,
    hw: Hardware,
    attention: str,
    keys: int,
    mla: str = "naive",
) -> list[dict[str, Any]]:
    """Each stage's decode step of one rank for the batch of `wl`, each sequence attending over
    `keys` positions (the new one included) held over the cp ranks: its figures, its time with
    the cp combines (`seconds`) and theirs (`combine_seconds`)."""
    shard = cp_shard(keys, replica.cp)
    step = dataclasses.replace(wl, seq_len=1, past_len=shard - 1)
    graph, stages = programs(config, step, decode_strategy(replica), hw, attention, mla)
    combine = combine_seconds(graph, replica, hw)
    return [
        st | {"seconds": st["seconds"] + c, "combine_seconds": c} for st, c in zip(stages, combine)
    ]


def prefill_chunks(
    config: ModelConfig,
    wl: Workload,
    replica: Strategy,
    hw: Hardware,
    attention: str,
    prompt: int,
    chunks: int,
    mla: str = "naive",
) -> list[list[float]]:
    """times[j][s]: stage s's seconds (its send to the next stage included) on chunk j of a
    prompt of `prompt` tokens cut into `chunks` equal chunks, chunk j over a past of j chunks."""
    if prompt % chunks:
        raise ConfigError(
            f"--microbatches {chunks} does not divide the {prompt} prompt tokens (--prompt-len): "
            "each microbatch of a prompt's prefill is an equal chunk of it"
        )
    c = prompt // chunks
    times = []
    for j in range(chunks):
        step = dataclasses.replace(wl, seq_len=c, past_len=j * c)
        stages = programs(config, step, replica, hw, attention, mla)[1]
        times.append([st["seconds"] for st in stages])
    return times


def pipelined(times: list[list[float]]) -> float:
    """When the last chunk leaves the last stage: stage s starts chunk j once stage s-1 has
    sent it and stage s has finished chunk j-1."""
    done = [0.0] * len(times[0])  # when each stage finished its last chunk
    for row in times:
        ready = 0.0  # when the stage before has sent this chunk
        for s, t in enumerate(row):
            done[s] = max(done[s], ready) + t
            ready = done[s]
    return done[-1]
