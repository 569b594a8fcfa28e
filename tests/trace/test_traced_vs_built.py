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


HUB = "tests/fixtures/hub/{}/config.json"
# dense, sliding, MoE, soft-capped sliding; MLA with group-limited routing; a multimodal wrapper
CONFIGS = ["qwen3-0.6b", "gemma3-1b", "mixtral-8x7b", "gemma2-9b"]
CONFIGS += [HUB.format("deepseek-ai/DeepSeek-V3"), HUB.format("google/gemma-3-4b-it")]
# Gated DeltaNet and gated attention, 3:1, MoE
CONFIGS += [HUB.format("Qwen/Qwen3-Next-80B-A3B-Thinking")]


@pytest.mark.parametrize("preset", CONFIGS, ids=lambda c: c.split("/")[-2] if "/" in c else c)
@pytest.mark.parametrize("past", [0, 40])
def test_traced_equals_built(preset, past):
    wl = Workload(seq_len=24, past_len=past)
    raw, name = read_config_source(preset)
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}  # not traced yet
    built = run(build_graph(load_config(raw), wl), PASSES, exact_sets=False)
    g = traced_graph(raw, wl, name)
    traced = run(g, PASSES, exact_sets=False)
    assert traced["params"].total == built["params"].total
    assert traced["params"].active == built["params"].active
    for key in ("matmul", "matmul_causal"):
        assert traced["cost"].flops[key] == built["cost"].flops[key], key
    assert traced["memory"].kv_cache == built["memory"].kv_cache
    # DeepSeek-V3's router weight and correction bias are fp32 in transformers' model (its
    # DeepseekV3TopkRouter), the built graph stores them at the weight dtype: 0.02% of 1.3 TB
    assert traced["memory"].weights == pytest.approx(built["memory"].weights, rel=2e-4)
    if "DeepSeek" not in preset:
        assert traced["memory"].weights == built["memory"].weights
    mixing = [sorted(r["tokens"].to_dict()["mixing_ops"]) for r in (traced, built)]
    assert mixing[0] == mixing[1]
    # transformers' cache keeps a conv state of K inputs, the built graph the K-1 the next
    # step reads: one position of the conv's channels a linear-attention layer, in bf16
    linear = sum(1 for n in g.nodes() if n.op.startswith("gated_delta"))
    conv = 2 * raw.get("linear_num_key_heads", 0) * raw.get("linear_key_head_dim", 0)
    conv += raw.get("linear_num_value_heads", 0) * raw.get("linear_value_head_dim", 0)
    assert traced["memory"].state - built["memory"].state == linear * conv * 2


def test_a_multimodal_wrapper_traces_its_text_decoder():
    raw, name = read_config_source(HUB.format("google/gemma-3-4b-it"))
    g = traced_graph(raw, Workload(seq_len=8), name)
    assert g.meta["config"].text_decoder_of == "gemma3"
    assert g.meta["config"].model_type == "gemma3_text"


def test_past_gemma3_window_the_cache_is_what_transformers_keeps():
    """Past Gemma-3-1B's 512-position window the traced graph keeps each sliding layer's last
    511 keys, as transformers' cache does; the built graph's cache of this step holds the 512
    it attends over (the new token too): one position a sliding layer apart."""
    wl = Workload(seq_len=1, past_len=1000)
    raw, name = read_config_source("gemma3-1b")
    built = run(build_graph(load_config("gemma3-1b"), wl), PASSES, exact_sets=False)
    traced = run(traced_graph(raw, wl, name), PASSES, exact_sets=False)
    for key in ("matmul", "matmul_causal"):
        assert traced["cost"].flops[key] == built["cost"].flops[key], key
    cfg = load_config("gemma3-1b")
    sliding = sum(t == "sliding_attention" for t in cfg.layer_types)
    one_position = 2 * cfg.num_key_value_heads * cfg.head_dim * 2  # K and V, bf16
    assert built["memory"].kv_cache - traced["memory"].kv_cache == sliding * one_position
