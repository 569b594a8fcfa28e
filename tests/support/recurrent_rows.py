"""What every recurrence row's graph shows about token mixing: each position reads its prefix,
and after a past the carried state stands for every earlier position."""

from __future__ import annotations

from collections.abc import Callable

from graphllm.ir import Graph
from graphllm.passes import run
from graphllm.passes.tokens import mixing_verdict


def assert_prefix_mixing(graph_of: Callable[[int, int], Graph], node: str) -> None:
    """`graph_of(T, P)`: a graph of the row alone, named `node`. Five new tokens read their
    prefix; one token after four cached ones reads all five positions (the state's four)."""
    g = graph_of(5, 0)
    assert mixing_verdict(g, g[node]).mixes
    tokens = run(g, ["tokens"])["tokens"]
    for t in range(5):
        assert tokens.depends_on(t) == list(range(t + 1))
    step = run(graph_of(1, 4), ["tokens"])["tokens"]
    assert step.depends_on(0) == list(range(5))  # the state's 0..3, and position 4 itself
