"""A failing rank ends the run quickly and loudly: one line naming the rank and the cause, exit 2
from the CLI, every worker gone, nothing left behind. The launches run side by side: most of
their time is torch's import and the timeouts waited out."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch (the dist extra) is not installed"
)

from graphllm.errors import GraphllmError  # noqa: E402
from graphllm.runtime.dist.comm import PEER_STATUS  # noqa: E402
from graphllm.runtime.dist.launch import _watch, launch  # noqa: E402
from graphllm.runtime.dist.worker import FAULT_ENV  # noqa: E402
from tests.runtime.dist.support import job, write_configs  # noqa: E402

TIMEOUT = 4.0  # each rank's wait for the rendezvous and for each collective

# fault -> (the start of the one line, launch's test options)
FAULTS = {
    "1:exit": ("rank 1: died (status 3) without a word", {}),
    # rank 1's all-reduce gives up on the silent rank 0 after the timeout
    "0:hang": ("rank 1: ", {}),
    "1:port": ("rank ", {}),
    "1:weights": ("rank 1: weights folder /nonexistent/graphllm-fault does not exist", {}),
    "short": ("rank 0: the rendezvous at 127.0.0.1:", {"started": 1}),  # 1 of 2 ranks started
}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _failing(source: str, fault: str, extra: dict) -> tuple[str, float, list[int]]:
    pids: list[int] = []
    j = job(source, strategy={"tp": 2}, batch=2, new_tokens=3, timeout=TIMEOUT)
    env = {FAULT_ENV: fault} if ":" in fault else {}
    t0 = time.monotonic()
    try:
        launch([j], 2, env=env, pids=pids, **extra)
    except GraphllmError as e:
        return str(e), time.monotonic() - t0, pids
    return "", time.monotonic() - t0, pids


def _cli(source: str) -> subprocess.CompletedProcess:
    args = ["run", "--config", source, "--tp", "2", "--new-tokens", "2", "--timeout", "5"]
    env = os.environ | {FAULT_ENV: "1:raise:prefill"}
    cmd = [sys.executable, "-m", "graphllm.cli", *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


def test_every_failure_is_one_line_naming_the_rank_and_no_worker_survives(tmp_path):
    source = write_configs(tmp_path)["dense"]
    with ThreadPoolExecutor(len(FAULTS) + 1) as pool:
        cli = pool.submit(_cli, source)
        runs = {f: pool.submit(_failing, source, f, extra) for f, (_, extra) in FAULTS.items()}
        got = {f: r.result() for f, r in runs.items()}
        r = cli.result()
    for fault, (msg, took, pids) in got.items():
        assert msg.startswith(FAULTS[fault][0]), (fault, msg)
        assert "\n" not in msg and "Traceback" not in msg, (fault, msg)
        assert len(pids) == (1 if fault == "short" else 2)
        assert not any(_alive(p) for p in pids), fault
        # the launch (torch's import under load) and at most one timeout waited out
        assert took < 60, (fault, took)
    assert "did not complete within 4 s" in got["1:port"][0]
    assert "did not complete within 4 s" in got["short"][0]
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: rank 1: fault injected at prefill (GRAPHLLM_DIST_FAULT)")
    assert r.stderr.count("\n") == 1 and r.stdout == ""


class _Exited:
    """A rank process that has already exited with `code` (what _watch polls)."""

    def __init__(self, code: int) -> None:
        self.code = code

    def poll(self) -> int:
        return self.code


def test_a_rank_that_failed_on_its_own_is_named_before_one_that_lost_its_peer(tmp_path):
    """Both seen in one poll: rank 0's all-reduce lost rank 1, which died; the line names rank
    1, and rank 0 after it. With only peer failures, the first seen stays the cause."""
    (tmp_path / "rank0.error").write_text("rank 0: all_reduce ar over tp: Connection closed\n")
    with pytest.raises(GraphllmError) as e:
        _watch([_Exited(PEER_STATUS), _Exited(3)], tmp_path, timeout=5.0)
    assert str(e.value) == "rank 1: died (status 3) without a word (then rank 0 failed too)"
    (tmp_path / "rank1.error").write_text("rank 1: all_reduce ar over tp: Connection closed\n")
    with pytest.raises(GraphllmError) as e:
        _watch([_Exited(PEER_STATUS), _Exited(PEER_STATUS)], tmp_path, timeout=5.0)
    assert str(e.value).startswith("rank 0: all_reduce ar over tp")
