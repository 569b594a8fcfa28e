"""Every shell command that README.md and docs/*.md show runs, so the pages cannot drift from the code.

What counts as a command:

- each line of a ```sh, ```bash or ```shell block (a trailing `\\` continues it on the next line, a
  trailing `# comment` is dropped, blank and comment lines are skipped); in a ```console block,
  the lines that start with `$ `, and the lines after one are output it must print (each a whole
  line of its stdout; a `...` line stands for lines left out);
- each inline code span that starts with `graphllm ` in a row of a Markdown table (the README's
  table of what graphllm does);
- a whole ```python block: one program, fed to the venv's python on its standard input.

A marker, an HTML comment just before a block or a table (blank lines between are allowed), says
how the test runs it; a block without one runs exactly as shown:

    <!-- test: skip (why) -->                not run; the reason is required
    <!-- test: OLD -> NEW; OLD2 -> NEW2 -->  run with every OLD replaced by NEW (a tiny stand-in
                                             for a large model, fewer repeats); each OLD must
                                             occur in the block, so a stale marker fails too

(substitutions may also go one a line between `<!-- test:` and `-->`).

A block's commands run in order, in one temporary folder of their own, so `export -o model.onnx`
then `bench model.onnx` works. That folder has `examples/` and `benchmarks/` linked in, an empty
`docs/` for output files, and, when a command names it, `tiny-checkpoint/`: a transformers
checkpoint of a tiny random Llama, saved with `save_pretrained`. Each command must exit 0 and
print something. Only `graphllm` and `python` commands run (after any `NAME=value` settings);
anything else (make, pip, source) must be marked skip. `XDG_CACHE_HOME` points into the temporary
folder, so `graphllm calibrate` leaves the user's figures of this machine alone.

A command shown several times (the README's table and a page, two pages) runs once, unless it
names a file that an earlier command of its block wrote: then it runs in each block. Each
occurrence is still its own test, named page:line.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell"}
CONSOLE = {"console"}
PYTHON = {"python", "py"}  # a whole block is one program, run with the venv's python
PROGRAMS = ("graphllm", "python")  # what the test may run; other commands must be marked skip
CHECKPOINT = "tiny-checkpoint"  # the folder name a marker may put in place of a real checkpoint
TIMEOUT_S = 180

FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
PY_END = "GRAPHLLM_DOCS_PY"  # the here-document's end line for a python block
MARKER = re.compile(r"<!--\s*test:(.*?)-->", re.S)
TABLE_CODE = re.compile(r"`(graphllm [^`]+)`")


@dataclass
class Command:
    page: str  # relative to the repository root
    line: int  # 1-based line of the page where the command starts
    shown: str  # as the page shows it
    text: str  # what runs: the markers' substitutions applied
    expect: list[str] = field(default_factory=list)  # a console block's output lines


@dataclass
class Unit:
    """A fenced shell block or a table: its commands run in order, in one folder."""

    page: str
    line: int
    commands: list[Command] = field(default_factory=list)
    skip: str | None = None  # the marker's reason
    python: bool = False  # a python block: its one command is the program's source


def strip_comment(line: str) -> str:
    """The line without a trailing `# comment` (a # outside quotes, after a blank)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip()
    return line.rstrip()


def parse_marker(body: str) -> tuple[str | None, list[tuple[str, str]], list[str]]:
    """(skip reason, substitutions, problems) of one marker's body."""
    body = body.strip()
    if body.startswith("skip"):
        m = re.fullmatch(r"skip\s*\((.+)\)", body, re.S)
        if not m or not m.group(1).strip():
            return None, [], [f"a skip marker needs a reason: skip (why), got {body!r}"]
        return " ".join(m.group(1).split()), [], []
    subs, problems = [], []
    for part in re.split(r"[;\n]", body):
        part = part.strip()
        if not part:
            continue
        if part.count("->") != 1:
            problems.append(f"a substitution is OLD -> NEW, got {part!r}")
            continue
        old, new = (s.strip() for s in part.split("->"))
        if not old:
            problems.append(f"a substitution needs an OLD, got {part!r}")
            continue
        subs.append((old, new))
    if not subs and not problems:
        problems.append("an empty marker: give skip (why) or OLD -> NEW")
    return None, subs, problems


def parse_page(page: str, source: str) -> tuple[list[Unit], list[str]]:
    """The page's units (shell blocks, tables with commands) and what is wrong with its markup."""
    lines = source.splitlines()
    units: list[Unit] = []
    problems: list[str] = []
    pending: tuple[int, str] | None = None  # a marker waiting for its block: (line, body)

    def take_marker() -> tuple[str | None, list[tuple[str, str]]]:
        nonlocal pending
        if pending is None:
            return None, []
        skip, subs, bad = parse_marker(pending[1])
        problems.extend(f"{page}:{pending[0]}: {b}" for b in bad)
        pending = None
        return skip, subs

    def finish(unit: Unit, subs: list[tuple[str, str]]) -> None:
        for old, _ in subs:
            if not any(old in c.shown for c in unit.commands):
                problems.append(
                    f"{page}:{unit.line}: the marker's {old!r} occurs in no command of the block"
                )
        for c in unit.commands:
            text = c.shown
            for old, new in subs:
                text = text.replace(old, new)
            if unit.python:  # the program on python's standard input, as the page shows it
                text = f"python - <<'{PY_END}'\n{text}\n{PY_END}"
            c.text = text
            words = [w for w in text.split() if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", w)]
            if unit.skip is None and (not words or words[0] not in PROGRAMS):
                problems.append(
                    f"{page}:{c.line}: {c.shown!r} is not a graphllm or python command: "
                    "mark the block <!-- test: skip (why) -->"
                )
        if unit.commands or unit.skip is not None or subs:
            units.append(unit)

    i = 0
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("<!--") and re.match(r"<!--\s*test:", stripped):
            start = i
            body = line
            while "-->" not in body and i + 1 < len(lines):
                i += 1
                body += "\n" + lines[i]
            m = MARKER.search(body)
            if m is None:
                problems.append(f"{page}:{start + 1}: an unterminated test marker")
            else:
                if pending is not None:
                    problems.append(f"{page}:{pending[0]}: a test marker before no block")
                pending = (start + 1, m.group(1))
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            ticks, lang = fence.groups()
            start = i
            body_lines = []
            i += 1
            while i < len(lines) and not (
                lines[i].strip().startswith(ticks) and lines[i].strip().strip(ticks[0]) == ""
            ):
                body_lines.append((i + 1, lines[i]))
                i += 1
            if i == len(lines):
                problems.append(f"{page}:{start + 1}: a fenced block that never ends")
            i += 1
            if not lang:
                problems.append(
                    f"{page}:{start + 1}: a fenced block without a language "
                    "(sh for commands the test runs, text for anything else)"
                )
            lang = lang.lower()
            if lang in PYTHON:
                skip, subs = take_marker()
                unit = Unit(page, start + 1, skip=skip, python=True)
                source = "\n".join(raw for _, raw in body_lines)
                unit.commands.append(Command(page, start + 2, source, source))
                finish(unit, subs)
                continue
            if lang not in SHELL | CONSOLE:
                if pending is not None:
                    problems.append(f"{page}:{pending[0]}: a test marker before a {lang} block")
                    pending = None
                continue
            skip, subs = take_marker()
            unit = Unit(page, start + 1, skip=skip)
            cont: tuple[int, str] | None = None
            for n, raw in body_lines:
                text = raw.strip()
                if lang in CONSOLE and cont is None:
                    if not text.startswith("$ "):
                        if unit.commands and text and text != "...":
                            unit.commands[-1].expect.append(text)  # output the page shows
                        continue
                    text = text[2:]
                text = strip_comment(text) if not text.startswith("#") else ""
                if cont is not None:
                    n, text = cont[0], cont[1] + " " + text
                    cont = None
                if text.endswith("\\"):
                    cont = (n, text[:-1].rstrip())
                    continue
                if text:
                    unit.commands.append(Command(page, n, text, text))
            if cont is not None:
                problems.append(f"{page}:{cont[0]}: a `\\` continuation at the end of a block")
            finish(unit, subs)
            continue
        if stripped.startswith("|"):
            start = i
            unit = Unit(page, start + 1)
            skip, subs = take_marker()
            unit.skip = skip
            while i < len(lines) and lines[i].strip().startswith("|"):
                for m in TABLE_CODE.finditer(lines[i]):
                    unit.commands.append(Command(page, i + 1, m.group(1), m.group(1)))
                i += 1
            finish(unit, subs)
            continue
        if stripped and pending is not None:
            problems.append(f"{page}:{pending[0]}: a test marker not followed by a block or table")
            pending = None
        i += 1
    if pending is not None:
        problems.append(f"{page}:{pending[0]}: a test marker at the end of the page")
    return units, problems


def collect() -> tuple[list[Unit], list[str]]:
    units, problems = [], []
    for path in PAGES:
        u, p = parse_page(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))
        units += u
        problems += p
    return units, problems


UNITS, PROBLEMS = collect()
CASES = [
    pytest.param(
        unit,
        k,
        id=f"{c.page}:{c.line}",
        marks=[pytest.mark.skip(reason=unit.skip)] if unit.skip is not None else [],
    )
    for unit in UNITS
    for k, c in enumerate(unit.commands)
]


def test_pages_markup():
    """Every marker parses and applies, every fence names its language, every command is runnable
    or marked skip with a reason."""
    assert not PROBLEMS, "\n".join(PROBLEMS)


def test_pages_show_commands():
    """The parser finds the pages' commands: a broken parser must not pass by running nothing."""
    pages = {c.page for u in UNITS for c in u.commands}
    assert "README.md" in pages and len(pages) >= 6, pages
    assert sum(len(u.commands) for u in UNITS if u.skip is None) >= 40


LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def test_links_resolve():
    """Every relative link of the pages names a file that exists, and a heading there."""
    bad = []
    for path in PAGES:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue  # a web address
                name, _, anchor = target.partition("#")
                dest = (path.parent / name).resolve() if name else path
                where = f"{path.relative_to(ROOT)}:{n}: {target}"
                if not dest.exists():
                    bad.append(f"{where}: no such file")
                elif anchor and dest.suffix == ".md":
                    heads = [
                        slug(h.lstrip("#"))
                        for h in dest.read_text(encoding="utf-8").splitlines()
                        if h.startswith("#")
                    ]
                    if anchor not in heads:
                        bad.append(f"{where}: no such heading")
    assert not bad, "\n".join(bad)


BAD_PAGE = """\
<!-- test: skip -->
```sh
graphllm presets
```

```sh
make demo
```

<!-- test: --model llama3-70b -> --config examples/tiny.yaml -->
```sh
graphllm trace --model llama3-8b
```

```
graphllm hardware
```

<!-- test: skip (a marker with nothing after it) -->

Some prose.
"""


def test_parser_catches_bad_markup():
    _, problems = parse_page("bad.md", BAD_PAGE)
    text = "\n".join(problems)
    assert "bad.md:1: a skip marker needs a reason" in text
    assert "bad.md:7: 'make demo' is not a graphllm or python command" in text
    assert "bad.md:11: the marker's '--model llama3-70b' occurs in no command" in text
    assert "bad.md:15: a fenced block without a language" in text
    assert "bad.md:19: a test marker not followed by a block or table" in text
    assert len(problems) == 5, text


def test_parser_reads_commands():
    page = """\
<!-- test:
--model llama3-70b -> --config examples/tiny.yaml
-t 8 -> -t 2
-->
```bash
graphllm trace --model llama3-70b \\
    -t 8   # a comment
# a comment line
python -c "print('#1')"  # quotes keep their '#'
```

```console
$ graphllm presets --json
[
...
```

| what | command |
|---|---|
| costs | `graphllm trace --model llama3-8b` and `graphllm hardware` |
"""
    units, problems = parse_page("ok.md", page)
    assert not problems
    got = [(c.line, c.shown, c.text, c.expect) for u in units for c in u.commands]
    assert got == [
        (
            6,
            "graphllm trace --model llama3-70b -t 8",
            "graphllm trace --config examples/tiny.yaml -t 2",
            [],
        ),
        (9, "python -c \"print('#1')\"", "python -c \"print('#1')\"", []),
        (13, "graphllm presets --json", "graphllm presets --json", ["["]),
        (20, "graphllm trace --model llama3-8b", "graphllm trace --model llama3-8b", []),
        (20, "graphllm hardware", "graphllm hardware", []),
    ]


# ------------------------------------------------------------------------------------------------
# Running: one folder per block, commands in order, each chain of commands run once


@pytest.fixture(scope="session")
def docs_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("docs")


@dataclass
class Run:
    result: subprocess.CompletedProcess
    folder: Path
    made: set[str]  # the files the command wrote, relative to its folder


_RUNS: dict[tuple[str, ...], Run] = {}  # by the chain: a block's commands up to this one
_SHARED: dict[str, Run] = {}  # by the command alone, for one that reads nothing made before it
_MADE: dict[Path, set[str]] = {}  # per folder, the files its block's commands wrote
_CHECKPOINT: list[Path] = []
_FOLDERS = itertools.count()


def tiny_checkpoint(root: Path) -> Path:
    """A transformers checkpoint folder of a tiny random Llama, made once a session."""
    if _CHECKPOINT:
        return _CHECKPOINT[0]
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    torch.manual_seed(0)
    folder = root / CHECKPOINT
    transformers.LlamaForCausalLM(cfg).save_pretrained(folder)
    _CHECKPOINT.append(folder)
    return folder


def environment(root: Path) -> dict[str, str]:
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)  # the venv's: graphllm and python
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    home_cache = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    env.setdefault("MPLCONFIGDIR", str(Path(home_cache) / "matplotlib"))  # keep its font cache
    env["XDG_CACHE_HOME"] = str(root / "cache")  # calibrate's figures stay in the test
    env["COLUMNS"] = "120"
    return env


