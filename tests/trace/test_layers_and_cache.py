"""Recurring layers are recorded once per kind and written out for the rest; a traced model is
read back from the disk cache the second time."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from graphllm.models.workload import Workload
from graphllm.trace import model as traced_model
from graphllm.trace import traced_graph
from graphllm.trace.forward import record
from graphllm.trace.hf import causal_lm, hf_config
from graphllm.trace.layers import representatives
from tests.support.traced import FAMILIES, TINY, P, check_traced


def test_layers_of_one_kind_run_once():
    raw = dict(FAMILIES["dense"], num_hidden_layers=4)
    model = causal_lm(hf_config(raw), False, "bf16")
    assert representatives(model) == {f"model.layers.{i}": "model.layers.0" for i in (1, 2, 3)}
    rec = record(model, (2, 5, 0))
    replays = [ev.kwargs["as"] for ev in rec.events if ev.op == "replay"]
    assert replays == ["model.layers.1", "model.layers.2", "model.layers.3"]
    g = traced_graph(raw, Workload(seq_len=8))
    assert "model.layers.3.mlp.down_proj.weight" in g and "present.3.value" in g.outputs
    assert len(g.meta["blocks"]) == 4


def test_sliding_and_full_layers_are_two_kinds():
    raw = dict(FAMILIES["dense"], model_type="gemma3_text", num_hidden_layers=4, sliding_window=64)
    raw["layer_types"] = ["sliding_attention", "full_attention"] * 2
    kinds = representatives(causal_lm(hf_config(raw), False, "bf16"))
    assert kinds == {"model.layers.2": "model.layers.0", "model.layers.3": "model.layers.1"}
    g = traced_graph(raw, Workload(seq_len=8))
    assert g["model.layers.2.self_attn.core.mask"].attrs["window"] == 64
    assert g["model.layers.3.self_attn.core.mask"].attrs["window"] is None


def test_a_second_trace_reads_the_cache(monkeypatch):
    monkeypatch.delenv("GRAPHLLM_TRACE_CACHE", raising=False)
    raw = dict(FAMILIES["qk_norm"], num_hidden_layers=3)
    first = traced_graph(raw, Workload(seq_len=8, past_len=4))

    def no_model(*a, **k):
        raise AssertionError("traced again: the cache was not read")

    monkeypatch.setattr(traced_model, "causal_lm", no_model)
    again = traced_graph(raw, Workload(seq_len=8, past_len=4))
    assert again.print() == first.print()
    assert again.meta["stored_as"] == first.meta["stored_as"]
    assert again.version != first.version  # read back, another graph to version-keyed caches

    def no_lowering(*a, **k):
        raise AssertionError("lowered again: the graph of this workload was not read")

    # the same workload again is the graph lowered before, read back
    lower = traced_model.lower
    monkeypatch.setattr(traced_model, "lower", no_lowering)
    assert traced_graph(raw, Workload(seq_len=8, past_len=4)).print() == first.print()
    monkeypatch.setattr(traced_model, "lower", lower)
    # another workload of the phase is lowered from the same recording
    longer = traced_graph(raw, Workload(seq_len=32, past_len=100, batch=3))
    assert longer.bindings["S"] == 132 and longer.bindings["B"] == 3


def test_a_looped_model_records_every_call_of_a_layer():
    # HRM runs its L stack L_cycles times, then its H stack, H_cycles times over: each call of
    # a layer writes its own cache entry (its index plus the pass's offset), so no layer may
    # stand for another; the weights are one param node however many calls read them
    raw = dict(TINY, model_type="hrm_text", num_hidden_layers=2, H_cycles=2, L_cycles=2)
    model = causal_lm(hf_config(raw), False, "bf16")
    rec = record(model, (2, 5, 0))
    assert representatives(model) == {}
    assert not [ev for ev in rec.events if ev.op == "replay"]
    c = check_traced(raw, past=P)
    assert c.params == c.results["params"].total
    assert c.results["cost"].flops["matmul"] == c.flops
    assert np.abs(c.logits - c.want).max() < 1e-4
    # 2 layers x 2 H cycles x (2 L passes + 1 H pass): twelve cache entries, each appended once
    appended = [n for n in c.graph.nodes() if n.op == "kv_concat"]
    assert len(appended) == 2 * 12 and "present.11.key" in c.graph.outputs


def test_layers_sharing_a_block_each_run():
    # Zamba2's shared transformer block is tied into both hybrid layers, each of which picks
    # its own adapter by its index: neither repeats the other, and the tied weights count once
    raw = dict(
        {k: v for k, v in TINY.items() if k != "head_dim"},  # its attention's: 2 x hidden / heads
        model_type="zamba2",
        num_hidden_layers=4,
        layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
        mamba_d_state=8,
        n_mamba_heads=4,
    )
    kinds = representatives(causal_lm(hf_config(raw), False, "bf16"))
    assert kinds == {"model.layers.2": "model.layers.0"}
    c = check_traced(raw, past=P)
    assert c.params == c.results["params"].total
    assert np.abs(c.logits - c.want).max() < 1e-4
