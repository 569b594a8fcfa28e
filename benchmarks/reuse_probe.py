"""Probe for issue 20 point 6 (not wired into `trace`): can one layer of each kind stand for all?

Builds the full graph and the reduced one (`plan.reduced_config`: one layer of each kind), runs
the trace passes on both, expands the reduced graph's node sequence to the full model's (each
real layer's segment from its reduced layer's, the layer index substituted in the names, a shared
node such as attention_mask kept at its first appearance only) and checks, per family at prefill
and at decode with a past:

- that the expanded names are the full graph's, in its order;
- that each node's cost equals that of the full graph's node of the same name;
- that the cost report's totals, by-scope, by-op and per-layer figures, re-summed over the
  expanded sequence in that order, are bit-identical to the full pass's (float sums included:
  an expansion that multiplies a layer's figures by N would not be).

It also times the full analysis against the reduced one (the floor of the reuse design).
Also each node's roofline time, and the total seconds re-summed in order (and whether
N x a layer's seconds would do). Not yet covered: tokens, memory (peak_at), params, the graph section (edges, op
counts, outputs): see the report of issue 20.

    python benchmarks/reuse_probe.py [PRESET ...]
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout
    sys.path.insert(0, str(ROOT))

import graphllm  # noqa: E402
import graphllm.passes  # noqa: E402
from graphllm.build.kinds import LAYER  # noqa: E402
from graphllm.ir import Graph, Node  # noqa: E402
from graphllm.models.hardware import load_hardware  # noqa: E402
from graphllm.passes.cost import ZERO, layer_of, layer_scopes, scopes_of  # noqa: E402
from graphllm.passes.parallel.plan import reduced_config  # noqa: E402

PASSES = ["verify", "params", "tokens", "cost", "memory", "roofline"]
FAMILIES = (
    "llama3.1-405b",
    "gemma2-9b",
    "gpt-oss-20b",
    "deepseek-v3",
    "glm4.5-air",
    "qwen3-next-80b-a3b",
    "nemotron-h-8b",
)


def expand(reduced: Graph, index: list[int]) -> list[tuple[str, Node]]:
    """The full model's node sequence as (name, the reduced graph's node standing for it)."""
    lays = layer_scopes(reduced)
    nodes = list(reduced.nodes())
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, n in enumerate(nodes):
        lay = layer_of(reduced, n.name)
        if lay:
            r = lays.index(lay)
            first.setdefault(r, k)
            last[r] = k
    # a layer's segment runs from its first node to its last: a past cache input
    # (past_key_values.3.key) lies outside the layer scope but inside its segment
    out = [(n.name, n) for n in nodes[: first[0]]]
    seen = {name for name, _ in out}
    for i, r in enumerate(index):
        pat = re.compile(rf"(?<=\.){r}(?=\.|$)")
        for n in nodes[first[r] : last[r] + 1]:
            name = pat.sub(str(i), n.name, count=1)
            if name not in seen:  # a shared input made on first use belongs to no layer
                seen.add(name)
                out.append((name, n))
    out += [(n.name, n) for n in nodes[last[len(lays) - 1] + 1 :]]
    return out


def cost_fold(seq: list[tuple[str, Node]], full: Graph) -> tuple[Any, ...]:
    """cost_pass's roll-up, over the expanded sequence in its order."""
    flops = 0
    nbytes = 0.0
    by_scope: dict[str, Any] = defaultdict(int)
    bytes_by_scope: dict[str, float] = defaultdict(float)
    by_op: dict[str, Any] = defaultdict(int)
    layers: dict[str, dict[str, Any]] = {}
    read = written = 0.0
    for name, n in seq:
        oc = n.meta["cost"]
        if oc is ZERO:
            continue
        flops += oc.flops
        read += oc.bytes_read
        written += oc.bytes_written
        by_op[n.op] += oc.flops
        kinds = set()
        for prefix, kind in scopes_of(full, name):  # the reuse path would expand these too
            if kind == LAYER:
                lay = layers.setdefault(prefix, {"flops": 0, "bytes": 0.0})
                lay["flops"] += oc.flops
                lay["bytes"] += oc.bytes
            else:
                kinds.add(kind)
        for kind in kinds:
            by_scope[kind] += oc.flops
            bytes_by_scope[kind] += oc.bytes
    nbytes = read + written
    return flops, nbytes, dict(by_scope), dict(bytes_by_scope), dict(by_op), list(layers.values())


def _scaled(seq: list[tuple[str, Node]], want: float) -> bool:
    """Whether the seconds summed per distinct node, times its count, also match: they need
    not, which is why the expansion re-sums in order."""
    count: dict[int, int] = defaultdict(int)
    for _, n in seq:
        count[id(n)] += 1
    nodes = {id(n): n for _, n in seq}
    return sum(nodes[k].meta["time"].seconds * c for k, c in count.items()) == want


def _median_ms(fn: Any, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def probe(preset: str) -> None:
    hw = load_hardware("h100")
    config = graphllm.load_config(preset)
    small, index = reduced_config(config)
    for wl in (
        graphllm.Workload(batch=1, seq_len=2048),
        graphllm.Workload(batch=2, seq_len=1, past_len=4000),
    ):
        full = graphllm.build_graph(config, wl)
        res = graphllm.passes.run(full, PASSES, hardware=hw)
        reduced = graphllm.build_graph(small, wl)
        graphllm.passes.run(reduced, PASSES, hardware=hw)
        seq = expand(reduced, index)
        names = [name for name, _ in seq] == [n.name for n in full.nodes()]
        per_node = names and all(n.meta["cost"] == full[name].meta["cost"] for name, n in seq)
        c = res["cost"]
        want = (
            c.flops["total"],
            c.bytes["total"],
            c.flops["by_scope"],
            c.bytes["by_scope"],
            c.flops["by_op"],
            [{k: v for k, v in d.items() if k != "layer"} for d in c.per_layer],
        )
        folded = cost_fold(seq, full) == want
        roof = res["roofline"]
        times = [n.meta["time"].seconds for _, n in seq]
        per_time = names and all(n.meta["time"] == full[name].meta["time"] for name, n in seq)
        seconds = 0.0
        for t in times:  # the pass's own order of addition: a float sum is not associative
            if t:
                seconds += t
        if roof.cuda_graphs:  # decode launches through a CUDA graph: one replay per step
            seconds += hw.achievable.graph_replay_seconds
        print(
            f"{preset} {wl.phase}: {config.num_hidden_layers} -> {small.num_hidden_layers} "
            f"layers; names {names}, per-node cost {per_node}, cost roll-up {folded}, "
            f"per-node time {per_time}, seconds {seconds == roof.seconds} "
            f"(N x layer: {_scaled(seq, roof.seconds)})"
        )

    def run_full() -> None:
        graphllm.passes.run(graphllm.build_graph(config, wl), PASSES, hardware=hw)

    def run_reduced() -> None:
        graphllm.passes.run(graphllm.build_graph(small, wl), PASSES, hardware=hw)

    wl = graphllm.Workload(batch=1, seq_len=2048)
    print(
        f"  T=2048: full {_median_ms(run_full):.1f} ms, reduced {_median_ms(run_reduced):.1f} "
        f"ms (load {os.getloadavg()[0]:.1f})"
    )


if __name__ == "__main__":
    for p in sys.argv[1:] or FAMILIES:
        probe(p)
