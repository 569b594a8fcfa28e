"""`export --format model-explorer`: Model Explorer's graph JSON and its cost overlays."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

import graphllm
from graphllm.cli import main
from graphllm.exporters.model_explorer import (
    GRAPH_ID,
    export_model_explorer,
    overlay_paths,
    placement,
    split_scope,
)
from graphllm.models.hardware import load_hardware
from graphllm.ops import OPS, SOURCE
from graphllm.passes import meta_result
from tests.support.paths import EXAMPLES

pytest.importorskip("model_explorer")

TINY = EXAMPLES / "tiny.yaml"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cfg = graphllm.load_config(TINY)
    graph = graphllm.build_graph(cfg, graphllm.Workload(batch=1, seq_len=8, past_len=4))
    out = tmp_path_factory.mktemp("explorer") / "graph.json"
    r = export_model_explorer(graph, out, hardware=load_hardware("h100"))
    return graph, r, json.loads(out.read_text())


def test_split_scope_keeps_an_index_with_its_collection():
    assert split_scope("model.layers.3.self_attn.q_proj") == [
        "model",
        "layers.3",
        "self_attn",
        "q_proj",
    ]
    assert split_scope("model.layers.0.mlp.experts.*.up_proj.weight")[3] == "experts.*"


def test_placement_puts_a_weight_beside_its_node():
    names = {"model.layers.3.self_attn.q_proj", "model.layers.3.self_attn.q_proj.weight"}
    assert placement("model.layers.3.self_attn.q_proj", names) == (
        "model/layers.3/self_attn",
        "q_proj",
    )
    assert placement("model.layers.3.self_attn.q_proj.weight", names) == (
        "model/layers.3/self_attn",
        "q_proj.weight",
    )
    assert placement("input_ids", names) == ("", "input_ids")


def test_one_graph_node_per_ir_node_with_scope_namespaces(exported):
    graph, r, doc = exported
    (g,) = doc["graphs"]
    assert g["id"] == GRAPH_ID
    nodes = {n["id"]: n for n in g["nodes"]}
    assert len(g["nodes"]) == len(nodes) == len(graph) == r.nodes
    assert set(nodes) == {n.name for n in graph.nodes()}
    q = nodes["model.layers.1.self_attn.q_proj"]
    assert (q["namespace"], q["label"]) == ("model/layers.1/self_attn", "q_proj")
    # every layer is one group: the 405B model opens as its blocks, not as 4,418 nodes
    layers = {n["namespace"].split("/")[1] for n in g["nodes"] if n["namespace"].count("/")}
    assert {f"layers.{i}" for i in range(graphllm.load_config(TINY).num_hidden_layers)} <= layers
    assert {kv["key"]: kv["value"] for kv in q["attrs"]}["op"] == graph[q["id"]].op


def test_edges_are_the_graph_inputs_with_shapes_on_outputs(exported):
    graph, _, doc = exported
    nodes = {n["id"]: n for n in doc["graphs"][0]["nodes"]}
    for n in graph.nodes():
        edges = nodes[n.name].get("incomingEdges", [])
        assert [(e["sourceNodeId"], e["sourceNodeOutputId"]) for e in edges] == [
            (ref.node, str(ref.index)) for ref in n.inputs
        ]
        meta = nodes[n.name]["outputsMetadata"]
        assert [m["id"] for m in meta] == [str(i) for i in range(len(n.outputs))]
        for m, t in zip(meta, n.outputs):
            attrs = {kv["key"]: kv["value"] for kv in m["attrs"]}
            shape = ",".join(str(int(s)) for s in t.shape(graph.bindings))
            assert attrs["tensor_shape"] == f"{t.dtype}[{shape}]"
            assert attrs["dims"] == t.format()


def test_overlays_are_the_cost_passes_numbers(exported):
    graph, r, _ = exported
    assert {m: p.name for m, p in r.overlays.items()} == {
        "flops": "graph.flops.json",
        "bytes": "graph.bytes.json",
        "time": "graph.time.json",
    }
    data = {m: json.loads(p.read_text())[GRAPH_ID] for m, p in r.overlays.items()}
    computing = [n for n in graph.nodes() if OPS[n.op].category != SOURCE]
    for n in computing:
        oc, t = meta_result(n, "cost"), meta_result(n, "time")
        assert data["flops"]["results"][n.name]["value"] == oc.flops
        assert data["bytes"]["results"][n.name]["value"] == oc.bytes
        assert data["time"]["results"][n.name]["value"] == t.seconds
    for d in data.values():
        assert set(d["results"]) == {n.name for n in computing}
        assert [s["stop"] for s in d["gradient"]] == [0.0, 0.5, 1.0]
    assert sum(v["value"] for v in data["flops"]["results"].values()) > 0


def test_overlay_names_follow_the_graph_file(tmp_path):
    assert overlay_paths(tmp_path / "m.json")["time"] == tmp_path / "m.time.json"
    assert overlay_paths(tmp_path / "m")["flops"] == tmp_path / "m.flops.json"


def test_cli_writes_the_files_and_says_how_to_view_them(tmp_path):
    out = tmp_path / "g.json"
    args = ["export", "--config", str(TINY), "--format", "model-explorer", "-t", "4"]
    r = CliRunner().invoke(main, [*args, "--hardware", "a100", "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "g.flops.json, g.bytes.json, g.time.json" in r.output
    assert f"model-explorer {out} --node_data_paths={tmp_path / 'g.flops.json'}," in r.output
    assert "T=4" in r.output and "A100" in r.output.upper()
    assert json.loads(out.read_text())["graphs"][0]["nodes"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "g.bytes.json",
        "g.flops.json",
        "g.json",
        "g.time.json",
    ]


@pytest.mark.parametrize(
    "args, says",
    [
        (["--format", "model-explorer", "--quantize", "int4"], "--quantize: how an ONNX export"),
        (["--format", "model-explorer", "--ops", "ort"], "--ops: how an ONNX export"),
        (["-t", "4"], "--seq-len: the workload and device of model-explorer"),
        (["--format", "genai", "--hardware", "h100"], "--hardware: the workload and device"),
    ],
)
def test_options_of_another_format_are_one_line(tmp_path, args, says):
    out = tmp_path / "x.json"
    r = CliRunner().invoke(main, ["export", "--config", str(TINY), *args, "-o", str(out)])
    assert r.exit_code == 2
    assert says in r.output and len(r.output.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_without_the_package_the_error_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "model_explorer", None)  # import fails as if not installed
    out = tmp_path / "g.json"
    args = ["export", "--config", str(TINY), "--format", "model-explorer", "-o", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2
    assert "pip install 'graphllm[explorer]'" in r.output
    assert not out.exists()


def test_same_graph_same_bytes(tmp_path):
    cfg = graphllm.load_config(TINY)
    texts = []
    for k in range(2):
        graph = graphllm.build_graph(cfg, graphllm.Workload(batch=1, seq_len=4))
        out = tmp_path / str(k)
        out.mkdir()
        r = export_model_explorer(graph, out / "g.json", hardware=load_hardware("h100"))
        texts.append([p.read_bytes() for p in (r.path, *r.overlays.values())])
    assert texts[0] == texts[1]
