"""No pass or exporter picks nodes by the name of their op: what an analysis needs is a field of
the op's row (graphllm.ops), asked through `OPS[node.op]`.

The check walks the syntax tree of every module under passes/ and exporters/ and fails on
- a comparison (==, !=, in, not in) of `<x>.op` with a string literal, or with a tuple, list or
  set of string literals;
- a call `<x>.nodes("<literal>")` (or `nodes(op="<literal>")`).

Allowed:
- the source ops `param`, `input` and `output` (graph inputs and weights are not op semantics);
- the lowering registry: a function decorated `@lowers("a", "b")` may tell its own rows `a` and
  `b` apart (`@lowers(...)` arguments and `OpSet` rows keyed by op name are never flagged: they
  are neither comparisons nor `nodes()` calls);
- a fused lowering's declared pattern table: everything inside a module-level assignment to a
  name ending in `PATTERNS` (`PATTERNS = {...}`, `ATTENTION_PATTERNS = (...)`);
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("passes", "exporters")
SOURCE_OPS = frozenset({"param", "input", "output"})
PATTERN_SUFFIX = "PATTERNS"


def _literals(node: ast.expr) -> list[str] | None:
    """The string literals `node` is (one, or a tuple/list/set of them); None if it is not."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else []
    if elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
        return [e.value for e in elts]  # type: ignore[attr-defined]
    return None


def _is_op(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "op"


def _lowered(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    """The op names a `@lowers(...)` decorator registers `fn` for."""
    names: set[str] = set()
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and getattr(d.func, "id", getattr(d.func, "attr", "")) == (
            "lowers"
        ):
            names |= {a.value for a in d.args if isinstance(a, ast.Constant)}
    return frozenset(names)


class _Checker(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.found: list[str] = []
        self.own: list[frozenset[str]] = [frozenset()]  # ops the enclosing lowerings register

    def _flag(self, node: ast.AST, what: str, names: list[str]) -> None:
        bad = [x for x in names if x not in SOURCE_OPS and x not in self.own[-1]]
        if bad:
            self.found.append(f"{self.path}:{node.lineno}: {what} {', '.join(map(repr, bad))}")

    def visit_Module(self, node: ast.Module) -> None:
        for stmt in node.body:
            targets = (
                stmt.targets
                if isinstance(stmt, ast.Assign)
                else [stmt.target]
                if isinstance(stmt, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id.endswith(PATTERN_SUFFIX) for t in targets):
                continue  # a declared pattern table: its op names are its data
            self.visit(stmt)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.own.append(self.own[-1] | _lowered(node))
        self.generic_visit(node)
        self.own.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for (a, b), op in zip(itertools.pairwise(operands), node.ops):
            if not isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)):
                continue
            for side, other in ((a, b), (b, a)):
                names = _literals(other)
                if _is_op(side) and names is not None:
                    self._flag(node, "op compared with", names)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        if isinstance(node.func, ast.Attribute) and node.func.attr == "nodes":
            args = list(node.args) + [k.value for k in node.keywords if k.arg == "op"]
            for a in args:
                names = _literals(a)
                if names is not None:
                    self._flag(node, "nodes() of op", names)
        self.generic_visit(node)


def violations(source: str, path: str = "<snippet>") -> list[str]:
    """Every place in `source` that picks nodes by an op name (see the module docstring)."""
    checker = _Checker(path)
    checker.visit(ast.parse(source, path))
    return checker.found


def _modules() -> list[Path]:
    return sorted(p for d in SCANNED for p in (ROOT / d).rglob("*.py"))


def test_passes_and_exporters_ask_the_op_table_not_op_names():
    files = _modules()
    assert len(files) > 15  # the walk found the packages (it cannot pass on an empty tree)
    found = []
    for p in files:
        found += violations(p.read_text(), p.relative_to(ROOT).as_posix())
    assert not found, "op names outside the op table:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "snippet",
    [
        "if n.op == 'softmax': pass",
        "if 'softmax' == n.op: pass",
        "if n.op != 'recv': pass",
        "ok = node.op in ('scores', 'pv')",
        "ok = node.op not in ['scores']",
        "ok = a.b.op in {'param', 'mask'}",
        "xs = graph.nodes('embedding')",
        "xs = list(g.nodes(op='all_gather'))",
        "def f(g):\n    return [u for u in g.nodes() if u.op == 'split_heads']",
        "@lowers('linear')\ndef f(c, n):\n    return n.op == 'linear_bias'",  # not its own row
        "TABLE = {'x': [n for n in g.nodes('pv')]}",  # a table not declared as patterns
    ],
)
def test_the_check_flags_an_op_name(snippet):
    assert len(violations(snippet)) == 1


@pytest.mark.parametrize(
    "snippet",
    [
        "if n.op == 'param': pass",
        "ok = n.op in ('param', 'input')",
        "xs = graph.nodes('input')",
        "xs = graph.nodes()",
        "ok = n.op == other.op",
        "ok = OPS[n.op].category == 'source'",
        "ok = n.kind == 'softmax'",
        "@lowers('linear', 'linear_bias')\ndef f(c, n):\n    return n.op == 'linear'",
        "PATTERNS = {'attention': ('scores', 'softmax', 'pv')}",
        "GQA_PATTERNS = [lambda n: n.op == 'repeat_kv']",
        "ROWS = {'linear': f, 'rmsnorm': g}",  # an OpSet's rows keyed by op name
    ],
)
def test_the_check_allows(snippet):
    assert violations(snippet) == []
