"""No function runs over 60 lines: past a screen a reader loses the thread, and a long function
usually holds steps that read better named.

The check walks the syntax tree of every module under graphllm/, passes/, exporters/ and
benchmarks/ and measures each def (methods and nested defs included) from its `def` line to its
last line, decorators excluded. A function may stay longer where a comment says why it reads
better whole, on the line just above it (above its decorators) or on the first line of its body:

    # whole: one table of the flags, in the order --help lists them
    def long_one(...):

At most a handful of such exceptions, so that the marker stays the exception.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("graphllm", "passes", "exporters", "benchmarks")
LIMIT = 60
MARKER = "# whole:"
MAX_EXCEPTIONS = 5


@dataclass(frozen=True)
class Long:
    """A function over the limit: where it is, how long, and whether a comment excuses it."""

    where: str
    lines: int
    excused: bool


def _excused(fn: ast.FunctionDef | ast.AsyncFunctionDef, lines: list[str]) -> bool:
    """A `# whole: <why>` comment on the line above the def (or its first decorator), or on a
    comment line between the signature and the first statement of the body."""
    top = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    candidates = [top - 1] + list(range(fn.lineno + 1, fn.body[0].lineno))
    for number in candidates:  # 1-based line numbers
        text = lines[number - 1].strip() if 1 <= number <= len(lines) else ""
        # the reason must be there: a bare marker excuses nothing
        if text.startswith(MARKER) and len(text[len(MARKER) :].split()) >= 3:
            return True
    return False


def long_functions(source: str, path: str, limit: int = LIMIT) -> list[Long]:
    """Every function in `source` over `limit` lines (def line to last line)."""
    lines = source.splitlines()
    found = []
    for fn in ast.walk(ast.parse(source, path)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = fn.end_lineno - fn.lineno + 1
            if length > limit:
                where = f"{path}:{fn.lineno} {fn.name}"
                found.append(Long(where, length, _excused(fn, lines)))
    return found


def _scan() -> list[Long]:
    found = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += long_functions(path.read_text(), str(path.relative_to(ROOT)))
    return found


def test_no_function_runs_over_the_limit_unexcused():
    offenders = [f"{f.where}: {f.lines} lines" for f in _scan() if not f.excused]
    assert not offenders, (
        f"functions over {LIMIT} lines (extract steps, or say why one reads better whole with "
        f"a '{MARKER} <why>' comment above its def):\n" + "\n".join(offenders)
    )


def test_the_exceptions_stay_few():
    excused = [f.where for f in _scan() if f.excused]
    assert len(excused) <= MAX_EXCEPTIONS, "\n".join(excused)


def test_the_scan_reads_the_folders():
    # an empty scan passes every check above: make sure the folders are where the test looks
    for folder in SCANNED:
        assert any((ROOT / folder).rglob("*.py")), folder


def _function(body_lines: int, above: str = "", first: str = "", decorated: bool = False) -> str:
    """A synthetic module: one function whose def spans 1 + `body_lines` lines."""
    head = [above] if above else []
    head += ["@staticmethod"] if decorated else []
    head += ["def f(x):"] + ([f"    {first}"] if first else [])
    body = [f"    x = x + {i}" for i in range(body_lines - (1 if first else 0))]
    return "\n".join([*head, *body, ""])


def test_a_long_function_is_found():
    (found,) = long_functions(_function(61), "synthetic.py")
    assert found == Long("synthetic.py:1 f", 62, excused=False)
    assert long_functions(_function(59), "synthetic.py") == []  # 60 lines: at the limit, fine


def test_decorators_do_not_count_and_nested_defs_do():
    assert long_functions(_function(59, decorated=True), "synthetic.py") == []
    nested = "def outer():\n" + "\n".join(f"    {line}" for line in _function(61).splitlines())
    assert [f.where for f in long_functions(nested, "n.py")] == ["n.py:1 outer", "n.py:2 f"]


def test_a_reason_excuses_and_a_bare_marker_does_not():
    why = "# whole: one table of the flags, in --help's order"
    assert long_functions(_function(61, above=why), "s.py")[0].excused
    assert long_functions(_function(61, above=why, decorated=True), "s.py")[0].excused
    assert long_functions(_function(61, first=why), "s.py")[0].excused
    assert not long_functions(_function(61, above="# whole:"), "s.py")[0].excused
    assert not long_functions(_function(61, above="# long, sorry"), "s.py")[0].excused
    # a comment further up, not touching the def, excuses nothing
    far = f"{why}\nY = 1\n" + _function(61)
    assert not long_functions(far, "s.py")[0].excused