def new_folder(root: Path) -> Path:
    folder = root / f"block{next(_FOLDERS):03d}"
    folder.mkdir()
    for name in ("examples", "benchmarks"):
        (folder / name).symlink_to(ROOT / name, target_is_directory=True)
    (folder / "docs").mkdir()
    return folder


def files(folder: Path) -> set[str]:
    """The files under folder, relative to it; links (examples/, benchmarks/) not followed."""
    out = set()
    for top, _, names in os.walk(folder):
        out |= {(Path(top) / n).relative_to(folder).as_posix() for n in names}
    return {f for f in out if not f.startswith(CHECKPOINT + "/")}


def run_chain(root: Path, chain: tuple[str, ...]) -> subprocess.CompletedProcess:
    """Run chain[-1] in the folder where chain[:-1] ran (a fresh one for a block's first command).

    Each chain runs once. A command that names no file its block made before it runs once for all
    blocks: another block gets its result, and a copy of the files it wrote."""
    if chain in _RUNS:
        return _RUNS[chain].result
    if len(chain) > 1:
        prior = run_chain(root, chain[:-1])
        if prior.returncode != 0:
            pytest.fail(f"an earlier command of this block failed: {chain[-2]}")
        folder = _RUNS[chain[:-1]].folder
    else:
        folder = new_folder(root)
    made = _MADE.setdefault(folder, set())
    command = chain[-1]
    words = set(command.replace("=", " ").split())
    reads_made = any(f in words for f in made)
    shared = None if reads_made else _SHARED.get(command)
    if shared is not None:
        for f in shared.made:
            (folder / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(shared.folder / f, folder / f)
        run = Run(shared.result, folder, shared.made)
    else:
        if CHECKPOINT in command and not (folder / CHECKPOINT).exists():
            shutil.copytree(tiny_checkpoint(root), folder / CHECKPOINT)
        before = files(folder)
        result = subprocess.run(
            ["bash", "-c", command],
            cwd=folder,
            env=environment(root),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        run = Run(result, folder, files(folder) - before)
        if not reads_made:
            _SHARED[command] = run
    made |= run.made
    _RUNS[chain] = run
    return run.result


@pytest.mark.parametrize(("unit", "k"), CASES)
def test_command_runs(unit: Unit, k: int, docs_root: Path):
    c = unit.commands[k]
    result = run_chain(docs_root, tuple(x.text for x in unit.commands[: k + 1]))
    ran = c.text if c.text == c.shown else f"{c.text}\n  (the page shows: {c.shown})"
    assert result.returncode == 0, (
        f"{c.page}:{c.line}: exit {result.returncode}\n  $ {ran}\n"
        f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
    )
    assert (result.stdout + result.stderr).strip(), f"{c.page}:{c.line}: no output from {ran}"
    printed = {line.strip() for line in result.stdout.splitlines()}
    missing = [line for line in c.expect if line not in printed]
    assert not missing, f"{c.page}:{c.line}: the page shows output that {ran} did not print:\n" + (
        "\n".join(missing)
    )
