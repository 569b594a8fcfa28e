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
from tests.support.stored import assert_stored_as_built

PASSES = ["params", "tokens", "cost", "memory"]


HUB = "tests/fixtures/hub/{}/config.json"
# dense, sliding, MoE, soft-capped sliding; MLA with group-limited routing; a multimodal wrapper
CONFIGS = ["qwen3-0.6b", "gemma3-1b", "mixtral-8x7b", "gemma2-9b"]
CONFIGS += [HUB.format("deepseek-ai/DeepSeek-V3"), HUB.format("google/gemma-3-4b-it")]
# Gated DeltaNet and gated attention, 3:1, MoE
CONFIGS += [HUB.format("Qwen/Qwen3-Next-80B-A3B-Thinking")]
# RoPE as complex products
CONFIGS += [HUB.format("deepseek-ai/DeepSeek-V2-Lite")]
# Mamba2 and attention layers
CONFIGS += [HUB.format("nvidia/Nemotron-H-56B-Base-8K")]


@pytest.mark.parametrize("preset", CONFIGS, ids=lambda c: c.split("/")[-2] if "/" in c else c)
@pytest.mark.parametrize("past", [0, 40])
def test_traced_equals_built(preset, past):
    wl = Workload(seq_len=24, past_len=past)
    raw, name = read_config_source(preset)
    # compared at the workload's dtype here; test_stored_weights_equal_built below compares
    # the checkpoint's stored formats
    raw = {k: v for k, v in raw.items() if k != "quantization_config"}
    built = run(build_graph(load_config(raw), wl), PASSES, exact_sets=False)
    g = traced_graph(raw, wl, name)
    traced = run(g, PASSES, exact_sets=False)
    assert traced["params"].total == built["params"].total
    assert traced["params"].active == built["params"].active
    # each weight under the kind the built family counts it in (attention, MoE, router, ...)
    kinds = [r["params"].to_dict()["by_kind"] for r in (traced, built)]
    assert kinds[0] == kinds[1]
    for key in ("matmul", "matmul_causal"):
        assert traced["cost"].flops[key] == built["cost"].flops[key], key
    assert traced["memory"].kv_cache == built["memory"].kv_cache
    # DeepSeek-V3's router weight and correction bias are fp32 in transformers' model (its
    # DeepseekV3TopkRouter), the built graph stores them at the weight dtype: 0.02% of 1.3 TB
    assert traced["memory"].weights == pytest.approx(built["memory"].weights, rel=5e-4)
    if "DeepSeek" not in preset:
        assert traced["memory"].weights == built["memory"].weights
    mixing = [sorted(r["tokens"].to_dict()["mixing_ops"]) for r in (traced, built)]
    assert mixing[0] == mixing[1]
    # transformers' cache keeps a conv state of K inputs, the built graph the K-1 the next
    # step reads: one position of its channels a conv (B, C, K), in bf16
    convs = [g.type_of(r) for k, r in g.outputs.items() if k.endswith(".conv_state")]
    extra = sum(2 * t.numel(g.bindings) / t.dims[-1].size for t in convs)
    assert traced["memory"].state - built["memory"].state == extra
    assert bool(convs) == ("Qwen3-Next" in preset or "Nemotron-H" in preset)


# quantized checkpoints of built families: FP8 in 128x128 blocks (DeepSeek-V3, MiniMax-M2.7,
# whose built graph names its MoE block otherwise and counts its correction bias a router's
# where the trace counts it the MoE block's), MXFP4 experts (gpt-oss, whose traced experts
# run as transformers' batched matmuls over every expert: its bytes read differ, its weights not)
STORED = {
    "DeepSeek-V3": ("deepseek-ai/DeepSeek-V3", True, True),
    "MiniMax-M2.7": ("MiniMaxAI/MiniMax-M2.7", False, True),
    "gpt-oss-20b": ("openai/gpt-oss-20b", True, False),
}


@pytest.mark.parametrize("which", list(STORED))
def test_stored_weights_equal_built(which):
    """A published quantized config traced keeps its checkpoint's formats: the built graph's
    weight bytes (total, active, by dtype, by kind), weight bytes read a step, and each param's
    stored format and dtype."""
    path, alike, cost = STORED[which]
    raw, _ = read_config_source(HUB.format(path))
    assert raw.get("quantization_config")
    assert_stored_as_built(raw, Workload(seq_len=24), alike=alike, cost=cost)
