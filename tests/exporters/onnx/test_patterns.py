"""The pattern matcher of the fused lowerings (exporters/onnx/patterns.py) on hand-built tiny
graphs, the declared region tables (exporters/onnx/regions.py) on built ones, and a check over
the syntax tree that the ONNX lowerings find ops by those tables and the row registry only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import graphllm
from graphllm.build.builder import build_export_graph, build_graph
from graphllm.exporters.onnx.patterns import (
    Alt,
    Check,
    Match,
    Mismatch,
    Op,
    Optional,
    Pattern,
    Var,
    find,
    match,
)
from graphllm.exporters.onnx.regions import (
    ATTENTION_PATTERN,
    GATED_MLP_PATTERN,
    MOE_PATTERN,
    SKIP_NORM_PATTERN,
    qkv_projections,
)
from graphllm.ir import Dim, Graph, Ref, TensorType
from graphllm.ops import OPS
from graphllm.runtime.observe import small_instance
from tests.support import tiny_configs

B, T = Dim("B", "batch"), Dim("T", "token")
D, F = Dim("d", "hidden", 8), Dim("f", "ffn", 16)
ONNX_DIR = Path(graphllm.exporters.onnx.__file__).parent


def _param(g: Graph, name: str, *dims: Dim):
    return g.param(name, TensorType(dims, "fp32"))


def _mlp(act: str = "silu", bias: tuple[bool, bool] = (False, False), norm: bool = False) -> Graph:
    """mul(act(gate(x)), up(x)), x an input (or its RMSNorm), gate and up with a bias or not."""
    g = Graph("mlp", {"B": 1, "T": 3})
    x = g.input("x", TensorType((B, T, D), "fp32"))
    if norm:
        x = g.add("rmsnorm", "norm", (x, _param(g, "norm.weight", D)), {"eps": 1e-6})
    projs = []
    for name, with_bias in zip(("gate", "up"), bias):
        w = _param(g, f"{name}.weight", F, D)
        if with_bias:
            projs.append(g.add("linear_bias", name, (x, w, _param(g, f"{name}.bias", F))))
        else:
            projs.append(g.add("linear", name, (x, w)))
    g.add("mul", "mul", (g.add(act, "act", (projs[0],)), projs[1]))
    return g


GATED = Pattern(
    Op(
        "mul",
        Op("silu", Op("linear", Var("inp"), name="gate"), name="act"),
        Op("linear", Var("inp"), name="up"),
        name="mul",
    )
)


# -- the matcher -----------------------------------------------------------------------------
def test_a_match_holds_the_captures_and_the_nodes_root_first():
    g = _mlp()
    m = match(g, GATED, g["mul"])
    assert isinstance(m, Match)
    assert [n.name for n in m.nodes] == ["mul", "act", "gate", "up"]
    assert m.anchor is g["mul"]
    assert m["gate"] is g["gate"] and m["inp"] is g["x"]  # a Var's: the node of its value
    assert m.ref("inp") == Ref("x") and m.ref("mul") == Ref("mul")
    assert "up" in m and "nope" not in m and m.get("nope") is None


def test_a_mismatch_says_which_node_differs_and_how():
    g = _mlp(act="gelu_tanh")
    assert match(g, GATED, g["mul"]) == Mismatch(
        "act is gelu_tanh, where silu was expected", 1, "act", ("silu",)
    )
    said = Pattern(Op("mul", Op("silu", why="{anchor}: experts use {op} ({node})")))
    assert match(g, said, g["mul"]).reason == "mul: experts use gelu_tanh (act)"
    # the root itself
    assert match(g, GATED, g["act"]).reason == "act is gelu_tanh, where mul was expected"


def test_a_name_met_again_binds_the_same_value_and_node():
    g = _mlp()
    other = g.input("y", TensorType((B, T, D), "fp32"))
    g.add("mul", "mul2", (g["act"], g.add("linear", "up2", (other, g["up.weight"]))))
    assert match(g, GATED, g["mul2"]).reason == "y is read as inp, which is x elsewhere"
    # an Op met again is the node matched the first time, its inputs not matched twice
    x = Op("input", name="x")
    twice = Pattern(Op("mul", Op("silu", Op("linear", x)), Op("linear", x)))
    m = match(g, twice, g["mul"])
    assert [n.name for n in m.nodes] == ["mul", "act", "gate", "x", "up"]


def test_an_optional_link_is_matched_where_it_is_and_skipped_where_not():
    pattern = Pattern(
        Op("linear", Optional(Op("rmsnorm", Op("input", name="x"), name="norm")), name="gate")
    )
    with_norm, without = _mlp(norm=True), _mlp()
    m = match(with_norm, pattern, with_norm["gate"])
    assert isinstance(m, Match) and m["norm"] is with_norm["norm"] and m["x"] is with_norm["x"]
    m = match(without, pattern, without["gate"])
    assert isinstance(m, Match) and "norm" not in m and m["x"] is without["x"]
    # neither the link nor what follows it: each op that would do is named
    in_act = Pattern(Op("silu", Optional(Op("rmsnorm", Op("input")))))
    assert match(without, in_act, without["act"]).reason == (
        "gate is linear, where rmsnorm or input was expected"
    )


def test_alternatives_match_the_first_that_fits():
    plain, biased = _mlp(), _mlp(bias=(True, True))
    proj = Op("linear", Var("x"), name="proj") | Op("linear_bias", Var("x"), name="proj")
    one_of = Op(("linear", "linear_bias"), Var("x"), name="proj")
    for p in (proj, one_of):
        for g in (plain, biased):
            m = match(g, Pattern(p), g["gate"])
            assert isinstance(m, Match) and m["proj"] is g["gate"]
        assert match(plain, Pattern(p), plain["act"]).reason == (
            "act is silu, where linear or linear_bias was expected"
        )
    assert Pattern(proj).anchors == Pattern(one_of).anchors == {"linear", "linear_bias"}


def test_an_alternative_that_fails_says_why_the_furthest_did():
    g = _mlp()
    deep = Op("silu", Op("linear_bias", Var("x")))
    assert match(g, Pattern(deep | Op("gelu_tanh")), g["act"]).reason == (
        "gate is linear, where linear_bias was expected"
    )
    # none got past its root: the alternative's own reason, said of the node there
    said = Alt(Op("sigmoid"), Op("gelu_tanh"), why="{node}: {op} is neither")
    assert match(g, Pattern(said), g["act"]).reason == "act: silu is neither"
    assert match(g, Pattern(said | deep), g["act"]) == match(g, Pattern(deep), g["act"])


def test_an_op_is_read_at_its_declared_output():
    g = Graph("split", {"B": 1, "T": 3})
    x = g.input("x", TensorType((B, T, D), "fp32"))
    halves = {"f1": Dim("f1", "hidden", 4), "f2": Dim("f2", "hidden", 4)}
    g.add("split", "split", (x,), {"axes": halves, "sizes": [4, 4]})
    g.add("silu", "act", (Ref("split", 1),))
    assert isinstance(match(g, Pattern(Op("silu", Op("split", out=1))), g["act"]), Match)
    assert match(g, Pattern(Op("silu", Op("split"))), g["act"]).reason == (
        "split: output 1 is read, where output 0 was expected"
    )


def test_a_failed_check_says_why():
    pattern = Pattern(
        Op(
            "mul",
            Op("silu", Op(("linear", "linear_bias"), Var("x"), name="gate")),
            Op(("linear", "linear_bias"), Var("x"), name="up"),
        ),
        checks=(Check(lambda m: len(m["gate"].inputs) == len(m["up"].inputs), "{up}: not {gate}"),),
    )
    g = _mlp(bias=(True, True))
    assert isinstance(match(g, pattern, g["mul"]), Match)
    g = _mlp(bias=(True, False))
    assert match(g, pattern, g["mul"]) == Mismatch("up: not gate", 4)


def test_find_tries_each_node_the_root_can_be_in_graph_order():
    g = _mlp()
    g.add("mul", "square", (g["x"], g["x"]))
    found = [(n.name, isinstance(m, Match)) for n, m in find(g, GATED)]
    assert found == [("mul", True), ("square", False)]
    assert list(find(Graph("empty"), GATED)) == []
    either = Pattern(Op("silu") | Op(("gelu_tanh", "mul")))
    assert either.anchors == {"silu", "gelu_tanh", "mul"}
    assert [n.name for n, _ in find(g, either)] == ["act", "mul", "square"]


# -- the declared region tables on built graphs ---------------------------------------------
def test_the_region_tables_on_a_llama():
    cfg = graphllm.load_config(tiny_configs.LLAMA)
    g = build_export_graph(cfg)
    attention = [m for _, m in find(g, ATTENTION_PATTERN)]
    assert [m.anchor.name for m in attention] == [
        f"model.layers.{i}.self_attn.merge_heads" for i in range(2)
    ]
    m = attention[0]
    assert m.ref("past_k") == Ref("past_key_values.0.key")
    assert m["x"].name == "model.layers.0.input_layernorm"
    assert {"q_proj", "k_proj", "v_proj"} <= set(m.refs) and "qkv_split" not in m
    assert "model.layers.0.self_attn.k_repeat" in {n.name for n in m.nodes}  # GQA: 4 / 2
    assert len([m for _, m in find(g, GATED_MLP_PATTERN) if isinstance(m, Match)]) == 2
    norms = [n.name for n, m in find(g, SKIP_NORM_PATTERN) if isinstance(m, Match)]
    # each residual add with the norm after it; the first layer's norm reads the embedding
    assert norms == [
        "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm",
        "model.layers.1.post_attention_layernorm",
        "model.norm",
    ]
    assert list(find(g, MOE_PATTERN)) == []
    # without a past, attention has no cache input to fuse
    prefill = build_graph(cfg, graphllm.Workload.with_dtype(batch=1, seq_len=4, dtype="fp32"))
    _, miss = next(find(prefill, ATTENTION_PATTERN))
    assert isinstance(miss, Mismatch) and miss.reason == (
        "model.layers.0.self_attn.k_rope: no past k input (export the graph with one)"
    )


def test_the_attention_table_on_phi3s_packed_projection_and_its_checks():
    cfg = small_instance(graphllm.load_config("phi3-mini"), 8)
    g = build_export_graph(cfg)
    _, m = next(find(g, ATTENTION_PATTERN))
    assert isinstance(m, Match) and "q_proj" not in m
    assert [p.name for p in qkv_projections(m)] == ["model.layers.0.self_attn.qkv_proj"]
    assert m["qkv_split"].name == "model.layers.0.self_attn.qkv_split"
    g["model.layers.0.self_attn.core.mask"].attrs["causal"] = False  # not one the builder makes
    _, miss = next(find(g, ATTENTION_PATTERN))
    assert isinstance(miss, Mismatch) and miss.reason == (
        "model.layers.0.self_attn.core.mask: attention that is not causal"
    )


def test_the_moe_table_says_what_routing_the_moe_op_cannot_do():
    g = build_export_graph(graphllm.load_config(tiny_configs.DEEPSEEK_V3))
    [(combine, miss)] = list(find(g, MOE_PATTERN))
    assert isinstance(miss, Mismatch) and miss.reason == (
        f"{combine.name}: routing the MoE op cannot do (mul_const weights)"
    )


# -- no op names outside the tables and the registry (the syntax tree) ----------------------
SOURCE_OPS = {"param", "input", "output"}  # graph inputs and weights: not rows to analyse


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _strings(node: ast.AST, consts: dict[str, set[str]]) -> set[str]:
    """The str literals a comparison operand spells: a literal, a collection of them, or a
    module-level name bound to one."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_strings(e, consts) for e in node.elts))
    if isinstance(node, ast.Name):
        return consts.get(node.id, set())
    return set()


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def op_name_uses(source: str) -> list[str]:
    """Where a module finds ops by name: `.op` compared with, or tested with `in` against, a
    str literal (source ops aside), and a literal passed to `.nodes(...)`."""
    tree = ast.parse(source)
    consts = {
        t.id: _strings(stmt.value, {})
        for stmt in tree.body
        if isinstance(stmt, ast.Assign)
        for t in stmt.targets
        if isinstance(t, ast.Name)
    }
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Attribute) and o.attr == "op" for o in operands):
                spelt = set().union(*(_strings(o, consts) for o in operands)) - SOURCE_OPS
                if spelt:
                    out.append((node, f".op against {sorted(spelt)}"))
        if isinstance(node, ast.Call) and _name(node) == "nodes":
            args = [*node.args, *(k.value for k in node.keywords)]
            if any(_strings(a, consts) for a in args):
                out.append((node, ".nodes() of a literal op"))
    return _by_line(out)


