"""FLOP counts are exact integers, above 2**53 too, and in every JSON document."""

import json
from fractions import Fraction

from click.testing import CliRunner

import graphllm
from graphllm.cli import main
from graphllm.passes import run


def test_counts_past_2_53_are_exact():
    cfg = graphllm.load_config("llama3.1-405b")
    b, t = 64, 131072
    graph = graphllm.build_graph(cfg, graphllm.Workload(batch=b, seq_len=t))
    flops = run(graph, ["cost"])["cost"].flops
    linear = flops["by_op"]["linear"]
    assert isinstance(linear, int) and linear > 2**62
    # every projection and the LM head run on all B*T positions: 2 FLOPs a weight a position
    weights = sum(graph.type_of(n.inputs[1]).numel(graph.bindings) for n in graph.nodes("linear"))
    assert linear == 2 * b * t * weights
    assert isinstance(flops["total"], int) and isinstance(flops["matmul_causal"], int)


def test_uneven_routing_keeps_the_total_whole():
    # Mixtral, T=7: 14 token-expert pairs over 8 experts, 7/4 slots each
    graph = graphllm.build_graph(graphllm.load_config("mixtral-8x7b"), graphllm.Workload(seq_len=7))
    assert graph.bindings["C"] == Fraction(7, 4)
    flops = run(graph, ["cost"])["cost"].flops
    assert all(type(v) is int for v in (flops["total"], flops["matmul"], *flops["by_op"].values()))


def test_json_holds_integers():
    r = CliRunner().invoke(main, ["trace", "--model", "mixtral-8x7b", "-t", "7", "--json"])
    doc = json.loads(r.stdout)
    assert '"total": 178554782336,' in r.stdout  # no ".0"
    assert type(doc["flops"]["matmul_causal"]) is int
    assert all(type(x["flops"]) is int for x in doc["per_layer"])


def _float_counts(doc, path=""):
    """Every float in a JSON document at a key that names FLOPs (rates and peaks are floats)."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _float_counts(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _float_counts(v, f"{path}[{i}]")
    elif isinstance(doc, float) and "flops" in path.lower() and "peak" not in path:
        yield path


def test_every_flop_count_of_a_trace_is_an_integer():
    """DeepSeek-V3's trace adds MLA's two forms' counts (naive and absorbed) to the document."""
    r = CliRunner().invoke(main, ["trace", "--model", "deepseek-v3", "-t", "16", "--json"])
    doc = json.loads(r.stdout)
    assert doc["mla"]["forms"]["absorbed"]["attention_flops"] > 0
    assert list(_float_counts(doc)) == []
