"""Signals in the middle of an export or a bench, in real child processes: SIGTERM and SIGINT end
with 128+N and one line, no partial output and the old target as it was; SIGKILL leaves its
temporaries, which the next run to the same target removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.hostile import ENTRY, _limits, sandbox_env, tree
from tests.support.paths import REPO

TINY = str(REPO / "examples" / "tiny.yaml")
# ~300 MB of random weights: a second or more of writing, long enough to be interrupted
BIG = """model_type: llama
hidden_size: 768
num_hidden_layers: 6
num_attention_heads: 12
num_key_value_heads: 4
intermediate_size: 3072
vocab_size: 16000
"""
OLD = b"the old model, which an interrupted export must leave as it was"


def _start(args: list[str], root: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", ENTRY, *args],
        cwd=root,
        # onnxruntime's telemetry store is another matter (checked elsewhere): kept out here
        env=sandbox_env(root, {"ORT_DISABLE_TELEMETRY": "1"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_limits(6 << 30),
    )


def _wait_for(root: Path, pattern: str, p: subprocess.Popen, timeout: float = 60) -> Path:
    """The first path under `root` matching `pattern` once it holds bytes (the writing began)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        for found in root.glob(pattern):
            if found.is_dir() or found.stat().st_size > 0:
                return found
        if p.poll() is not None:
            pytest.fail(f"ended first: {p.returncode} {p.stderr.read().decode()[-2000:]}")
        time.sleep(0.01)
    p.kill()
    pytest.fail(f"no {pattern} under {root} in {timeout} s")


def _finish(p: subprocess.Popen) -> tuple[int, str]:
    _, err = p.communicate(timeout=60)
    return p.returncode, err.decode(errors="replace").strip()


@pytest.fixture
def sandbox(tmp_path: Path) -> Path:
    (tmp_path / "big.yaml").write_text(BIG)
    (tmp_path / "out.onnx").write_bytes(OLD)
    return tmp_path


@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"]
)
def test_a_signal_ends_an_export_cleanly(sandbox, sig):
    before = tree(sandbox)
    p = _start(["export", "--config", "big.yaml", "-o", "out.onnx"], sandbox)
    _wait_for(sandbox, ".out.onnx.*.tmp", p)
    p.send_signal(sig)
    code, err = _finish(p)
    assert code == 128 + sig, (code, err)
    assert err == f"error: interrupted ({sig.name})"
    assert (sandbox / "out.onnx").read_bytes() == OLD
    assert tree(sandbox) - before - {"home", "tmp"} == set()


def test_sigkill_leaves_temporaries_the_next_run_removes(sandbox):
    p = _start(["export", "--config", "big.yaml", "-o", "out.onnx"], sandbox)
    left = _wait_for(sandbox, ".out.onnx.*.tmp", p)
    p.kill()
    p.wait(timeout=60)
    assert left.exists() and (sandbox / "out.onnx").read_bytes() == OLD
    code, err = _finish(_start(["export", "--config", TINY, "-o", "out.onnx"], sandbox))
    assert code == 0, err
    assert not left.exists() and not list(sandbox.glob(".out.onnx.*"))
    assert (sandbox / "out.onnx").read_bytes() != OLD


def test_sigterm_ends_a_bench_and_removes_its_folder(sandbox):
    args = ["bench", "--config", "big.yaml", "--no-predict", "--repeats", "1", "--warmup", "0"]
    p = _start(args, sandbox)
    _wait_for(sandbox / "tmp", ".graphllm-bench.*.tmp/.model.onnx.*.tmp", p)
    p.send_signal(signal.SIGTERM)
    code, err = _finish(p)
    assert code == 143, (code, err)
    assert err.splitlines()[-1] == "error: interrupted (SIGTERM)"
    assert not list((sandbox / "tmp").glob(".graphllm-bench*"))


def test_the_next_bench_removes_a_killed_bench_folder(sandbox):
    p = _start(["bench", "--config", "big.yaml", "--no-predict"], sandbox)
    folder = _wait_for(sandbox / "tmp", ".graphllm-bench.*.tmp", p)
    p.kill()
    p.wait(timeout=60)
    assert folder.exists()
    fast = ["--no-predict", "--repeats", "1", "--warmup", "0", "--prompt-len", "2"]
    code, err = _finish(_start(["bench", "--config", TINY, *fast, "--new-tokens", "1"], sandbox))
    assert code == 0, err
    assert not folder.exists()


