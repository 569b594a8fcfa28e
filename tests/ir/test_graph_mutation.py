"""The Graph's mutation verbs: insert, replace uses, erase, rename; versions; derived graphs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import graphllm.ops  # noqa: F401 (fills the op table the graph infers types from)
from graphllm.errors import GraphError
from graphllm.ir import Dim, Graph, Ref, TensorType

B, T = Dim("B", "batch"), Dim("T", "token")
D, F = Dim("d", "hidden", 8), Dim("f", "ffn", 16)
F1, F2 = Dim("f1", "ffn", 10), Dim("f2", "ffn", 6)
X = TensorType((B, T, D), "fp32")


def chain() -> Graph:
    """x -> proj -> act -> out."""
    g = Graph("chain", {"B": 1, "T": 3})
    x = g.input("x", X)
    w = g.param("w.weight", TensorType((F, D), "fp32"), kind="mlp")
    y = g.add("linear", "proj", (x, w))
    g.add("silu", "act", (y,))
    g.set_output("out", Ref("act"))
    return g


def names(g: Graph) -> list[str]:
    return [n.name for n in g.nodes()]


def test_input_and_param_build_sources():
    g = chain()
    assert g["x"].op == "input" and g["x"].out == X
    assert g["w.weight"].op == "param" and g["w.weight"].attrs["kind"] == "mlp"
    assert g["proj"].out == TensorType((B, T, F), "fp32")
    g.verify()


def test_version_changes_with_every_change_and_is_never_shared():
    g = Graph("a")
    seen = {g.version, Graph("b").version}
    assert len(seen) == 2  # two new graphs: two versions
    g.input("x", X)
    seen.add(g.version)
    g.add("silu", "y", (Ref("x"),))
    seen.add(g.version)
    g.set_output("y", Ref("y"))
    seen.add(g.version)
    assert len(seen) == 5


def test_queries_do_not_change_the_version():
    g = chain()
    v = g.version
    g.verify()
    g.print()
    list(g.nodes())
    g.users("proj")
    g.to_networkx()
    assert g.version == v


def test_inserting_before_keeps_the_block_in_order():
    g = chain()
    with g.inserting_before("act"):
        a = g.add("silu", "a", (Ref("proj"),))
        g.add("silu", "b", (a,))
    assert names(g) == ["x", "w.weight", "proj", "a", "b", "act"]
    g.verify()


def test_inserting_after_keeps_the_block_in_order():
    g = chain()
    with g.inserting_after("proj"):
        a = g.add("silu", "a", (Ref("proj"),))
        g.add("silu", "b", (a,))
    g.add("silu", "last", (Ref("act"),))  # outside the block: appended again
    assert names(g) == ["x", "w.weight", "proj", "a", "b", "act", "last"]
    g.verify()


def test_inserting_nested_blocks_restore_the_outer_point():
    g = chain()
    with g.inserting_before("act"):
        g.add("silu", "a", (Ref("proj"),))
        with g.inserting_after("x"):
            g.add("silu", "x2", (Ref("x"),))
        g.add("silu", "b", (Ref("a"),))
    assert names(g) == ["x", "x2", "w.weight", "proj", "a", "b", "act"]
    g.verify()


def test_an_insert_before_its_input_is_refused_naming_the_node():
    g = chain()
    with (
        pytest.raises(GraphError, match=r"early: input act does not come before .*before proj"),
        g.inserting_before("proj"),
    ):
        g.add("silu", "early", (Ref("act"),))
    assert "early" not in g and names(g) == ["x", "w.weight", "proj", "act"]


def test_an_empty_insert_block_changes_nothing():
    g = chain()
    v = g.version
    with g.inserting_after("proj"):
        pass
    assert g.version == v and names(g) == ["x", "w.weight", "proj", "act"]


def test_inserting_at_a_node_not_in_the_graph():
    g = chain()
    with pytest.raises(GraphError, match="no node named 'nope'"), g.inserting_before("nope"):
        pass
    other = chain()
    with (
        pytest.raises(GraphError, match="act: that node belongs to another graph"),
        g.inserting_before(other["act"]),
    ):
        pass


def test_replace_all_uses_with_an_inserted_node():
    """Insert y = f(x) after x and let every reader of x read y: y itself keeps reading x."""
    g = chain()
    proj = g["proj"]
    with g.inserting_after(proj):
        y = g.add("silu", "proj.act", (proj,))
    g.replace_all_uses_with(proj, y)
    assert g["act"].inputs == (Ref("proj.act"),)
    assert g["proj.act"].inputs == (Ref("proj"),)
    assert [u.name for u in g.users("proj")] == ["proj.act"]
    assert [u.name for u in g.users("proj.act")] == ["act"]
    g.verify()


def test_replace_all_uses_with_moves_the_graph_outputs():
    g = chain()
    z = g.add("silu", "z", (Ref("proj"),))
    g.replace_all_uses_with(Ref("act"), Ref("z"))
    assert g.outputs == {"out": Ref("z")}
    g.erase("act")
    assert names(g) == ["x", "w.weight", "proj", "z"]
    assert z.inputs == (Ref("proj"),)
    g.verify()


def test_replace_all_uses_with_of_each_output_of_a_multi_output_node():
    g = Graph("split", {"B": 1, "T": 3})
    x = g.input("x", TensorType((B, T, F), "fp32"))
    attrs = {"axes": {"f1": F1, "f2": F2}, "sizes": [10, 6]}
    s = g.add("split", "s", (x,), attrs)
    g.add("silu", "a", (Ref("s", 0),))
    g.add("silu", "b", (Ref("s", 1),))
    with g.inserting_after(s):
        s2 = g.add("split", "s2", (x,), attrs)
    g.replace_all_uses_with(s, s2)
    assert g["a"].inputs == (Ref("s2", 0),) and g["b"].inputs == (Ref("s2", 1),)
    assert g.users(s) == []
    g.erase(s)
    g.verify()


def test_replace_all_uses_with_refuses_another_type():
    g = chain()
    with pytest.raises(GraphError, match=r"cannot replace proj \(B×T×16\) with x \(B×T×8\)"):
        g.replace_all_uses_with(Ref("proj"), Ref("x"))


def test_replace_all_uses_with_refuses_a_node_after_a_reader():
    g = chain()
    late = g.add("silu", "late", (Ref("proj"),))
    with pytest.raises(GraphError, match="act: late does not come before it"):
        g.replace_all_uses_with(g["proj"], late)
    assert g["act"].inputs == (Ref("proj"),)  # nothing changed


def test_replace_all_uses_with_no_op_cases():
    g = chain()
    leaf = g.add("silu", "leaf", (Ref("proj"),))
    other = g.add("silu", "other", (Ref("proj"),))
    v = g.version
    g.replace_all_uses_with(g["act"], g["act"])  # by itself
    g.replace_all_uses_with(Ref("proj"), Ref("proj"))
    g.replace_all_uses_with(leaf, other)  # nothing reads leaf
    assert g.version == v
    assert [u.name for u in g.users("proj")] == ["act", "leaf", "other"]


def test_replace_input_changes_one_reader_only():
    g = chain()
    other = g.add("silu", "other", (Ref("proj"),))
    with g.inserting_after("proj"):
        alt = g.add("silu", "alt", (Ref("proj"),))
    g.replace_input(other, Ref("proj"), alt)
    assert other.inputs == (Ref("alt"),) and g["act"].inputs == (Ref("proj"),)
    v = g.version
    g.replace_input(other, Ref("proj"), alt)  # it no longer reads proj: nothing to do
    assert g.version == v
    with pytest.raises(GraphError, match="act: other does not come before it"):
        g.replace_input("act", Ref("proj"), Ref("other"))
    g.verify()


def test_erase_refuses_a_node_that_is_still_read_naming_the_readers():
    g = chain()
    g.add("silu", "also", (Ref("proj"),))
    with pytest.raises(GraphError, match="proj: cannot erase it, act, also still read it"):
        g.erase("proj")
    with pytest.raises(GraphError, match="act: cannot erase it, it is graph output out"):
        g.erase("act")
    with pytest.raises(GraphError, match="no node named 'nope'"):
        g.erase("nope")


def test_erase_a_dead_node():
    g = chain()
    dead = g.add("silu", "dead", (Ref("proj"),))
    v = g.version
    g.erase(dead)
    assert "dead" not in g and g.version != v
    assert names(g) == ["x", "w.weight", "proj", "act"]
    assert [u.name for u in g.users("proj")] == ["act"]
    assert g.num_edges() == 3
    g.verify()


def test_erase_the_last_node_leaves_an_empty_graph():
    g = Graph("one")
    g.input("x", X)
    g.erase("x")
    assert len(g) == 0 and list(g.nodes()) == [] and g.print() == ""
    g.verify()


def test_rename_moves_readers_and_outputs():
    g = chain()
    g.rename("act", "y")
    g.rename(g["proj"], "p")
    assert names(g) == ["x", "w.weight", "p", "y"]
    assert g["y"].inputs == (Ref("p"),) and g.outputs == {"out": Ref("y")}
    assert [u.name for u in g.users("x")] == ["p"]
    with pytest.raises(GraphError, match="p: cannot rename it to x, a node of that name exists"):
        g.rename("p", "x")
    v = g.version
    g.rename("p", "p")
    assert g.version == v
    g.verify()


def test_iterating_while_inserting_and_erasing_walks_the_order_it_started_with():
    g = chain()
    seen = []
    for n in g.nodes():
        seen.append(n.name)
        if n.name == "proj":
            with g.inserting_before(n):
                g.add("silu", "x.act", (Ref("x"),))
            g.erase(g.add("silu", "tmp", (Ref("x"),)))
    assert seen == ["x", "w.weight", "proj", "act"]
    assert names(g) == ["x", "w.weight", "x.act", "proj", "act"]


def test_caches_see_a_change():
    g = chain()
    assert set(g.to_networkx().nodes) == {"x", "w.weight", "proj", "act"}
    g.erase(g.add("silu", "tmp", (Ref("act"),)))
    g.add("silu", "z", (Ref("act"),))
    assert "z" in g.to_networkx().nodes and "tmp" not in g.to_networkx().nodes


def test_set_output_needs_a_node():
    g = chain()
    with pytest.raises(GraphError, match="graph output y: no node nope"):
        g.set_output("y", Ref("nope"))


def test_derive_gives_a_graph_its_own_meta():
    g = chain()
    g.meta.update(scopes={"proj": "mlp"}, blocks=["act"], act_dtype="fp32", _cache=(1, 2))
    d = g.derive()
    assert d.name == g.name and d.bindings == g.bindings and len(d) == 0
    assert d.meta == {"scopes": {"proj": "mlp"}, "blocks": ["act"], "act_dtype": "fp32"}
    d.meta["scopes"]["new"] = "layer"
    d.meta["blocks"].append("z")
    d.bindings["T"] = 9
    assert g.meta["scopes"] == {"proj": "mlp"} and g.meta["blocks"] == ["act"]
    assert g.bindings["T"] == 3


def test_subgraph_holds_copies_that_share_no_meta():
    g = chain()
    g["proj"].meta["cost"] = 1
    sub = g.subgraph(["proj", "act"])
    assert [n.name for n in sub.nodes()] == ["proj", "act"]
    assert sub["proj"] is not g["proj"] and sub["proj"].meta == {}
    sub["act"].meta["cost"] = 2
    assert "cost" not in g["act"].meta


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("iar e"), st.integers(0, 50)), max_size=30))
def test_any_sequence_of_verbs_keeps_the_graph_valid(steps):
    """Insert a silu after a node and give it the node's readers (i), insert one before a node
    (a), replace a node by a new reader of its input (r), erase what is dead (e): the order stays
    topological, the users agree with the inputs and verify() passes."""
    g = chain()
    k = 0
    for verb, pick in steps:
        nodes = [n for n in g.nodes() if n.out == X or n.op == "silu"]
        if verb == " " or not nodes:
            continue
        n = nodes[pick % len(nodes)]
        k += 1
        if verb == "i":
            with g.inserting_after(n):
                y = g.add("silu", f"n{k}", (n,))
            g.replace_all_uses_with(n, y)
        elif verb == "a" and n.inputs:
            with g.inserting_before(n):
                g.add("silu", f"n{k}", (n.inputs[0],))
        elif verb == "r" and n.op == "silu":
            with g.inserting_after(n):
                y = g.add("silu", f"n{k}", n.inputs)
            g.replace_all_uses_with(n, y)
            g.erase(n)
        elif verb == "e":
            for dead in [m for m in g.topo() if m.op == "silu" and not g.users(m)]:
                if dead.name not in {r.node for r in g.outputs.values()}:
                    g.erase(dead)
    g.verify()
    pos = {n.name: i for i, n in enumerate(g.nodes())}
    for n in g.nodes():
        assert all(pos[r.node] < pos[n.name] for r in n.inputs)
        readers = sorted(u.name for u in g.users(n))
        assert readers == sorted(m.name for m in g.nodes() for r in m.inputs if r.node == n.name)
    assert all(r.node in g for r in g.outputs.values())
