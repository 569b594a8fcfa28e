"""One family, one module: graphllm/models/families/ registers every family in one place, no
generic module branches on a family's name, and every registered family has a published config
here to be checked against."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from graphllm.models import config as C
from graphllm.models import families
from graphllm.models.families import FAMILY_TABLE, MULTIMODAL
from graphllm.models.family import Family, Multimodal

ROOT = Path(__file__).resolve().parents[2]
FAMILIES_DIR = ROOT / "graphllm" / "models" / "families"

# the modules that serve every family alike (all but the families' own): a family's differences
# are data its module declares
GENERIC = [
    path
    for top in ("graphllm", "passes", "exporters")
    for path in sorted((ROOT / top).rglob("*.py"))
    if FAMILIES_DIR not in path.parents
]

# every model_type a config may name or is refused with a reason, and the families' short names
FAMILY_NAMES = frozenset(
    {*FAMILY_TABLE, *MULTIMODAL, *C.NOT_SUPPORTED}
    | {"gemma", "deepseek", "llama4", "qwen", "mistral", "phi", "glm", "kimi", "minimax"}
    | {"olmo", "cohere", "granite", "nemotron", "smollm", "gpt-oss", "falcon", "mamba"}
)


def _family_branches(source: str, name: str) -> list[str]:
    """`file:line 'name'` for each string naming a family that a comparison, an if/elif/while
    or conditional expression's test, or a match case compares against."""
    tree = ast.parse(source)
    tests: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            tests.append(node)
        elif isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests.append(node.test)
        elif isinstance(node, ast.match_case):
            tests.append(node.pattern)
    found = set()
    for test in tests:
        for c in ast.walk(test):
            named = isinstance(c, ast.Constant) and isinstance(c.value, str)
            if named and c.value.lower() in FAMILY_NAMES:
                found.add(f"{name}:{c.lineno} {c.value!r}")
    return sorted(found)


@pytest.mark.parametrize(
    "source",
    [
        'if cfg.model_type == "gemma2":\n    pass\n',
        'x = 1 if mt in ("llama", "qwen2") else 0\n',
        'if name.startswith("deepseek"):\n    pass\n',
        'match mt:\n    case "nemotron_h":\n        pass\n',
        'while kind != "Mixtral":\n    pass\n',
    ],
)
def test_the_branch_check_finds_a_family_name(source: str) -> None:
    assert _family_branches(source, "x.py")


def test_the_branch_check_passes_data() -> None:
    # a family's name as data (a table key, an error message) is no branch
    source = 'TABLE = {"gemma2": 2}\nraise ValueError(f"not modelled for {mt}")\nif rt == "yarn":\n    pass\n'
    assert _family_branches(source, "x.py") == []


def test_no_generic_module_branches_on_a_family() -> None:
    assert len(GENERIC) > 100  # the whole package is scanned, not a folder that moved
    found = [
        hit
        for path in GENERIC
        for hit in _family_branches(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == [], "a family's difference belongs in its module's data: " + ", ".join(found)


def test_every_family_module_is_registered_once() -> None:
    modules = {p.stem for p in FAMILIES_DIR.glob("*.py")} - {"__init__"}
    registered = {m.__name__.rsplit(".", 1)[1] for m in families._MODULES}
    assert registered == modules
    for module in families._MODULES:
        assert module.FAMILIES, module.__name__
        assert all(isinstance(f, Family) for f in module.FAMILIES.values())
        assert all(isinstance(w, Multimodal) for w in getattr(module, "MULTIMODAL", {}).values())
    declared = [mt for module in families._MODULES for mt in module.FAMILIES]
    assert list(FAMILY_TABLE) == declared  # the order the refusals list them in
    assert C.FAMILY_TABLE is FAMILY_TABLE  # the dispatch reads the one registry


def test_a_model_type_declared_twice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    twice = (*families._MODULES, families.llama)
    monkeypatch.setattr(families, "_MODULES", twice)
    with pytest.raises(ValueError, match="model_type 'llama' is declared twice"):
        families._registry("FAMILIES")


def test_every_multimodal_wrapper_loads_a_registered_text_decoder() -> None:
    for mt, wrapper in MULTIMODAL.items():
        assert wrapper.text in FAMILY_TABLE, mt
        assert wrapper.unused and all(p.endswith(".") for p in wrapper.unused), mt


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


@pytest.mark.parametrize(
    "path",
    [
        *sorted(FAMILIES_DIR.glob("*.py")),
        *(ROOT / "graphllm" / "models" / f for f in ("family.py", "fields.py", "rope_fields.py")),
    ],
    ids=lambda p: p.name,
)
def test_family_modules_never_import_config(path: Path) -> None:
    # config.py imports the registry; the other way round would be a cycle
    assert "graphllm.models.config" not in _imports(path)


def _published_model_types() -> dict[str, list[str]]:
    """model_type -> the published config.json files here that carry it (at the top level or
    as a multimodal config's text_config): the presets and the tests' Hub fixtures."""
    files = [
        *sorted((ROOT / "graphllm" / "models" / "presets").glob("*.json")),
        *sorted((ROOT / "tests").rglob("config.json")),
    ]
    out: dict[str, list[str]] = {}
    for path in files:
        d = json.loads(path.read_text())
        text = d.get("text_config") if isinstance(d.get("text_config"), dict) else {}
        for mt in {d.get("model_type"), text.get("model_type")} - {None}:
            out.setdefault(mt, []).append(str(path.relative_to(ROOT)))
    return out


def test_every_registered_family_has_a_published_config() -> None:
    published = _published_model_types()
    missing = sorted(mt for mt in (*FAMILY_TABLE, *MULTIMODAL) if mt not in published)
    assert missing == [], f"no published config.json among the presets or fixtures: {missing}"
