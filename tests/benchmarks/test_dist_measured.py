"""benchmarks/dist_measured.py: `graphllm calibrate --link` then `graphllm run --hardware local`
for tp 2 and pp 2 on two ranks, the measured / predicted ratios as medians over the rounds.
One tiny round end to end (the tiny Llama, calibrate's quick sweeps), and the medians on
synthetic ratios."""

from __future__ import annotations

import importlib.util
import math
import subprocess
import sys

import pytest

from tests.support.paths import EXAMPLES, REPO

SCRIPT = REPO / "benchmarks" / "dist_measured.py"
_spec = importlib.util.spec_from_file_location("dist_measured", SCRIPT)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)
HAS_TORCH = importlib.util.find_spec("torch") is not None


def _measured(compute: float, reduce: float, last: float) -> dict:
    return {
        "ratios": {"prefill": {"compute": compute, "all_reduce": reduce, "step": 2.0}},
        "last_ratios": {"prefill": {"all_reduce": last}},
    }


def test_the_medians_are_over_the_rounds_per_step_and_kind():
    rounds = [
        bench.ratios_of(_measured(c, r, r / 2)) for c, r in ((1.0, 9.0), (3.0, 5.0), (2.0, 7.0))
    ]
    assert rounds[0]["prefill"] == {
        "compute": 1.0,
        "all_reduce": 9.0,
        "step": 2.0,
        "all_reduce:last": 4.5,
    }
    got = bench.medians(rounds)
    assert got == {
        "prefill": {"compute": 2.0, "all_reduce": 7.0, "step": 2.0, "all_reduce:last": 3.5}
    }
    lines = bench.table({"tp2": rounds}, {"tp2": [3.5, 1.25, 2.0]})
    kinds = [line.split()[2] for line in lines[1:]]
    assert kinds == ["compute", "all_reduce", "all_reduce:last", "step"]  # compute first, step last
    assert all(line.endswith("1.25-3.50") and " 3 " in line for line in lines[1:])


def test_a_kind_missing_from_a_round_takes_the_median_of_the_others():
    rounds = [{"decode": {"compute": 4.0}}, {"decode": {"compute": 2.0, "recv": 8.0}}]
    assert bench.medians(rounds) == {"decode": {"compute": 3.0, "recv": 8.0}}


def test_unknown_strategies_are_refused_in_one_line():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--strategies", "tp3"], capture_output=True, text=True
    )
    assert done.returncode == 2 and "strategies are tp2, pp2" in done.stderr


@pytest.mark.skipif(not HAS_TORCH, reason="torch (the dist extra) is not installed")
def test_one_tiny_round_of_tp2_and_pp2():
    args = ["--config", str(EXAMPLES / "tiny.yaml"), "--rounds", "1", "--seq-len", "4"]
    args += ["--new-tokens", "2", "--repeats", "1", "--quick"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout.splitlines()
    assert out[0].startswith("2 ranks on ") and "load average" in out[0]
    rows = {tuple(x.split()[:3]): x.split() for x in out if x.split()[:1] in (["tp2"], ["pp2"])}
    for strategy, kinds in (("tp2", ("all_reduce",)), ("pp2", ("send", "recv"))):
        for step in ("prefill", "decode"):
            for kind in ("compute", *kinds, *(f"{k}:last" for k in kinds), "step"):
                row = rows[(strategy, step, kind)]
                ratio = float(row[3])
                assert math.isfinite(ratio) and ratio > 0, row
                assert row[4] == "1" and "-" in row[5], row  # one round, its load average
    assert out[-1].startswith("load average")
