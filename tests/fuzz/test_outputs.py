"""Bad output targets through the CLI: each refused in one line, before any work, and nothing
replaced. Devices are copies made in the sandbox (mknod) or symlinks to the real ones: a
regression must not be able to replace the system's /dev/null."""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.hostile import Case, cases_params, check_case, run_cli
from tests.support.paths import REPO
from tests.support.sandbox_files import both, fifo, folder, link, text, unix_socket

TINY = str(REPO / "examples" / "tiny.yaml")
LONG = "x" * 300 + ".onnx"


def _null_copy(name: str) -> Callable[[Path], None]:
    """A character device like /dev/null (1, 3), inside the sandbox."""

    def make(root: Path) -> None:
        try:
            os.mknod(root / name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("no CAP_MKNOD here")

    return make


# how each kind of bad target is made, its file name, and the fragment the line must hold
TARGETS: list[tuple[str, Callable[[Path], None] | None, str, str]] = [
    ("char-device", _null_copy("dev"), "dev", "character device"),
    ("fifo", fifo("pipe"), "pipe", "FIFO"),
    ("socket", unix_socket("sock"), "sock", "socket"),
    ("link-dev-null", link("null", "/dev/null"), "null", "character device (through a symlink"),
    ("link-dev-full", link("full", "/dev/full"), "full", "character device"),
    ("link-stdout", link("out", "/proc/self/fd/1"), "out", "not a regular file"),
    ("link-fifo", both(fifo("pipe"), link("lpipe", lambda root: root / "pipe")), "lpipe", "FIFO"),
    ("folder", folder("d"), "d", "folder"),
    ("link-folder", both(folder("d"), link("ld", lambda root: root / "d")), "ld", "folder"),
    ("missing-folder", None, "nope/out", "does not exist"),
    ("parent-is-file", text("f", "a file, not a folder"), "f/out", "is not a folder"),
    ("name-300", None, LONG, "at most 255"),
    ("proc", None, "/proc/graphllm-out", "cannot write"),
]


def _export(target: str) -> list[str]:
    return ["export", "--config", TINY, "-o", target]


def _render(target: str) -> list[str]:
    return ["render", "--config", TINY, "--view", "model", "-o", target + ".dot"]


def _per_op(target: str) -> list[str]:
    return ["trace", "--config", TINY, "--per-op", "csv", target]


def _partition_trace(target: str) -> list[str]:
    return ["partition", "--config", TINY, "--tp", "2", "--hardware", "h100", "--trace", target]


def _plot(target: str) -> list[str]:
    return ["trace", "--config", TINY, "-t", "8,16", "--plot", target + ".png"]


COMMANDS = {"export": _export, "render": _render, "per-op": _per_op}
# targets whose name the command extends with a suffix are made under that name
SUFFIXED = {"render": ".dot"}


def _cases() -> list[Case]:
    out = []
    for command, args in COMMANDS.items():
        for kind, make, name, expect in TARGETS:
            suffix = SUFFIXED.get(command, "")
            made = make
            if suffix and make is not None and "/" not in name:
                made = _rename(make, name, name + suffix)  # the command writes NAME.dot
            out.append(Case(f"{command}-{kind}", args(name), made, expect=expect))
    for kind, make, name, expect in TARGETS[:4] + TARGETS[7:10]:
        out.append(Case(f"partition-trace-{kind}", _partition_trace(name), make, expect=expect))
    for kind, name, expect in [("missing-folder", "nope/p", "does not exist")]:
        out.append(Case(f"plot-{kind}", _plot(name), None, expect=expect))
    out.append(Case("plot-fifo", _plot("pipe"), fifo("pipe.png"), expect="FIFO"))
    return out + CACHE_CASES + BENCH_CASES


def _rename(make: Callable[[Path], None], old: str, new: str) -> Callable[[Path], None]:
    """`make` as it makes `old`, under the name `new` (the render's NAME.dot)."""

    def made(root: Path) -> None:
        make(root)
        os.rename(root / old, root / new)

    return made


def _cache_file(root: Path) -> None:
    (root / "cachefile").write_text("not a folder")


CACHE_CASES = [
    Case(
        "calibrate-cache-is-file",
        ["calibrate", "--repeats", "1"],
        _cache_file,
        env={"XDG_CACHE_HOME": "{root}/cachefile"},
        expect="is not a folder",
    ),
    Case(
        "calibrate-cache-under-file",
        ["calibrate", "--repeats", "1"],
        _cache_file,
        env={"XDG_CACHE_HOME": "{root}/cachefile/deeper"},
        expect="is not a folder",
    ),
    Case(
        "calibrate-cache-in-proc",
        ["calibrate", "--repeats", "1"],
        env={"XDG_CACHE_HOME": "/proc/graphllm-cache"},
        expect="not writable",
    ),
    Case(
        "trace-local-cache-is-file",
        ["trace", "--config", TINY, "--hardware", "local"],
        _cache_file,
        env={"XDG_CACHE_HOME": "{root}/cachefile"},
        expect="XDG_CACHE_HOME",
    ),
    Case(
        "hardware-local-cache-under-file",
        ["plan", "--config", TINY, "--devices", "2", "--hardware", "local"],
        _cache_file,
        env={"XDG_CACHE_HOME": "{root}/cachefile/x"},
        expect="is not a folder",
    ),
]

# refused before the export into its temporary folder, which is not left behind
BENCH_CASES = [
    Case(
        "bench-local-cache-is-file",
        ["bench", "--config", TINY, "--repeats", "1"],
        _cache_file,
        env={"XDG_CACHE_HOME": "{root}/cachefile"},
        expect="is not a folder",
    ),
    Case(
        "bench-error-removes-its-folder",
        ["bench", "--config", TINY, "--hardware", "no-such-device", "--repeats", "1"],
        expect="unknown hardware",
    ),
]

CASES = _cases()


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    check_case(case, tmp_path)


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 30


def test_a_device_target_is_left_a_device(tmp_path):
    """A symlink to the real /dev/null is refused, and /dev/null is still the device."""
    check_case(Case("dev-null", _export("null"), link("null", "/dev/null")), tmp_path)
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert (tmp_path / "null").is_symlink() and os.readlink(tmp_path / "null") == "/dev/null"


@pytest.mark.parametrize(
    "args", [["presets", "--json"], ["trace", "--config", TINY, "--json"]], ids=["presets", "trace"]
)
def test_stdout_on_a_full_device_is_one_line(tmp_path, args):
    """/dev/full as stdout (opened for writing, never replaced): one line, not a traceback."""
    import subprocess
    import sys

    from tests.support.hostile import ENTRY, sandbox_env

    with open("/dev/full", "w") as full:
        p = subprocess.run(
            [sys.executable, "-c", ENTRY, *args],
            cwd=tmp_path,
            env=sandbox_env(tmp_path),
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    err = p.stderr.decode().strip()
    assert p.returncode == 2 and err == "error: cannot write the output: No space left on device"
    assert stat.S_ISCHR(os.stat("/dev/full").st_mode)


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the JSON output")

    return json.loads(text, parse_constant=refuse)


def test_json_output_is_strict_with_subnormal_hardware(tmp_path):
    """Subnormal figures make times infinite: the JSON holds null, never Infinity or NaN (or
    the spec is refused in one line)."""
    spec = {
        "peak_flops": {"bf16": 5e-324, "fp32": 5e-324},
        "memory_bandwidth": 5e-324,
        "memory_bytes": 8e10,
    }
    (tmp_path / "sub.json").write_text(json.dumps(spec))
    r = run_cli(["trace", "--config", TINY, "--hardware", "sub.json", "--json"], tmp_path)
    if r.returncode == 2:
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
        return
    assert r.returncode == 0, r.stderr[-2000:]
    doc = _strict(r.stdout)
    assert isinstance(doc, dict)


def test_json_text_maps_non_finite_to_null():
    from graphllm.files import json_text

    doc = {"a": math.inf, "b": [math.nan, 1.5, -math.inf], "c": (2, "x")}
    assert _strict(json_text(doc)) == {"a": None, "b": [None, 1.5, None], "c": [2, "x"]}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(name=st.text(st.characters(codec="utf-8"), min_size=0, max_size=300))
def test_any_name_is_written_or_refused_in_one_line(tmp_path, name):
    """Whatever the name (NUL, slashes, 300 characters, `..`), write_text_atomic writes a file
    or raises GraphllmError, and leaves no temporary."""
    from graphllm.errors import GraphllmError
    from graphllm.files import write_text_atomic

    folder = tmp_path / "w"
    folder.mkdir(exist_ok=True)
    try:
        written = write_text_atomic(folder / name, "x")
    except GraphllmError as e:
        assert "\n" not in str(e) and len(str(e)) < 1000
    else:
        assert written.is_file()
    assert not [p for p in tmp_path.rglob("*.tmp")]
