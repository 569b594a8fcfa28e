"""The traced frontend against graphllm's own families on published configs at full size: the
same parameters, matmul FLOPs, KV cache and weight bytes, and the same ops mixing tokens.
(benchmarks/traced_vs_built.py runs every preset.)"""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
from graphllm.build.builder import build_graph
from graphllm.models.config import load_config, read_config_source
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.trace import traced_graph

PASSES = ["params", "tokens", "cost", "memory"]


@pytest.mark.parametrize("preset", ["qwen3-0.6b", "gemma3-1b", "mixtral-8x7b", "gemma2-9b"])
@pytest.mark.parametrize("past", [0, 40])
def test_traced_equals_built(preset, past):
    wl = Workload(seq_len=24, past_len=past)
    raw, name = read_config_source(preset)
    built = run(build_graph(load_config(preset), wl), PASSES, exact_sets=False)
    traced = run(traced_graph(raw, wl, name), PASSES, exact_sets=False)
    assert traced["params"].total == built["params"].total
    assert traced["params"].active == built["params"].active
    for key in ("matmul", "matmul_causal"):
        assert traced["cost"].flops[key] == built["cost"].flops[key], key
    assert traced["memory"].kv_cache == built["memory"].kv_cache
    assert traced["memory"].weights == built["memory"].weights
    mixing = [sorted(r["tokens"].to_dict()["mixing_ops"]) for r in (traced, built)]
    assert mixing[0] == mixing[1]
