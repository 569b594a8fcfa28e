"""Passes over the Graph: analyses (Graph -> Report) and transforms (Graph -> Graph).

A pass is a function `fn(graph, results, **options)` registered under a stable name with its
contract: the passes it requires, the options it takes (its own keyword parameters, so a misspelt
one fails) and the meta keys it writes. `run` composes passes in dependency order, gives each
option to the passes that declare it, checks that each pass wrote what it declares, and names the
pass that failed. Readers of a pass's results in meta go through `meta_result`, which names the
pass that has not run instead of handing back a default.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any

from graphllm.errors import GraphllmError, PassError
from graphllm.ir import Graph, Node


@dataclass(frozen=True)
class PassInfo:
    name: str
    fn: Callable[..., Any]
    requires: tuple[str, ...] = ()
    transforms: bool = False  # True: returns a new Graph; False: returns a report
    options: tuple[str, ...] = ()  # the keyword parameters of `fn` after (graph, results)
    writes: tuple[str, ...] = ()  # node.meta keys it leaves on every node
    graph_writes: tuple[str, ...] = ()  # graph.meta keys it leaves


PASSES: dict[str, PassInfo] = {}


def register(
    name: str,
    requires: Iterable[str] = (),
    transforms: bool = False,
    options: Iterable[str] = (),
    writes: Iterable[str] = (),
    graph_writes: Iterable[str] = (),
) -> Callable:
    """Decorator: register `fn(graph, results, **options)` as pass `name`.

    `options` names the keyword parameters `fn` takes (checked against its signature, which may
    not swallow extras with `**kwargs`). `writes` are the node.meta keys the pass leaves on every
    node and `graph_writes` the graph.meta keys, of the graph it returns when it `transforms`,
    else of the graph it is given. A pass that returns None had nothing to do for its options
    (roofline without hardware) and writes nothing.
    """
    opts, node_keys, graph_keys = tuple(options), tuple(writes), tuple(graph_writes)

    def deco(fn: Callable) -> Callable:
        _check_signature(name, fn, opts)
        PASSES[name] = PassInfo(name, fn, tuple(requires), transforms, opts, node_keys, graph_keys)
        return fn

    return deco


def _check_signature(name: str, fn: Callable, options: tuple[str, ...]) -> None:
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        raise PassError(f"pass {name}: declare its options instead of taking **kwargs")
    taken = {p.name for p in params[2:]}
    if len(params) < 2 or taken != set(options):
        raise PassError(
            f"pass {name}: declares options {sorted(options)}, but {fn.__name__} takes "
            f"(graph, results, {', '.join(sorted(taken))})"
        )


class Results(dict[str, Any]):
    """{pass name: its result}. Reading a pass that has not run is a PassError naming it."""

    def __missing__(self, name: str) -> Any:
        ran = ", ".join(self) or "none"
        raise PassError(f"pass {name} has not run (ran: {ran}); require it or run it first")


def run(graph: Graph, names: Iterable[str], **options: Any) -> Results:
    """Run the named passes (and what they require) once each, each with the options it
    declares; returns {name: result}. An option that none of them declares is a PassError."""
    order = _order(list(names))
    taken = sorted({o for p in order for o in p.options})
    unknown = [k for k in options if k not in taken]
    if unknown:
        close = get_close_matches(unknown[0], taken, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise PassError(
            f"option {', '.join(map(repr, unknown))}: none of the passes run "
            f"({', '.join(p.name for p in order) or 'none'}) takes it; they take "
            f"{', '.join(taken) or 'no options'}{hint}"
        )
    after = next((p.name for p in order[:-1] if p.transforms), None)
    if after is not None:
        # every pass of one run reads the graph it was given, not a transform's output
        later = [p.name for p in order[order.index(PASSES[after]) + 1 :]]
        raise PassError(
            f"pass {', '.join(later)} would run on the graph given, not on {after}'s output: "
            f"run {after} first, then the others on the graph it returns"
        )
    results = Results()
    for info in order:
        kwargs = {k: options[k] for k in info.options if k in options}
        if not info.transforms:
            # results of an earlier run are stale once it reruns, and so are those built on them
            forget(
                graph, [info.name, *(d for d in dependents(info.name) if not PASSES[d].transforms)]
            )
        try:
            out = info.fn(graph, results, **kwargs)
        except GraphllmError as e:
            raise PassError(f"pass {info.name}: {e}") from e
        if out is not None:
            _ensure(info, out if info.transforms else graph)
        results[info.name] = out
    return results


def _order(names: list[str]) -> list[PassInfo]:
    """The passes to run, each after the ones it requires."""
    out: dict[str, PassInfo] = {}

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in out:
            return
        info = PASSES.get(name)
        if info is None:
            raise PassError(f"unknown pass {name!r}; known: {', '.join(sorted(PASSES))}")
        if name in stack:
            raise PassError(f"pass {name}: circular requirement via {' -> '.join(stack)}")
        for req in info.requires:
            visit(req, (*stack, name))
        out[name] = info

    for n in names:
        visit(n, ())
    return list(out.values())


def _ensure(info: PassInfo, graph: Graph) -> None:
    """The pass wrote what it declares."""
    for key in info.graph_writes:
        if key not in graph.meta:
            raise PassError(f"pass {info.name}: declares graph.meta[{key!r}] but did not write it")
    for key in info.writes:
        missing = next((n for n in graph.nodes() if key not in n.meta), None)
        if missing is not None:
            raise PassError(
                f"pass {info.name}: declares node.meta[{key!r}] but did not write it on "
                f"{missing.name}"
            )


def dependents(name: str) -> list[str]:
    """The registered passes that require `name`, directly or through others."""
    out: list[str] = []
    frontier = [name]
    while frontier:
        here = frontier.pop()
        for info in PASSES.values():
            if here in info.requires and info.name not in out:
                out.append(info.name)
                frontier.append(info.name)
    return out


def forget(graph: Graph, names: Iterable[str]) -> None:
    """Drop what the named passes wrote into `graph` (its meta and its nodes')."""
    infos = [PASSES[n] for n in names]
    for info in infos:
        for key in info.graph_writes:
            graph.meta.pop(key, None)
    keys = [k for info in infos for k in info.writes]
    if keys:
        for n in graph.nodes():
            for k in keys:
                n.meta.pop(k, None)


def writer_of(key: str) -> str | None:
    """The pass that declares it writes meta key `key`."""
    return next((p.name for p in PASSES.values() if key in p.writes or key in p.graph_writes), None)


def meta_result(where: Node | Graph, key: str) -> Any:
    """`where.meta[key]`, a pass's result; a PassError naming that pass when it is missing."""
    try:
        return where.meta[key]
    except KeyError:
        writer = writer_of(key)
        why = f"pass {writer} has not run on it" if writer else "no pass writes it"
        what = f"graph {where.name}" if isinstance(where, Graph) else where.name
        raise PassError(f"{what}: no {key!r} in its meta ({why})") from None