def _by_line(found: list[tuple[ast.AST, str]]) -> list[str]:
    found.sort(key=lambda f: (f[0].lineno, f[0].col_offset))  # type: ignore[attr-defined]
    return [f"{node.lineno}: {what}" for node, what in found]  # type: ignore[attr-defined]


def op_literals_outside_tables(source: str) -> list[str]:
    """Op names spelt other than in a declared pattern table (an `Op(...)` at module level),
    in the row registry (`lowers(...)`, `DECOMPOSED[...]`, an OpSet's `rows={...}` keys)."""
    tree = ast.parse(source)
    parents = _parents(tree)
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and node.value in set(OPS) - SOURCE_OPS):
            continue
        up = parents[node]
        if isinstance(up, ast.Tuple):  # Op(("linear", "linear_bias"), ...)
            up = parents[up]
        if isinstance(up, ast.Call) and _name(up) == "lowers":
            continue
        if isinstance(up, ast.Subscript) and getattr(up.value, "id", None) == "DECOMPOSED":
            continue
        if isinstance(up, ast.Dict) and node in up.keys:
            kw = parents[up]
            if isinstance(kw, ast.keyword) and kw.arg == "rows":
                continue
        if (
            isinstance(up, ast.Call)
            and _name(up) == "Op"
            and up.args
            and up.args[0]
            in (
                node,
                parents[node],
            )
        ):
            scope = up
            while scope in parents and not isinstance(scope, ast.FunctionDef | ast.Lambda):
                scope = parents[scope]
            if scope not in parents:  # reached the module: a declared table
                continue
        out.append((node, repr(node.value)))
    return _by_line(out)


