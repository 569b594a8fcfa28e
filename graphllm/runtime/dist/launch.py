"""Start N ranks on this machine and watch them: a free port on 127.0.0.1 for torch's TCP
rendezvous, one worker process a rank (each in its own session, so that it and anything it
started can be killed as a group), and the first failure ends the run.

Timeouts: every wait of a rank (the rendezvous, each collective, each send/recv) gives up after
`timeout` seconds (torch.distributed's process group timeout), and the rank then exits with its
line; the launcher kills the other ranks as soon as one fails, so a failure ends the run within
about `timeout` seconds of it, every rank gone, nothing written but the launcher's own
temporary folder, which is removed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from graphllm.errors import GraphllmError
from graphllm.files import temporary_folder, write_text_atomic
from graphllm.runtime.dist.comm import PEER_STATUS
from graphllm.runtime.dist.rank import Job, generate, preflight

POLL_SECONDS = 0.05
GRACE_SECONDS = 0.5  # after a first failure, how long the others' lines are waited for


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it; a race with another process taking
    it before rank 0 binds it fails the rendezvous, in one line)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(
    jobs: list[Job],
    nproc: int,
    env: dict[str, str] | None = None,
    started: int | None = None,
    pids: list[int] | None = None,
) -> list[dict[str, Any]]:
    """Run `jobs` one after another on `nproc` ranks; each job's result (rank 0's), with its
    whole logits per step under "logits" where the job keeps them. For tests: `env` adds to
    the workers' environment, `started` starts fewer workers than the world size they are
    told, `pids` gets the workers' process ids."""
    timeout = max(j.timeout for j in jobs)
    with temporary_folder("graphllm-run") as tmp:
        job_file = tmp / "jobs.json"
        write_text_atomic(job_file, json.dumps([j.to_dict() for j in jobs]))
        port = free_port()
        procs = _start(job_file, tmp, nproc, port, env or {}, nproc if started is None else started)
        if pids is not None:
            pids.extend(p.pid for p in procs)
        try:
            _watch(procs, tmp, timeout)
        finally:
            _kill(procs)
        result = tmp / "result.json"
        if not result.exists():
            raise GraphllmError("rank 0 exited without writing its result")
        cases = json.loads(result.read_text())["cases"]
        for case in cases:
            if "logits_file" in case:
                with np.load(tmp / case.pop("logits_file")) as z:
                    case["logits"] = [z[f"arr_{i}"] for i in range(len(z.files))]
        return cases


def _start(
    job_file: Path, tmp: Path, world: int, port: int, extra: dict[str, str], started: int
) -> list[subprocess.Popen]:
    procs = []
    for rank in range(started):
        env = os.environ | extra
        env |= {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            # one compute thread a rank: N ranks share this machine's cores
            "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS", "1"),
        }
        log = open(tmp / f"rank{rank}.log", "wb")  # noqa: SIM115 - the child holds it
        try:
            p = subprocess.Popen(
                [sys.executable, "-m", "graphllm.runtime.dist.worker", str(job_file)]
                + ["--out", str(tmp)],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            _kill(procs)
            raise GraphllmError(f"cannot start rank {rank}: {e.strerror}") from None
        finally:
            log.close()
        procs.append(p)
    return procs


def _watch(procs: list[subprocess.Popen], tmp: Path, timeout: float) -> None:
    """Until every rank exits 0; the first failure (and any others said within a moment) as
    one line."""
    failed: list[tuple[int, int]] = []
    first = None
    while True:
        for rank, p in enumerate(procs):
            code = p.poll()
            if code not in (None, 0) and all(rank != r for r, _ in failed):
                failed.append((rank, code))
                first = first or time.monotonic()
        if failed and time.monotonic() - first >= GRACE_SECONDS:  # type: ignore[operator]
            break
        if not failed and all(p.poll() == 0 for p in procs):
            return
        time.sleep(POLL_SECONDS)
    if os.environ.get("GRAPHLLM_DIST_DEBUG"):
        for rank in range(len(procs)):
            with contextlib.suppress(OSError):
                sys.stderr.write((tmp / f"rank{rank}.log").read_text())
    # the cause: the first to fail on its own (two ranks seen in one poll are in rank order,
    # and a rank whose collective lost its peer often exits within the same 50 ms), else the
    # first to fail; those after it mostly lost their peer
    failed.sort(key=lambda f: f[1] == PEER_STATUS)  # stable: the order they were seen in
    rank, code = failed[0]
    after = [str(r) for r, _ in failed[1:]]
    more = f" (then rank {', '.join(after)} failed too)" if after else ""
    raise GraphllmError(_cause(tmp, rank, code) + more)


def _cause(tmp: Path, rank: int, code: int) -> str:
    err = tmp / f"rank{rank}.error"
    with contextlib.suppress(OSError):
        return err.read_text().strip()
    how = f"signal {-code}" if code < 0 else f"status {code}"
    return f"rank {rank}: died ({how}) without a word"


def _kill(procs: list[subprocess.Popen]) -> None:
    """Every rank still running, and what it started, killed and reaped."""
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(timeout=10)


def run_job(job: Job, nproc: int) -> dict[str, Any]:
    """`graphllm run`: the job on `nproc` ranks (1: this process, the unpartitioned program, no
    torch); the prompt, the generated tokens and every rank's timing record."""
    strategy = preflight(job, nproc)
    if nproc == 1:
        gen = generate(job)
        ranks = [gen.record.to_dict()]
        prompt, tokens = gen.prompt.tolist(), gen.tokens.tolist()  # type: ignore[union-attr]
    else:
        if importlib.util.find_spec("torch") is None:
            raise GraphllmError(
                f"--nproc {nproc} runs on torch.distributed: install the dist extra "
                "(pip install 'graphllm[dist]')"
            )
        case = launch([job], nproc)[0]
        ranks, prompt, tokens = case["ranks"], case["prompt"], case["tokens"]
    return {
        "source": job.source,
        "strategy": strategy.to_dict() | {"describe": strategy.describe()},
        "nproc": nproc,
        "runtime": job.runtime,
        "backend": ranks[0]["backend"],
        "batch": job.batch,
        "seq_len": job.seq_len,
        "new_tokens": job.new_tokens,
        "weights": job.weights or f"seeded random (seed {job.seed})",
        "timeout_seconds": job.timeout,
        "prompt": prompt,
        "tokens": tokens,
        "ranks": ranks,
    }
