"""Running the `graphllm` command as a careless or hostile user would, and checking the answer.

`run_cli` runs the command in a child process under an address-space limit and a wall-clock
limit, in a sandbox folder that is also its HOME, TMPDIR and XDG_CACHE_HOME, so that whatever it
leaves behind shows up in the sandbox. `assert_refused` holds a run to the promise every bad input
gets: exit code 2, exactly one line on stderr, no traceback, nothing left behind, in bounded time.

A corpus is a list of `Case`s, each making its own files in the sandbox; the fuzz modules in
tests/fuzz turn them into pytest parameters with `cases_params`.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

GIB = 1 << 30
MEMORY_LIMIT = 6 * GIB  # address space: the interpreter, numpy, onnxruntime and a tiny model fit
TIME_LIMIT = 60.0  # seconds, far above any refusal; a hang is what it catches


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Case:
    """One bad input: the command's arguments, the files it needs (made by `make` in the
    sandbox), the environment it runs in ("{root}" in a value: the sandbox's path), and a
    fragment the error line must contain."""

    id: str
    args: list[str]
    make: Callable[[Path], None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    expect: str | None = None
    memory: int = MEMORY_LIMIT
    timeout: float = TIME_LIMIT
    keep: tuple[str, ...] = ()  # files the run may leave (relative to the sandbox): none by default


def sandbox_env(root: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a run sees: its home, temporary and cache folders inside `root`."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(root / "home"),
        "TMPDIR": str(root / "tmp"),
        "XDG_CACHE_HOME": str(root / "cache"),
        "LANG": "C.UTF-8",
        "COLUMNS": "120",
        "OMP_NUM_THREADS": "1",
    }
    for sub in ("home", "tmp"):
        (root / sub).mkdir(exist_ok=True)
    # "{root}" in a case's value stands for the sandbox (whose path the case cannot know)
    env.update({k: v.replace("{root}", str(root)) for k, v in (extra or {}).items()})
    return env


# the console script's entry point, run by this interpreter (the venv's, whichever is active)
ENTRY = "import sys; from graphllm.cli import main; sys.argv[0] = 'graphllm'; main()"


def _limits(memory: int) -> Callable[[], None]:
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_cli(
    args: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    memory: int = MEMORY_LIMIT,
    timeout: float = TIME_LIMIT,
    stdin: bytes | None = None,
) -> Result:
    """`graphllm ARGS` in `cwd` under the limits; a run past `timeout` is killed and failed."""
    start = time.monotonic()
    p = subprocess.run(
        [sys.executable, "-c", ENTRY, *args],
        cwd=cwd,
        env=sandbox_env(cwd, env),
        input=stdin if stdin is not None else b"",
        capture_output=True,
        timeout=timeout,
        preexec_fn=_limits(memory),
    )
    return Result(
        p.returncode,
        p.stdout.decode(errors="replace"),
        p.stderr.decode(errors="replace"),
        time.monotonic() - start,
    )


def tree(root: Path) -> set[str]:
    """Every path under `root` (files, links and folders), relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def assert_refused(
    result: Result, before: set[str], root: Path, expect: str | None = None, keep=()
) -> None:
    """Exit 2, one line on stderr naming the problem, no traceback, nothing new under `root`."""
    err = result.stderr.strip()
    assert result.returncode == 2, (result.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert len(err.splitlines()) == 1, err[-2000:]
    assert err.startswith("error: "), err[:500]
    assert len(err) < 1000, f"an error line of {len(err)} characters"
    if expect is not None:
        assert expect.lower() in err.lower(), err
    left = tree(root) - before - {"home", "tmp"} - set(keep)
    assert not left, f"left behind: {sorted(left)}"


def check_case(case: Case, root: Path) -> Result:
    """Make the case's files in `root`, run it, and hold it to `assert_refused`."""
    if case.make is not None:
        case.make(root)
    before = tree(root)
    result = run_cli(case.args, root, case.env, case.memory, case.timeout)
    assert_refused(result, before, root, case.expect, case.keep)
    return result


def cases_params(cases: list[Case]) -> list:
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return [pytest.param(c, id=c.id) for c in cases]
