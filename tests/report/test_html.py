"""graphllm/report/html.py: the report's contents agree with the analyses they come from."""

from __future__ import annotations

import html
import json
import re

import pytest

import graphllm
from graphllm.build.builder import build_graph
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.ops import OPS, SOURCE
from graphllm.passes.parallel.partition import Strategy
from graphllm.report.html import default_sweep, report_data
from graphllm.report.reuse import trace_document
from tests.support.paths import EXAMPLES
from tests.support.tiny_configs import DEEPSEEK_V3

WL = Workload(batch=1, seq_len=8)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    path = tmp_path_factory.mktemp("ds") / "config.json"
    path.write_text(json.dumps(DEEPSEEK_V3))
    config = graphllm.load_config(path)
    return config, report_data(config, WL, load_hardware("h100"), sweep_lens=[4, 8])


def test_op_rows_times_their_layers_are_the_full_graphs_ops_and_flops(deepseek):
    config, data = deepseek
    cols = data["ops"]["columns"]
    rows = [dict(zip(cols, r)) for r in data["ops"]["rows"]]
    graph = build_graph(config, WL)
    computing = [n for n in graph.nodes() if OPS[n.op].category != SOURCE]
    assert sum(r["layers"] for r in rows) == len(computing)
    names = {n.name for n in computing}
    assert all(r["name"] in names for r in rows)  # named as in a real layer of the kind
    total = trace_document(config, WL, load_hardware("h100"))["flops"]["total"]
    assert sum(r["flops"] * r["layers"] for r in rows) == pytest.approx(total, rel=1e-12)
    mixing = {r["op"] for r in rows if r["mixing"]}
    assert mixing and mixing <= {"scores", "softmax", "pv", "scores_mqa", "pv_mqa"}


def test_one_block_view_per_kind_of_layer_and_links_that_open_them(deepseek):
    _, data = deepseek
    ids = [d["id"] for d in data["diagrams"]]
    assert sorted(data["kinds"]) == ["0", "1"]  # the dense first layer, then the MoE one
    assert data["layers"] == [0, 1]
    assert {"model", "block-0", "block-1", "attention-0", "ffn-0", "ffn-1", "tokens"} <= set(ids)
    by_id = {d["id"]: d for d in data["diagrams"]}
    assert by_id["model"]["links"] == {"blocks:0": "block-0", "blocks:1": "block-1"}
    block = by_id["block-1"]["links"]
    assert sorted(block.values()) == ["attention-1", "ffn-1"]
    for d in data["diagrams"]:
        assert d["svg"].startswith("<svg")
        for box, target in d["links"].items():
            assert target in by_id
            assert box in {html.unescape(t) for t in re.findall("<title>([^<]*)</title>", d["svg"])}


def test_mla_section_and_summary(deepseek):
    _, data = deepseek
    assert data["mla"]["kv_cache_per_token"]["ratio"] > 1
    labels = [k for k, _ in data["summary"]]
    assert "parameters: total" in labels and "parameters: active per token" in labels
    assert any(k.startswith("roofline on") for k in labels)
    assert any(k.startswith("fits") for k in labels)
    assert [r["seq_len"] for r in data["sweep"]] == [4, 8]
    assert data["op_kinds"]["seq_len"] == 8 and data["op_kinds"]["roof"]["peak"] > 0


def test_partition_section_holds_stages_collectives_and_the_trace():
    config = graphllm.load_config(EXAMPLES / "tiny.yaml")
    data = report_data(config, WL, load_hardware("h100"), Strategy(tp=2, pp=2), sweep_lens=[8])
    p = data["partition"]
    assert p["devices"] == 4 and len(p["stages"]) == 2
    assert {c["kind"] for c in p["collectives"]} >= {"all_reduce"}
    assert p["trace_gz"] and p["trace_bytes"] > 0
    assert "rank" in {d["id"] for d in data["diagrams"]}
    plain = report_data(config, WL, load_hardware("h100"), Strategy(), sweep_lens=[8])
    assert "partition" not in plain


def test_default_sweep():
    assert default_sweep(2048) == [32, 128, 512, 2048, 8192]
    assert default_sweep(1) == [1, 4]
