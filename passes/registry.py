"""Passes over the Graph: analyses (Graph -> Report) and transforms (Graph -> Graph).

A pass is a function registered under a stable name with the passes it requires. `run` composes
them in dependency order and names the pass that failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from graphllm.errors import GraphllmError, PassError
from graphllm.ir import Graph


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: Callable[..., Any]
    requires: tuple[str, ...] = ()
    transforms: bool = False  # True: returns a new Graph; False: returns a report


PASSES: dict[str, PassInfo] = {}


def register(name: str, requires: Iterable[str] = (), transforms: bool = False) -> Callable:
    """Decorator: register `fn(graph, results, **options)` as pass `name`."""

    def deco(fn: Callable) -> Callable:
        PASSES[name] = PassInfo(name, fn, tuple(requires), transforms)
        return fn

    return deco


def run(graph: Graph, names: Iterable[str], **options: Any) -> dict[str, Any]:
    """Run the named passes (and what they require) once each; returns {name: result}."""
    results: dict[str, Any] = {}

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in results:
            return
        info = PASSES.get(name)
        if info is None:
            raise PassError(f"unknown pass {name!r}; known: {', '.join(sorted(PASSES))}")
        if name in stack:
            raise PassError(f"pass {name}: circular requirement via {' -> '.join(stack)}")
        for req in info.requires:
            visit(req, (*stack, name))
        try:
            results[name] = info.fn(graph, results, **options)
        except GraphllmError as e:
            raise PassError(f"pass {name}: {e}") from e

    for n in names:
        visit(n, ())
    return results
