"""A rank's program cut into segments (runtime/dist/segments.py), run rank by rank in one process
with the cut points carried out by the op table's group impls: every strategy's logits and
presents equal the single-device run's, so the segments' boundaries (what each reads and hands
on, across pipeline stages too) and the rank attrs baked into them are right. No torch."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import pytest

from graphllm import Workload, build_graph
from graphllm.build.weights import random_weights
from graphllm.models.config import config_from_dict
from graphllm.ops import OPS
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.dist.segments import Cut, NumpyRunner, Segment, cut, on_rank, value_name
from graphllm.runtime.interpret import Interpreter, default_feeds
from graphllm.runtime.spmd import assemble, shard
from tests.runtime.dist.support import CONFIGS


def _simulate(program, weights, feeds):
    """Every rank's steps, a rank advancing until it meets a cut point its peers have not all
    reached (a recv: until its send ran)."""
    mesh = program.meta["partition"].mesh
    ranks = [tuple(c.values()) for c in mesh.coords()] or [()]
    coords = {r: dict(zip(mesh.names, r)) for r in ranks}
    steps = {r: cut(program, coords[r]) for r in ranks}
    env = {r: {} for r in ranks}
    for r in ranks:
        for n in program.nodes("input"):
            if on_rank(n, coords[r]):
                env[r][n.name] = shard(feeds[n.name], n.meta["sharding"][0], mesh, coords[r])
    at = dict.fromkeys(ranks, 0)
    sent = {}
    while any(at[r] < len(steps[r]) for r in ranks):
        moved = False
        for r in ranks:
            while at[r] < len(steps[r]) and isinstance(st := steps[r][at[r]], Segment):
                w = {
                    p: shard(weights[p], program[p].meta["sharding"][0], mesh, coords[r])
                    for p in st.params
                }
                env[r].update(NumpyRunner(st, w).run({k: env[r][k] for k in st.inputs}))
                at[r] += 1
                moved = True
        for r in ranks:
            if at[r] >= len(steps[r]):
                continue
            st = steps[r][at[r]]
            if isinstance(st, Segment):  # a collective of its group just let it on
                continue
            node = program[st.node]
            spec = OPS[node.op]
            if not spec.collective:  # a send: hand the value on
                p = mesh.names.index("pp")
                peer = r[:p] + (node.attrs["dst"],) + r[p + 1 :]
                sent[(node.name, peer)] = env[r][st.inputs[0]]
                env[r][node.name] = env[r][st.inputs[0]]
                at[r] += 1
                moved = True
                continue
            if "src" in node.attrs:  # a recv
                key = (node.inputs[0].node, r)
                if key in sent:
                    env[r][node.name] = sent[key]
                    at[r] += 1
                    moved = True
                continue
            k = mesh.names.index(node.attrs["mesh"])
            group = [r[:k] + (j,) + r[k + 1 :] for j in range(mesh.size(node.attrs["mesh"]))]
            ready = all(
                at[g] < len(steps[g]) and getattr(steps[g][at[g]], "node", None) == node.name
                for g in group
            )
            if ready:
                ys = spec.impl([env[g][st.inputs[0]] for g in group], node.attrs)
                for g, y in zip(group, ys):
                    env[g][node.name] = y
                    at[g] += 1
                moved = True
        assert moved, "the ranks' steps deadlock"
    out = {}
    for name, ref in program.outputs.items():
        node = program[ref.node]
        parts = {r: env[r][value_name(ref)] for r in ranks if on_rank(node, coords[r])}
        out[name] = assemble(parts, node.meta["sharding"][ref.index], mesh, coords)
    return out, steps


CASES = [
    ("dense", Strategy(tp=2, cp=2), 0),
    ("dense", Strategy(tp=2, sp=True, pp=2, microbatches=2), 0),
    ("dense", Strategy(dp=2, tp=2), 8),
    ("moe", Strategy(ep=2, tp=2, pp=2), 8),
    ("deepseek", Strategy(ep=2, tp=2), 0),
    ("deepseek", Strategy(pp=2, ep=2), 8),
]


@pytest.mark.parametrize(("family", "strategy", "past"), CASES)
def test_segments_run_rank_by_rank_equal_one_device(family, strategy, past):
    cfg = config_from_dict(dict(CONFIGS[family]), family)
    t = 1 if past else 8
    g = build_graph(cfg, Workload.with_dtype(batch=4, seq_len=t, past_len=past, dtype="fp32"))
    weights = random_weights(g, seed=2)
    rng = np.random.default_rng(2)
    pasts = {}
    for n in g.nodes("input"):
        if n.name.startswith("past_key_values."):
            shape = tuple(int(s) for s in n.out.shape(g.bindings))
            pasts[n.name.replace("past_key_values.", "present.")] = rng.standard_normal(
                shape
            ).astype(np.float32)
    feeds = default_feeds(g, rng.integers(0, 256, (4, t)), pasts or None)
    want = Interpreter(g, weights).run(feeds)
    program = partition(g, strategy)
    got, steps = _simulate(program, weights, feeds)
    for k in want:
        assert np.max(np.abs(want[k] - got[k])) < 1e-5, k
    first = next(iter(steps.values()))
    cuts = [s for s in first if isinstance(s, Cut)]
    assert cuts
    assert not any(isinstance(a, Segment) and isinstance(b, Segment) for a, b in pairwise(first))
    segment = next(s for s in first if isinstance(s, Segment))
    assert segment.coords is not None and len(segment.in_refs) == len(segment.inputs)
