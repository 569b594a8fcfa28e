import pytest

from graphllm.errors import GraphError
from graphllm.ir import Dim, Graph, Ref, TensorType

B, T = Dim("B", "batch"), Dim("T", "token")
D8, F16 = Dim("d", "hidden", 8), Dim("f", "ffn", 16)


def tiny() -> Graph:
    g = Graph("tiny", {"B": 1, "T": 3})
    x = g.input("x", TensorType((B, T, D8), "fp32"))
    w = g.param("w.weight", TensorType((F16, D8), "fp32"), kind="mlp")
    y = g.add("linear", "proj", (x, w))
    g.add("silu", "act", (y,))
    g.set_output("out", Ref("act"))
    return g


def test_shapes_print_symbolic_and_bound():
    g = tiny()
    t = g["proj"].out
    assert t.format() == "B×T×16"
    assert t.format(g.bindings) == "1×3×16"
    assert t.format(g.bindings, drop_unit_batch=True) == "3×16"
    assert t.numel(g.bindings) == 48


def test_graph_queries():
    g = tiny()
    assert [n.name for n in g.nodes()] == ["x", "w.weight", "proj", "act"]
    assert [n.name for n in g.users("proj")] == ["act"]
    assert [n.name for n in g.nodes("linear")] == ["proj"]
    assert g.num_edges() == 3
    assert [n.name for n in g.params()] == ["w.weight"]
    nxg = g.to_networkx()
    assert set(nxg.edges()) == {("x", "proj"), ("w.weight", "proj"), ("proj", "act")}


def test_scope_matches_whole_name_components():
    g = Graph("s")
    for name in ("model.layers.1", "model.layers.1.mlp", "model.layers.10.mlp"):
        g.input(name, TensorType((B,), "fp32"))
    assert [n.name for n in g.scope("model.layers.1")] == ["model.layers.1", "model.layers.1.mlp"]


def test_printout_is_one_line_per_node():
    lines = tiny().print().splitlines()
    assert lines[2] == "%proj : B×T×16 = linear(x, w.weight)"
    assert lines[-1] == "output out = %act"


def test_add_rejects_duplicates_and_unknown_inputs():
    g = tiny()
    with pytest.raises(GraphError, match="exists already"):
        g.add("silu", "act", (Ref("proj"),))
    with pytest.raises(GraphError, match="nope is not in the graph"):
        g.add("silu", "z", (Ref("nope"),))


def test_verify_names_a_tampered_node():
    g = tiny()
    g.verify()
    g["act"].outputs = (TensorType((B, T, D8), "fp32"),)
    with pytest.raises(
        GraphError, match=r"act \(silu\): outputs are B×T×8, the op table gives B×T×16"
    ):
        g.verify()


def test_unknown_role_is_rejected():
    with pytest.raises(GraphError, match="unknown role"):
        Dim("x", "sequence", 3)


def test_empty_graph_verifies():
    g = Graph("empty")
    g.verify()
    assert len(g) == 0 and g.print() == ""
