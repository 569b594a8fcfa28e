"""Parallel layouts a careless or hostile user asks for: meshes past the largest clusters, plans of
millions of layouts, sizes the model cannot be cut into, traces too big to open. Each is refused in
one line before the work starts; the plan's enumeration is checked against brute force."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passes.parallel.plan import count_layouts, divisors, factorisations
from tests.support.hostile import Case, cases_params, check_case
from tests.support.paths import EXAMPLES

LLAMA = ["--model", "llama3-8b"]
MIXTRAL = ["--model", "mixtral-8x7b"]
TINY = ["--config", str(EXAMPLES / "tiny.yaml")]  # 4 heads (2 KV), 2 layers, B=2, T=8


def plan(*args: str, model: list[str] = LLAMA) -> list[str]:
    return ["plan", *model, *args]


def partition(*args: str, model: list[str] = TINY) -> list[str]:
    return ["partition", *model, *args]


PLANS = [
    Case("devices-1e9", plan("--devices", str(10**9)), expect="--devices is 1,000,000,000"),
    Case("devices-past-limit", plan("--devices", str(2**18)), expect="at most 131,072"),
    Case("devices-40-digits", plan("--devices", str(10**40)), expect="--devices"),
    Case("devices-5000-digits", plan("--devices", "9" * 5000), expect="--devices"),
    Case("devices-zero", plan("--devices", "0"), expect="--devices must be a positive"),
    Case("devices-negative", plan("--devices", "-8"), expect="--devices must be a positive"),
    Case("devices-word", plan("--devices", "eight"), expect="--devices"),
    Case(
        "layouts-too-many",
        plan("--devices", "55440", "-b", "55440", model=MIXTRAL),
        expect="131,250 layouts",
    ),
    Case("pinned-not-dividing", plan("-n", "8", "--tp", "3"), expect="does not divide --devices"),
    Case("pinned-huge", plan("-n", "8", "--tp", str(10**12)), expect="--tp 1,000,000,000,000"),
    Case("pinned-zero", plan("-n", "8", "--pp", "0"), expect="--pp"),
    Case("top-zero", plan("-n", "8", "--top", "0"), expect="--top"),
    Case(
        "plan-zero-without-dp",
        plan("-n", "8", "--training", "--zero", "1", "--dp", "1"),
        expect="--dp 1",
    ),
    Case("zero-stage-4", plan("-n", "8", "--training", "--zero", "4"), expect="--zero"),
    Case("none-legal", plan("-n", "3", model=TINY), expect="no layout of 3 devices"),
    Case(
        "pinned-ep-not-dividing",
        plan("-n", "6", "--ep", "3", model=MIXTRAL),
        expect="does not divide the 8 experts",
    ),
]

PARTITIONS = [
    Case("tp-not-dividing-heads", partition("--tp", "3"), expect="4 attention heads"),
    Case("pp-past-layers", partition("--pp", "3"), expect="more than the 2 layers"),
    Case("dp-not-dividing-batch", partition("--dp", "3"), expect="does not divide the batch 2"),
    Case("cp-not-dividing-tokens", partition("--cp", "3"), expect="8 new tokens"),
    Case("ep-dense", partition("--ep", "2"), expect="mixture-of-experts"),
    Case("ep-not-dividing", partition("--ep", "3", model=MIXTRAL), expect="8 experts"),
    Case("sp-without-tp", partition("--sp"), expect="--sp"),
    Case("whole-vocab-without-tp", partition("--whole-vocab"), expect="--whole-vocab"),
    Case("microbatches-huge", partition("--microbatches", str(10**20)), expect="--microbatches"),
    Case("microbatches-zero", partition("--microbatches", "0"), expect="--microbatches"),
    Case("dp-1e9", partition("--dp", str(10**9)), expect="mesh size of --dp 1,000,000,000"),
    Case("mesh-product", partition("--tp", "1024", "--dp", "1024"), expect="--tp 1,024 x --dp"),
    Case("tp-negative", partition("--tp", "-2"), expect="--tp"),
    Case("partition-zero-without-dp", partition("--training", "--zero", "2"), expect="--dp N"),
    Case(
        "trace-too-many-events",
        partition(
            "-b",
            str(2**20),
            "-t",
            "8",
            "--pp",
            "2",
            "--microbatches",
            str(2**20),
            "--trace",
            "t.json",
        ),
        expect="--trace would hold",
    ),
    Case(
        "trace-without-hardware",
        partition("--trace", "t.json", "--hardware", ""),
        expect="--hardware",
    ),
]

RENDERS = [
    Case(
        "render-mesh-1e9",
        ["render", *TINY, "--view", "block", "-o", "b.dot", "--tp", str(10**9)],
        expect="mesh size",
    ),
    Case(
        "render-layer-1e12",
        ["render", *TINY, "--view", "block", "-o", "b.dot", "--layer", str(10**12)],
        expect="--layer",
    ),
    Case(
        "render-strategy-not-block",
        ["render", *TINY, "--view", "model", "-o", "m.dot", "--tp", "2"],
        expect="--view block",
    ),
    Case(
        "render-lanes-zero",
        ["render", *TINY, "--view", "block", "-o", "b.dot", "--lanes", "0"],
        expect="--lanes",
    ),
]

CASES = PLANS + PARTITIONS + RENDERS


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    check_case(case, tmp_path)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 5000))
def test_divisors_are_every_divisor_in_order(n):
    assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.booleans(), st.sampled_from([{}, {"tp": 2}, {"tp": 2, "pp": 3}]))
def test_layouts_are_counted_before_they_are_enumerated(n, moe, pinned):
    fixed = 1
    for v in pinned.values():
        fixed *= v
    if n % fixed:
        return
    free = 5 - len(pinned) - (0 if moe else 1)
    assert count_layouts(n // fixed, free) == len(factorisations(n, pinned, moe))


def test_a_large_mesh_is_planned_in_seconds(tmp_path):
    """The largest mesh taken: 131,072 devices, enumerated by divisors in O(sqrt n)."""
    from tests.support.hostile import run_cli

    r = run_cli(["plan", *LLAMA, "-n", str(2**17), "-b", str(2**17), "--json"], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.seconds < 30


def test_many_microbatches_are_not_walked(tmp_path):
    """The device list walks the device axes only: 16M microbatches of 4 stages took minutes when
    every (device, microbatch) pair was visited."""
    from tests.support.hostile import run_cli

    args = ["partition", *LLAMA, "--training", "-b", str(2**24), "-t", "1", "--pp", "4"]
    r = run_cli([*args, "--microbatches", str(2**24)], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "16777216 microbatches" in r.stdout
    assert r.seconds < 30
