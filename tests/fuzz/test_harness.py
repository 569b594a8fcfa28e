"""The fuzz harness itself: a refusal passes it, and each broken promise fails it."""

from __future__ import annotations

import pytest

from tests.support.hostile import Case, Result, assert_refused, check_case, run_cli, tree


def test_a_refusal_passes(tmp_path):
    check_case(Case("no-source", ["trace"], expect="--config"), tmp_path)


def test_a_success_is_not_a_refusal(tmp_path):
    with pytest.raises(AssertionError):
        check_case(Case("presets", ["presets"]), tmp_path)


@pytest.mark.parametrize(
    "result",
    [
        Result(1, "", "error: x\n", 0.1),
        Result(2, "", "Traceback (most recent call last):\nerror: x\n", 0.1),
        Result(2, "", "error: x\nerror: y\n", 0.1),
        Result(2, "", "x\n", 0.1),
        Result(2, "", "error: " + "x" * 2000, 0.1),
    ],
    ids=["exit-1", "traceback", "two-lines", "no-prefix", "long-line"],
)
def test_broken_promises_fail(tmp_path, result):
    with pytest.raises(AssertionError):
        assert_refused(result, tree(tmp_path), tmp_path)


def test_a_file_left_behind_fails(tmp_path):
    before = tree(tmp_path)
    (tmp_path / "out.onnx").write_text("half")
    with pytest.raises(AssertionError, match="left behind"):
        assert_refused(Result(2, "", "error: x\n", 0.1), before, tmp_path)


def test_runs_are_limited(tmp_path):
    r = run_cli(["presets"], tmp_path)
    assert r.returncode == 0 and "llama3-8b" in r.stdout
    hog = ["-c", "x = bytearray(8 << 30)"]
    import subprocess
    import sys

    from tests.support.hostile import _limits

    p = subprocess.run([sys.executable, *hog], capture_output=True, preexec_fn=_limits(1 << 30))
    assert p.returncode != 0 and b"MemoryError" in p.stderr
