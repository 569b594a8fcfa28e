"""Edges of the traced frontend: a size a config class derives, a model that keeps no cache,
a write into a view graphllm does not follow."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.trace import traced_graph
from graphllm.trace.hf import hf_config
from tests.support.traced import FAMILIES, TINY


def test_a_layer_count_the_config_class_derives_is_not_a_default():
    """Nemotron-H's num_hidden_layers is a property of its layer pattern: a config without the
    field is complete; one without its hidden size is not."""
    raw = {k: v for k, v in FAMILIES["mamba2"].items() if k != "num_hidden_layers"}
    assert hf_config(raw).num_hidden_layers == 3
    with pytest.raises(ConfigError, match="missing required field 'hidden_size'"):
        hf_config({k: v for k, v in raw.items() if k != "hidden_size"})


def test_a_model_without_a_cache_traces_its_prefill():
    """GPT-1 keeps no cache and slices its causal buffer, a constant, by the positions: the
    slice carries no token's information, and a cached step is refused in one line."""
    raw = dict(
        model_type="openai-gpt", vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=512
    )
    g = traced_graph(raw, Workload(batch=2, seq_len=5))
    mixing = sorted(run(g, ["tokens"])["tokens"].to_dict()["mixing_ops"])
    assert [m.split("[")[0] for m in mixing] == ["aten._softmax", "aten.bmm"]
    with pytest.raises(ConfigError, match="returns no cache"):
        traced_graph(raw, Workload(batch=2, seq_len=1, past_len=4))


def test_the_tiny_families_cover_each_kind():
    assert {"dense", "moe", "mla", "sliding", "linear_attention", "mamba2"} <= set(FAMILIES)
    assert TINY["num_hidden_layers"] == 2


def test_a_mask_no_layer_reads_is_not_read():
    """Qwen2-MoE builds a sliding-window mask beside the causal one even with no sliding layer
    (use_sliding_window false, its window then 0, a relation of nothing): only the masks the
    attention reads are read."""
    raw = dict(
        FAMILIES["moe"],
        model_type="qwen2_moe",
        shared_expert_intermediate_size=16,
        sliding_window=64,
        use_sliding_window=False,
    )
    g = traced_graph(raw, Workload(batch=2, seq_len=5))
    masks = [n.attrs for n in g.nodes() if n.op == "mask"]
    assert masks and all(m == {"causal": True, "window": None} for m in masks)


def test_a_drafter_that_reads_its_targets_kv_states_is_refused():
    # Gemma 4's assistant runs on its target model's embeddings and KV states: building its
    # text decoder alone would trace a model that is not the one asked for
    with pytest.raises(ConfigError, match="drafter that attends to its target model's KV"):
        hf_config({"model_type": "gemma4_unified_assistant"})


def test_weights_the_text_forward_never_reads_are_refused():
    # TrOCR's decoder layers each hold a cross-attention to an image encoder's states, which a
    # text-only forward skips: the graph would be a plainer model than the one asked for
    raw = dict(
        model_type="trocr",
        vocab_size=96,
        d_model=32,
        decoder_layers=2,
        decoder_attention_heads=4,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    with pytest.raises(ConfigError, match=r"never reads .*decoder.layers.0.encoder_attn"):
        traced_graph(raw, Workload(seq_len=4))