def test_the_syntax_tree_checks_catch_what_they_look_for():
    bad = """
LINEAR = ("linear", "linear_bias")
def f(g, n):
    if n.op == "rmsnorm" or n.op in LINEAR or "pv" != g[n.inputs[0].node].op:
        pass
    if n.op not in ("param", "input"):
        pass
    return list(g.nodes("mul")) + list(g.nodes(op="pv")) + list(g.nodes())
def pattern():
    return Op("softmax")
TABLE = Op("softmax", Op(("linear", "silu")))
lowers("add")(None)
ROWS = OpSet("x", rows={"mul": None})
SPELT = {"mul": None}
"""
    assert op_name_uses(bad) == [
        "4: .op against ['rmsnorm']",
        "4: .op against ['linear', 'linear_bias']",
        "4: .op against ['pv']",
        "8: .nodes() of a literal op",
        "8: .nodes() of a literal op",
    ]
    assert op_literals_outside_tables(bad) == [
        "2: 'linear'",
        "2: 'linear_bias'",
        "4: 'rmsnorm'",
        "4: 'pv'",
        "8: 'mul'",
        "8: 'pv'",
        "10: 'softmax'",
        "14: 'mul'",
    ]


@pytest.mark.parametrize("path", sorted(ONNX_DIR.glob("*.py")), ids=lambda p: p.name)
def test_the_onnx_lowerings_find_ops_by_tables_not_names(path):
    assert op_name_uses(path.read_text()) == []


@pytest.mark.parametrize("name", ["fused.py", "mla.py", "regions.py", "patterns.py"])
def test_the_fused_lowerings_spell_op_names_in_their_tables_and_rows_only(name):
    assert op_literals_outside_tables((ONNX_DIR / name).read_text()) == []
