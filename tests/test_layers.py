"""The package's layers, read from the syntax tree: imports point down only, with no cycles (an
import under `if TYPE_CHECKING:` or inside a function closes a cycle as well as any), and only
heavy optional packages are imported inside functions.

cli -> report | runtime -> exporters -> passes -> build | trace | frontends -> ops -> ir -> models -> base
(base: graphllm.errors, graphllm.echo, graphllm.files, graphllm.limits and graphllm.forked). report and runtime share a rank: a report may embed
what a runtime measured and the other way round is not needed, but neither is a layer above
the other. `graphllm/__init__.py` is the public facade and may import any layer.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# source folder -> the package it installs as (pyproject's package-dir)
SOURCES = {"graphllm": "graphllm", "passes": "graphllm.passes", "exporters": "graphllm.exporters"}
RANKS = {
    "graphllm.errors": 0,
    "graphllm.echo": 0,
    "graphllm.files": 0,
    "graphllm.limits": 0,
    "graphllm.forked": 0,
    "graphllm.models": 1,
    "graphllm.ir": 2,
    "graphllm.ops": 3,
    "graphllm.build": 4,
    "graphllm.trace": 4,  # the traced frontend: the builder's twin
    "graphllm.frontends": 4,  # a config's graph, from whichever of the two made the config
    "graphllm.passes": 5,
    "graphllm.exporters": 6,
    "graphllm.runtime": 7,
    "graphllm.report": 7,
    "graphllm.cli": 8,
}
# imported inside functions so that `graphllm --help` and building a graph stay fast:
# onnxruntime, torch and matplotlib are optional extras; networkx costs 0.2 s to import and
# only `Graph.to_networkx()` needs it
LAZY = {"onnxruntime", "torch", "matplotlib", "networkx"}
LAZY |= {"transformers"}  # the traced frontend's, with torch
LAZY |= {"model_explorer"}  # issue 22: the explorer extra, imported by its exporter only


def _modules() -> dict[str, Path]:
    out = {}
    for folder, package in SOURCES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


MODULES = _modules()


def _layer(module: str) -> str | None:
    best = None
    for prefix in RANKS:
        if (module == prefix or module.startswith(prefix + ".")) and (
            best is None or len(prefix) > len(best)
        ):
            best = prefix
    return best


def _imports(
    path: Path, modules: Mapping[str, Path] = MODULES
) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(module-level imports, imports inside functions) of a file, as (line, module); a relative
    import is resolved against the file's own module in `modules`."""
    tree = ast.parse(path.read_text())
    here = next((m for m, p in modules.items() if p == path), None)
    top, inner = [], []
    nested = {
        id(sub)
        for fn in ast.walk(tree)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        for sub in ast.walk(fn)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and (node.level == 0 or here is not None):
            base = node.module or ""
            if node.level:  # `from .x import y` in a.b.c (or a/b/__init__) is a.b.x
                package = here.split(".")[: None if path.name == "__init__.py" else -1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, *([node.module] if node.module else [])])
            # `from graphllm.x import y` may name the submodule graphllm.x.y
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names
            ]
        else:
            continue
        (inner if id(node) in nested else top).extend((node.lineno, n) for n in names)
    return top, inner


def _in_type_checking(path: Path) -> set[int]:
    """Lines under `if TYPE_CHECKING:` (annotations only: no import at run time)."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for sub in node.body:
                lines.update(range(sub.lineno, (sub.end_lineno or sub.lineno) + 1))
    return lines


def test_every_module_has_a_layer():
    assert [m for m in MODULES if m != "graphllm" and _layer(m) is None] == []


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m != "graphllm"))
def test_imports_point_down(module):
    path, mine = MODULES[module], RANKS[_layer(module)]
    skip = _in_type_checking(path)
    up = [
        f"line {line}: {target}"
        for line, target in _imports(path)[0]
        if line not in skip
        and target.startswith("graphllm")
        and target != "graphllm"
        and RANKS[_layer(target)] > mine
    ]
    assert up == [], f"{module} imports a higher layer"
    assert not any(t == "graphllm" for line, t in _imports(path)[0] if line not in skip), (
        f"{module} imports the package facade; import the module that defines the name"
    )


@pytest.mark.parametrize("module", sorted(MODULES))
def test_function_level_imports_are_heavy_optional_packages(module):
    inner = _imports(MODULES[module])[1]
    assert [f"line {n}: {t}" for n, t in inner if t.split(".")[0] not in LAZY] == []


def _import_graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules it imports: at module level, inside functions and under
    `if TYPE_CHECKING:` alike, since each of them ties the two modules together (an import moved
    into a function or under TYPE_CHECKING to dodge a cycle is still that cycle)."""
    graph = {}
    for module, path in modules.items():
        top, inner = _imports(path, modules)
        graph[module] = {t for _, t in top + inner if t in modules and t != module}
    return graph


def _cycles(graph: Mapping[str, set[str]]) -> list[str]:
    """Each cycle a depth-first walk meets, as `a -> b -> a`. A package's `__init__` importing its
    own submodules is an edge like any other, so a submodule importing its package's facade
    closes a cycle."""
    state: dict[str, int] = {}  # 1: on the walk's stack, 2: done
    cycles = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join([*stack[stack.index(t) :], t]))
            elif t not in state:
                visit(t, [*stack, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return cycles


def test_no_import_cycles():
    assert _cycles(_import_graph(MODULES)) == []


def test_the_cycle_checker_sees_dodged_cycles(tmp_path):
    """A cycle closed by an import under `if TYPE_CHECKING:`, one inside a function, one through
    a relative import and one through a package's facade are each found: the checker cannot
    pass by seeing no edges."""
    files = {
        "pkg.a": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.b import B\n",
        "pkg.b": "from pkg.a import A\n\ndef f():\n    import pkg.c\n",
        "pkg.c": "from . import b\n",
        "pkg": "from pkg.d import D\n",
        "pkg.d": "from pkg import A\n",
    }
    modules = {}
    for name, text in files.items():
        parts = name.split(".")
        path = (
            tmp_path.joinpath(*parts, "__init__.py")
            if name == "pkg"
            else tmp_path.joinpath(*parts[:-1], parts[-1] + ".py")
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        modules[name] = path
    graph = _import_graph(modules)
    assert graph == {
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a", "pkg.c"},
        "pkg.c": {"pkg.b"},
        "pkg": {"pkg.d"},
        "pkg.d": {"pkg"},
    }
    assert _cycles(graph) == [
        "pkg -> pkg.d -> pkg",
        "pkg.a -> pkg.b -> pkg.a",
        "pkg.b -> pkg.c -> pkg.b",
    ]
    assert _cycles({"x": {"y"}, "y": set()}) == []


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from graphllm.cli.main import main\n\ndef f():\n    import graphllm.ops\n")
    top, inner = _imports(bad)
    assert top == [(1, "graphllm.cli.main")] and inner == [(4, "graphllm.ops")]
    assert RANKS[_layer("graphllm.cli.main")] > RANKS[_layer("graphllm.ir.graph")]


def test_test_modules_do_not_import_each_other():
    """Shared fixtures live in conftest.py and shared code in tests/support; a test module is
    never imported by another."""
    tests = ROOT / "tests"
    found = []
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                last = name.split(".")[-1]
                if last.startswith("test_") or last == "conftest":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert found == []
