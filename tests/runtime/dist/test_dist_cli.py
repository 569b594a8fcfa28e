"""`graphllm run`: the reference in this process, 2 ranks from the CLI, the same job written
with --write-job and run by torchrun (the several-machines path, on one), and the refusals
made before any rank starts."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from tests.runtime.dist.support import job, reference, write_configs

TORCH = importlib.util.find_spec("torch") is not None


def _tokens(source: str) -> list:
    return reference(job(source, batch=2, new_tokens=3))[1].tolist()


def test_one_process_is_the_reference(tmp_path):
    source = write_configs(tmp_path)["deepseek"]
    args = ["run", "--config", source, "-b", "2", "--new-tokens", "3", "--json"]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["tokens"] == _tokens(source)
    assert (
        doc["nproc"] == 1 and doc["backend"] == "none" and doc["runtime"] == "onnxruntime"
    )  # auto, with the ort runner built in
    assert [s["step"] for s in doc["ranks"][0]["steps"]] == ["prefill", "decode 1", "decode 2"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--tp", "2", "--nproc", "4"], "--nproc 4: tp=2 runs on 2 ranks"),
        (["--tp", "3"], "--tp 3 does not divide the 4 attention heads"),
        (["--write-job", "no/such/folder/job.json"], "folder no/such/folder does not exist"),
        (["--weights", "no-such-checkpoint"], "weights folder no-such-checkpoint does not exist"),
    ],
)
def test_refused_before_any_rank_starts(tmp_path, args, says):
    source = write_configs(tmp_path)["dense"]
    r = CliRunner().invoke(main, ["run", "--config", source, *args])
    assert r.exit_code == 2
    assert says in r.stderr and r.stderr.count("\n") == 1, r.stderr


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


@pytest.mark.skipif(not TORCH, reason="torch (the dist extra) is not installed")
def test_two_ranks_from_the_cli_and_from_torchrun(tmp_path):
    source = write_configs(tmp_path)["moe"]
    base = ["--config", source, "-b", "2", "--new-tokens", "3", "--ep", "2"]
    r = CliRunner().invoke(main, ["run", *base, "--write-job", str(tmp_path / "job.json")])
    assert r.exit_code == 0, r.output
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0"]
    torchrun += ["-m", "graphllm.runtime.dist.worker", str(tmp_path / "job.json")]
    cli = [sys.executable, "-m", "graphllm.cli", "run", *base, "--json"]
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(_run, [cli, torchrun])
    assert a.returncode == 0 and b.returncode == 0, (a.stderr[-500:], b.stderr[-500:])
    want = _tokens(source)
    doc = json.loads(a.stdout)
    assert doc["tokens"] == want and doc["backend"] == "gloo" and len(doc["ranks"]) == 2
    assert all(r["comm_seconds"] > 0 for r in doc["ranks"])
    kinds = {c["kind"] for s in doc["ranks"][0]["steps"] for c in s["collectives"]}
    assert "all_to_all" in kinds  # the experts' dispatch and combine over the ep ranks
    assert json.loads(b.stdout)["cases"][0]["tokens"] == want
