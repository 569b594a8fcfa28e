"""The program of one rank: `python -m graphllm.runtime.dist.worker JOB.json`.

The launcher (launch.py) starts it N times on this machine; `torchrun` starts it across machines
(it reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT and LOCAL_RANK, which torchrun sets). JOB.json
is a list of jobs (`graphllm run --write-job` writes one), run one after another in the same
process group: the launch, torch's import and the rendezvous are paid once.

Any failure is one line on stderr, `rank K: cause`, and exit 2; with --out the line is also
written to OUT/rank{K}.error for the launcher. Rank 0 gathers every rank's timing record and
writes OUT/result.json (atomically), or prints it when there is no --out.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np

from graphllm.errors import GraphllmError
from graphllm.files import json_text, write_atomic, write_text_atomic
from graphllm.passes.parallel.partition import Strategy, make_mesh
from graphllm.runtime.dist.comm import PEER_STATUS, Comm, PeerError, device_mesh, one_line
from graphllm.runtime.dist.rank import Job, generate

# a test's hook: "K:KIND[:STEP]" makes rank K fail: raise (an error), exit (dies at once, no
# word), hang (stops answering), port (dials a rendezvous port nobody listens on), weights (its
# checkpoint folder cannot be read); at step STEP ("prefill", "decode 1" ...; default decode 1)
FAULT_ENV = "GRAPHLLM_DIST_FAULT"
DEBUG_ENV = "GRAPHLLM_DIST_DEBUG"  # set: a failing rank's traceback goes to its log too


def _fault(rank: int) -> tuple[str, str] | None:
    raw = os.environ.get(FAULT_ENV, "")
    if not raw:
        return None
    parts = raw.split(":")
    if int(parts[0]) != rank:
        return None
    return parts[1], parts[2] if len(parts) > 2 else "decode 1"


def _hook(fault: tuple[str, str] | None) -> Any:
    def at(step: str) -> None:
        if fault is None or step != fault[1]:
            return
        if fault[0] == "raise":
            raise GraphllmError(f"fault injected at {step} ({FAULT_ENV})")
        if fault[0] == "exit":
            os._exit(3)
        if fault[0] == "hang":
            time.sleep(1e6)

    return at


def _init(timeout: float, fault: tuple[str, str] | None) -> tuple[int, int, str]:
    import torch
    import torch.distributed as dist

    if fault is not None and fault[0] == "port":
        os.environ["MASTER_PORT"] = str(int(os.environ.get("MASTER_PORT", "29500")) + 1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    where = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    cuda = torch.cuda.is_available() and os.environ.get("GRAPHLLM_DIST_BACKEND") != "gloo"
    device = "cpu"
    if cuda:  # NCCL on GPUs: one device a local rank (not run on this machine)
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = f"cuda:{local}"
    try:
        dist.init_process_group(
            "nccl" if cuda else "gloo", timeout=timedelta(seconds=timeout), init_method="env://"
        )
        dist.barrier()
    except Exception as e:
        raise GraphllmError(
            f"the rendezvous at {where} of {world} ranks did not complete within {timeout:g} s "
            f"({one_line(e)})"
        ) from None
    return rank, world, device


def run_jobs(jobs: list[Job], out: Path | None, rank: int) -> None:
    import torch.distributed as dist

    fault = _fault(rank)
    r, world, device = _init(max(j.timeout for j in jobs), fault)
    cases = []
    for i, job in enumerate(jobs):
        if fault is not None and fault[0] == "weights":
            job = Job(**(job.to_dict() | {"weights": "/nonexistent/graphllm-fault"}))
        mesh = device_mesh(make_mesh(Strategy(**job.strategy)))
        if mesh.devices != world:
            raise GraphllmError(
                f"{Strategy(**job.strategy).describe()} needs {mesh.devices} ranks, "
                f"{world} were started"
            )
        comm = Comm(mesh, r, job.timeout, device)
        dist.barrier()
        clock = time.perf_counter()
        gen = generate(job, comm, clock, hook=_hook(fault))
        records = [None] * world if r == 0 else None
        dist.gather_object(gen.record.to_dict(), records, dst=0)
        if r == 0:
            case = {
                "name": job.name,
                "strategy": Strategy(**job.strategy).describe(),
                "prompt": gen.prompt.tolist() if gen.prompt is not None else None,
                "tokens": gen.tokens.tolist(),
                "ranks": records,
            }
            if job.keep_logits and out is not None:
                path = out / f"logits{i}.npz"
                write_atomic(path, functools.partial(_save, arrays=gen.logits))
                case["logits_file"] = path.name
            cases.append(case)
    if r == 0:
        text = json_text({"cases": cases})
        if out is None:
            print(text)
        else:
            write_text_atomic(out / "result.json", text)
    dist.destroy_process_group()


def _save(path: Path, arrays: list[np.ndarray]) -> None:
    with open(path, "wb") as f:  # np.savez(path) would add .npz to the temporary's name
        np.savez(f, *arrays)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m graphllm.runtime.dist.worker")
    ap.add_argument("job", type=Path, help="JOB.json (graphllm run --write-job)")
    ap.add_argument("--out", type=Path, help="folder for the result (the launcher's)")
    args = ap.parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        raw = json.loads(args.job.read_text())
        jobs = [Job(**j) for j in (raw if isinstance(raw, list) else [raw])]
        run_jobs(jobs, args.out, rank)
    except BaseException as e:  # every failure of a rank is its one line
        line = f"rank {rank}: {one_line(e)}"
        print(line, file=sys.stderr, flush=True)
        if args.out is not None:
            with contextlib.suppress(Exception):  # the line on stderr is said already
                write_text_atomic(args.out / f"rank{rank}.error", line + "\n")
            if os.environ.get(DEBUG_ENV):  # the whole trace, for whoever debugs graphllm
                traceback.print_exc()
        # no interpreter teardown: a process group whose peers died can block in its destructor
        os._exit(PEER_STATUS if isinstance(e, PeerError) else 2)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
