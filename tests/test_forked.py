"""graphllm/forked.py: work over forked workers gives what one process gives, in order; a worker
that dies leaves its work to the parent; $GRAPHLLM_JOBS is read and checked. And plan's report
is the same computed in workers or here."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graphllm import forked
from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel import plan as plan_mod

PARENT = os.getpid()


def _square_where(x: int) -> tuple[int, int]:
    return x * x, os.getpid()


def _dies_in_a_worker(x: int) -> int:
    if x == 3 and os.getpid() != PARENT:
        os._exit(1)  # killed, as for memory
    return -x


def test_workers_give_the_results_in_order_from_other_processes():
    got = list(forked.ordered_map(_square_where, range(40), 2))
    assert [v for v, _ in got] == [x * x for x in range(40)]
    assert {pid for _, pid in got} - {PARENT}, "the work ran in workers"


def test_one_job_runs_here():
    got = list(forked.ordered_map(_square_where, range(5), 1))
    assert [v for v, _ in got] == [0, 1, 4, 9, 16] and {p for _, p in got} == {PARENT}


def test_a_dead_worker_leaves_the_rest_to_this_process():
    assert list(forked.ordered_map(_dies_in_a_worker, range(8), 2)) == [-x for x in range(8)]


@pytest.mark.parametrize(("env", "want"), [("1", 1), ("3", 3), ("", None)])
def test_the_cap_comes_from_the_environment(monkeypatch, env, want):
    monkeypatch.setenv(forked.JOBS_ENV, env)
    monkeypatch.setattr(forked.os, "sched_getaffinity", lambda _: set(range(16)))
    assert forked.workers(100, 10) == (want or 16)
    assert forked.workers(5, 10) == 1  # too few pieces to fork for


@pytest.mark.parametrize("env", ["0", "-2", "many", "1.5"])
def test_a_bad_cap_is_one_line_naming_it(monkeypatch, env):
    monkeypatch.setenv(forked.JOBS_ENV, env)
    with pytest.raises(ConfigError, match="GRAPHLLM_JOBS") as e:
        forked.workers(100, 10)
    assert "\n" not in str(e.value)


def test_plan_in_workers_is_plan_in_one_process(monkeypatch):
    cfg, hw, wl = load_config("qwen3-30b-a3b"), load_hardware("h100"), Workload(seq_len=512)
    monkeypatch.setenv(forked.JOBS_ENV, "1")
    here = plan_mod.plan(cfg, wl, 16, hw).to_dict()
    monkeypatch.setattr(plan_mod, "workers", lambda n, least: 2)
    spawned = []
    real = forked.ordered_map

    def spy(fn, items, jobs):
        spawned.append(jobs)
        return real(fn, items, jobs)

    monkeypatch.setattr(plan_mod, "ordered_map", spy)
    here_too = []  # partitions made in this process: none, the workers make them all
    real_partition = plan_mod.partition

    def counted(*args, **kwargs):
        if os.getpid() == PARENT:
            here_too.append(1)
        return real_partition(*args, **kwargs)

    monkeypatch.setattr(plan_mod, "partition", counted)
    there = plan_mod.plan(cfg, wl, 16, hw).to_dict()
    assert spawned == [2] and not here_too
    assert json.dumps(there, sort_keys=True) == json.dumps(here, sort_keys=True)
    assert plan_mod._FORKED is None  # nothing of the plan is held after it


KILLED_PARENT = """
import os, sys, time
from graphllm import forked

def slow(x):
    time.sleep(60)

def main():
    out = sys.argv[1]
    gen = forked.ordered_map(slow, range(4), 2)
    import threading
    threading.Thread(target=lambda: next(gen), daemon=True).start()
    time.sleep(1.0)
    me = os.getpid()
    kids = [int(d) for d in os.listdir("/proc") if d.isdigit() and _ppid(d) == me]
    with open(out, "w") as f:
        f.write(" ".join(map(str, kids)))
    time.sleep(60)

def _ppid(d):
    try:
        with open(f"/proc/{d}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except OSError:
        return -1

main()
"""


def test_workers_end_with_a_parent_killed_outright(tmp_path):
    # SIGKILL (the OOM killer) gives the parent no chance to stop its workers: the kernel
    # does (PR_SET_PDEATHSIG), where they would wait on their queue for ever
    out = tmp_path / "kids"
    p = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, str(out)])
    deadline = time.monotonic() + 30
    while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    kids = [int(x) for x in out.read_text().split()]
    assert len(kids) >= 2, kids  # the two workers (and the pool's own helpers, if any)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    deadline = time.monotonic() + 10
    alive = kids
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [k for k in kids if _running(k)]
    for k in alive:  # left behind: not for the rest of the suite to carry
        os.kill(k, signal.SIGKILL)
    assert not alive, "a worker outlived its killed parent"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
