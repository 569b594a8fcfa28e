"""The paired-ratio logic of benchmarks/int4_vs_genai.py on synthetic timings: the figure it
reports must cancel a load that weighs on both models of a pair, which medians taken per side
do not."""

from __future__ import annotations

import importlib.util

import pytest

from tests.support.paths import REPO

_spec = importlib.util.spec_from_file_location(
    "int4_vs_genai", REPO / "benchmarks" / "int4_vs_genai.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_paired_ratio_cancels_a_shared_load() -> None:
    # ours is 1.05x theirs in every pair; the load multiplies both of a pair by 1x..4x
    load = [1.0, 3.0, 1.5, 4.0, 1.0, 2.5, 1.2, 3.5]
    theirs = [0.010 * f for f in load]
    ours = [0.0105 * f for f in load]
    med, q1, q3 = bench.median_iqr(bench.paired_ratios(ours, theirs))
    assert med == pytest.approx(1.05) and q1 == pytest.approx(1.05) and q3 == pytest.approx(1.05)


def test_paired_ratio_a_spike_on_one_side() -> None:
    # a load spike that hits one of ours's bursts only: the median of the pairs stays at the
    # true 1.05, the spike shows in the upper quartile, and a ratio of totals would not hold it
    theirs = [1.0, 1.0, 1.0, 1.0, 1.0]
    ours = [1.05, 1.05, 1.05, 5.0, 1.05]
    med, q1, q3 = bench.median_iqr(bench.paired_ratios(ours, theirs))
    assert med == pytest.approx(1.05) and q1 == pytest.approx(1.05) and q3 == pytest.approx(1.05)
    assert sum(ours) / sum(theirs) > 1.8
    ours[1] = 5.0  # two spikes of five: the upper quartile moves, the median does not
    med, q1, q3 = bench.median_iqr(bench.paired_ratios(ours, theirs))
    assert med == pytest.approx(1.05) and q3 == pytest.approx(5.0)


def test_interquartile_range() -> None:
    med, q1, q3 = bench.median_iqr([1.0, 2.0, 3.0, 4.0, 5.0])
    assert (q1, med, q3) == (2.0, 3.0, 4.0)
    assert bench.median_iqr([1.25]) == (1.25, 1.25, 1.25)


def test_pairs_need_the_same_count() -> None:
    with pytest.raises(ValueError, match="3 bursts against 2"):
        bench.paired_ratios([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(ValueError):
        bench.paired_ratios([], [])


def test_turn_order_is_balanced() -> None:
    labels = [bench.GENAI, bench.SYM, bench.ASYM, bench.FP32]
    n = len(labels)
    orders = [bench.turn_order(labels, k) for k in range(2 * n)]
    assert all(sorted(o) == sorted(labels) for o in orders)
    for place in range(n):
        assert sorted(o[place] for o in orders) == sorted(labels * 2)
    for a in labels:
        for b in labels:
            if a != b:  # a goes before b in half the cycles
                assert sum(o.index(a) < o.index(b) for o in orders) == n
    assert bench.turn_order(labels, 2 * n + 1) == orders[1]