def test_a_live_writers_temporary_is_left(tmp_path):
    """Only a dead writer's temporaries are removed: this process's own stays."""
    from graphllm.files import temp_path, write_text_atomic

    mine = temp_path(tmp_path / "out.txt")
    mine.write_text("being written")
    dead = tmp_path / f".out.txt.{_dead_pid()}.0123abcd.tmp"
    dead.write_text("left by a kill -9")
    write_text_atomic(tmp_path / "out.txt", "done")
    assert mine.exists() and not dead.exists()
    assert (tmp_path / "out.txt").read_text() == "done"


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_own_pid_is_alive_and_a_reaped_one_is_not():
    from graphllm.files import pid_alive

    assert pid_alive(os.getpid()) and not pid_alive(_dead_pid())


def test_a_temporary_folder_is_removed_on_error_and_a_dead_ones_on_the_next(tmp_path, monkeypatch):
    from graphllm.errors import GraphllmError
    from graphllm.files import temporary_folder

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir reads TMPDIR again
    stale = tmp_path / f".graphllm-bench.{_dead_pid()}.0123abcd.tmp"
    (stale / "sub").mkdir(parents=True)
    with pytest.raises(GraphllmError), temporary_folder("graphllm-bench") as folder:
        (folder / "model.onnx").write_bytes(b"partial")
        raise GraphllmError("a failure after the export")
    assert list(tmp_path.iterdir()) == []


# the console script's own first module (graphllm_entry), as `graphllm` runs it
SCRIPT = "import sys; sys.argv[0] = 'graphllm'; from graphllm_entry import main; main()"


def _startup_seconds(root: Path) -> float:
    """How long `graphllm --help` takes here: almost all of it the library's imports."""
    start = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", SCRIPT, "--help"],
        cwd=root,
        env=sandbox_env(root, {"ORT_DISABLE_TELEMETRY": "1"}),
        capture_output=True,
        check=True,
    )
    return time.monotonic() - start


@pytest.mark.parametrize("share", [0.4, 0.7])
def test_a_ctrl_c_while_the_library_loads_is_one_line(tmp_path, share):
    # before the command runs, the imports (numpy, onnx, the op table) take a few tenths of a
    # second: a SIGINT there once surfaced as a KeyboardInterrupt traceback from an import. The
    # signal is sent at a share of this machine's startup time, so it lands while the library
    # loads (one in the first hundredth, while Python imports its own site module, would be
    # Python's to report)
    delay = share * _startup_seconds(tmp_path)
    p = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, "trace", "--model", "llama3.1-405b"],
        cwd=tmp_path,
        env=sandbox_env(tmp_path, {"ORT_DISABLE_TELEMETRY": "1"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(delay)
    p.send_signal(signal.SIGINT)
    code, err = _finish(p)
    assert (code, err) == (130, "error: interrupted (SIGINT)")


def test_a_signal_inside_an_import_is_raised_after_it_not_swallowed(tmp_path, monkeypatch):
    # an exception raised from a signal handler inside importlib can land in one of its
    # callbacks, which prints "Exception ignored" and goes on (a CI run ended 0 so): the
    # handler waits until the import is over, then raises
    import importlib
    import threading

    from graphllm.cli.common import signals_interrupt
    from graphllm.errors import Interrupted

    (tmp_path / "slow_module_for_signal_test.py").write_text("import time\ntime.sleep(0.3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    timer = threading.Timer(0.05, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    with pytest.raises(Interrupted), signals_interrupt():
        timer.start()
        importlib.import_module("slow_module_for_signal_test")
        time.sleep(5)  # the retry raises within a few hundredths of a second
    assert 0.3 <= time.monotonic() - start < 2


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(d.name))
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_group_while_plan_runs_its_workers_is_one_line(tmp_path, sig):
    # plan forks workers for DeepSeek-V3's 164 rank programs (passes/parallel/plan.py): a
    # Ctrl-C reaches the whole process group, the workers too; they leave it to the parent,
    # which stops them and says one line
    p = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, "plan", "--model", "deepseek-v3", "--devices", "256",
         "--hardware", "h200", "--training", "-t", "4096", "-b", "256"],
        cwd=tmp_path,
        env=sandbox_env(tmp_path, {"GRAPHLLM_JOBS": "2"}),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not _children(p.pid) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _children(p.pid), "plan forked no workers"
    workers = _children(p.pid)
    os.killpg(p.pid, sig)
    code, err = _finish(p)
    assert (code, err) == (128 + sig, f"error: interrupted ({sig.name})")
    assert not [w for w in workers if Path(f"/proc/{w}").exists()], "a worker outlived plan"
