"""trace's document from one layer of each kind (report/reuse.py) is the full analysis's, to the
last bit: float sums correctly rounded (so one layer's tally stands for its kind's), names with
each layer's index, token sets composed layer by layer. Families: dense, sliding/global, MoE
with dense first layers, MLA, hybrid linear attention, Mamba hybrid; prefill (bit sets and
intervals) and decode with a past."""

from __future__ import annotations

import json

import pytest

import graphllm
from graphllm.files import json_text
from graphllm.models.hardware import load_hardware
from graphllm.report import reuse
from graphllm.report.reuse import trace_document
from graphllm.report.trace_report import trace_report

PREFILL = {"batch": 1, "seq_len": 300}  # intervals (over 256 positions)
SHORT = {"batch": 1, "seq_len": 40}  # bit sets
DECODE = {"batch": 2, "seq_len": 1, "past_len": 500}

CASES = [
    ("llama3.2-1b", PREFILL),
    ("llama3.2-1b", DECODE),
    ("gemma2-9b", SHORT),  # sliding and global layers, soft-capped head
    ("gemma2-9b", {"batch": 1, "seq_len": 8, "past_len": 5000}),  # past beyond the window
    ("gpt-oss-20b", PREFILL),  # window 128 < T: the first layer's reach is its window
    ("gpt-oss-20b", DECODE),
    ("deepseek-v3", SHORT),  # MLA, 3 dense layers then MoE
    ("deepseek-v3", DECODE),
    ("glm4.5-air", PREFILL),  # a dense first layer, then MoE
    ("qwen3-next-80b-a3b", SHORT),  # 3 linear attention layers : 1 full
    ("qwen3-next-80b-a3b", DECODE),
    ("nemotron-h-8b", PREFILL),  # Mamba, attention and MLP layers
    ("nemotron-h-8b", DECODE),
]


def _doc(doc: dict) -> dict:
    return json.loads(json_text(doc))


@pytest.mark.parametrize(("preset", "workload"), CASES, ids=[f"{p}-{w}" for p, w in CASES])
@pytest.mark.parametrize(
    ("hardware", "training"), [("h100", False), ("h100", True), (None, False)], ids=str
)
def test_reused_document_is_the_full_one(
    preset: str, workload: dict, hardware: str | None, training: bool
) -> None:
    config = graphllm.load_config(preset)
    wl = graphllm.Workload(**workload)
    hw = load_hardware(hardware) if hardware else None
    got = reuse.reused_report(config, wl, hw, training=training)
    assert got is not None, "one layer of each kind should stand for this model"
    small, _ = reuse.reduced_config(config)
    assert small.num_hidden_layers < config.num_hidden_layers
    want, _ = trace_report(config, wl, hw, training=training)
    assert _doc(got) == _doc(want)


def test_trace_json_is_the_full_analysis(tmp_path: object) -> None:
    config = graphllm.load_config("qwen3-0.6b")
    wl = graphllm.Workload(batch=1, seq_len=64)
    hw = load_hardware("h100")
    assert json_text(trace_document(config, wl, hw)) == json_text(trace_report(config, wl, hw)[0])


def test_a_layer_reading_another_layers_nodes_is_analysed_in_full() -> None:
    # the MTP module reads the main model's last hidden state: one layer cannot stand for it
    config = graphllm.load_config("deepseek-v3")
    wl = graphllm.Workload(batch=1, seq_len=16)
    assert reuse.reused_report(config, wl, mtp=True) is None
    doc = trace_document(config, wl, mtp=True)
    assert _doc(doc) == _doc(trace_report(config, wl, mtp=True)[0])
