"""trace's one-layer-of-each-kind analysis on traced models: the graph cut to the first layer of
each kind the trace found repeating (report/reduced.py), analysed and unrolled, gives the full
graph's document to the last bit, on published configs at full size (dense, sliding/global,
MoE, MLA with dense first layers, Gated DeltaNet hybrid, Mamba2 hybrid), prefill and decode,
on an H100; and where the unrolled sequence is not the full graph node for node,
the full graph is analysed instead."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.files import json_text
from graphllm.models.config import read_config_source
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.report import reduced, reuse
from graphllm.report.trace_report import traced_report
from graphllm.trace import traced_graph

HUB = "tests/fixtures/hub/{}/config.json"
CASES = [
    "qwen3-0.6b",
    "gemma3-1b",  # five sliding layers : one global
    HUB.format("deepseek-ai/DeepSeek-V2-Lite"),  # MLA, a dense first layer, then MoE
    HUB.format("Qwen/Qwen3-Next-80B-A3B-Thinking"),  # 3 Gated DeltaNet : 1 gated attention
    HUB.format("nvidia/Nemotron-H-56B-Base-8K"),  # Mamba2, attention and MLP layers
]
WORKLOADS = [Workload(seq_len=40), Workload(batch=2, seq_len=1, past_len=300)]


def _doc(doc: dict) -> dict:
    return json.loads(json_text(doc))


def _model(preset: str) -> tuple[dict, str]:
    raw, name = read_config_source(preset)
    return {k: v for k, v in raw.items() if k != "quantization_config"}, name


@pytest.mark.parametrize("preset", CASES, ids=lambda c: c.split("/")[-2] if "/" in c else c)
@pytest.mark.parametrize("wl", WORKLOADS, ids=["prefill", "decode"])
def test_reused_traced_document_is_the_full_one(preset, wl):
    raw, name = _model(preset)
    hw = load_hardware("h100")
    full = traced_graph(raw, wl, name)
    config = full.meta["config"]
    small, index = reduced.reduced_traced(full)
    assert len(set(index)) == small.meta["config"].num_hidden_layers < len(index)
    got = reuse.reused_report(config, wl, hw)
    assert got is not None, "one layer of each kind should stand for this model"
    want, _ = traced_report(raw, name, wl, hw)
    assert got["model"]["frontend"] == "traced"
    assert _doc(got) == _doc(want)


def test_the_cut_keeps_the_first_layer_of_each_kind_renamed():
    raw, name = _model("gemma3-1b")
    full = traced_graph(raw, Workload(seq_len=40), name)
    small, index = reduced.reduced_traced(full)
    # gemma-3-1b: layers 5, 11, 17 and 23 are global, the rest sliding
    assert index == [1 if i % 6 == 5 else 0 for i in range(26)]
    assert small.meta["blocks"] == ["model.layers.0.add_1", "model.layers.1.add_1"]
    assert "model.layers.1.self_attn.q_proj.weight" in small  # real layer 5's, renamed
    assert not any(".layers.5." in n.name for n in small.nodes())
    assert small.meta["scopes"]["model.layers.1"] == "layer"


def test_a_stand_in_that_differs_from_its_layer_is_analysed_in_full(monkeypatch):
    # a layer whose node differs from its kind's first (here: an attribute changed after the
    # trace) is not stood for: the check against the full graph refuses the cut
    raw, name = _model("qwen3-0.6b")
    wl = Workload(seq_len=40)
    full = traced_graph(raw, wl, name)
    node = full["model.layers.7.input_layernorm"]
    node.attrs = {**node.attrs, "eps": 0.5}
    monkeypatch.setattr(reuse, "model_graph", lambda config, workload, mla: full)
    assert reuse.reused_report(full.meta["config"], wl) is None
    small, index = reduced.reduced_traced(full)
    u = reuse.unroll(small, index)
    assert not reduced.same_nodes(full, u.names, u.reps, u.inputs)
    node.attrs = {**node.attrs, "eps": full["model.layers.0.input_layernorm"].attrs["eps"]}
    assert reduced.same_nodes(full, u.names, u.reps, u.inputs)


def test_a_model_whose_layers_do_not_repeat_has_no_cut():
    raw, name = _model("qwen3-0.6b")
    raw = {**raw, "num_hidden_layers": 1}
    assert reduced.reduced_traced(traced_graph(raw, Workload(seq_len=8), name)) is None


def test_an_output_that_is_not_its_stand_ins_is_analysed_in_full(monkeypatch):
    # the unrolled outputs must be the full graph's tensors in their roles, not only its names
    raw, name = _model("qwen3-0.6b")
    wl = WORKLOADS[1]
    full = traced_graph(raw, wl, name)
    monkeypatch.setattr(reuse, "model_graph", lambda config, workload, mla: full)
    assert reuse.reused_report(full.meta["config"], wl) is not None
    key, value = full.outputs["present.2.key"], full.outputs["present.2.value"]
    full.outputs["present.2.key"], full.outputs["present.2.value"] = value, key
    assert reuse.reused_report(full.meta["config"], wl) is None


def test_a_form_the_trace_cannot_give_is_refused_on_one_layer_of_each_kind_too():
    raw, name = _model(HUB.format("deepseek-ai/DeepSeek-V2-Lite"))
    config = traced_graph(raw, WORKLOADS[1], name).meta["config"]
    with pytest.raises(ConfigError, match="absorbed"):
        reuse.reused_report(config, WORKLOADS[1], mla="absorbed")
