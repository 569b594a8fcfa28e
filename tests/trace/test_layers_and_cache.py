"""Recurring layers are recorded once per kind and written out for the rest; a traced model is
read back from the disk cache the second time."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
from graphllm.models.workload import Workload
from graphllm.trace import model as traced_model
from graphllm.trace import traced_graph
from graphllm.trace.forward import record
from graphllm.trace.hf import causal_lm, hf_config
from graphllm.trace.layers import representatives
from tests.support.traced import FAMILIES


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
