"""Declared graph patterns, and the matcher that finds them or says why a candidate differs.

A pattern is a tree of the values a region reads, from its root (the region's output) to its
inputs, as the fused lowerings declare their regions (graphllm.exporters.onnx.regions):
- `Op("pv", probs, v, name="pv")`: a node of that op (or of one of a tuple of ops) whose first
  inputs match the sub-patterns (further inputs are not looked at), read at output `out`;
- `Var("x")`: any value;
- `a | b` (`Alt`): the first alternative that matches; `Optional(Op("repeat_kv", k))`: the op,
  or straight to its first input (an optional link of a chain).
A name binds a capture; a name met again must bind the same node (an Op) or value (a Var), so
`Var("x")` twice says "the same input". `Pattern` adds checks over the captures, each with the
reason it gives when it fails.

`match(graph, pattern, node)` matches the pattern's root at a node and returns the `Match` (its
captures and nodes) or a `Mismatch` whose reason says, in one line, what differs: the reason of
the alternative that got furthest, or the `why` of the Op, Alt or Check where it failed (with
`{node}` and `{op}` the node met there and `{anchor}` the root node; a check's reason names its
captures, `{scores}`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from graphllm.ir import Graph, Node, Ref


class Pat:
    """A pattern over one value: Op, Var or Alt."""

    def __or__(self, other: Pat) -> Alt:
        return Alt(self, other)


@dataclass(frozen=True, init=False)
class Op(Pat):
    """A node of one of `ops`, its inputs matching `inputs` in order, read at output `out`."""

    ops: tuple[str, ...]
    inputs: tuple[Pat, ...]
    name: str | None
    out: int
    why: str | None  # the reason when the node is of another op

    def __init__(
        self,
        ops: str | tuple[str, ...],
        *inputs: Pat,
        name: str | None = None,
        out: int = 0,
        why: str | None = None,
    ) -> None:
        object.__setattr__(self, "ops", (ops,) if isinstance(ops, str) else tuple(ops))
        object.__setattr__(self, "inputs", inputs)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "out", out)
        object.__setattr__(self, "why", why)


@dataclass(frozen=True)
class Var(Pat):
    """Any value, captured as `name`."""

    name: str


@dataclass(frozen=True, init=False)
class Alt(Pat):
    """The first of `options` that matches; `why` is the reason when none gets past its root."""

    options: tuple[Pat, ...]
    why: str | None

    def __init__(self, *options: Pat, why: str | None = None) -> None:
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "why", why)

    def __or__(self, other: Pat) -> Alt:
        return Alt(*self.options, other, why=self.why)


def Optional(link: Op) -> Alt:  # capitalised: reads as a pattern constructor, like Op
    """An optional link of a chain: the op, or straight to its first input."""
    return Alt(link, link.inputs[0])


@dataclass(frozen=True)
class Check:
    """A condition over the captures, and the reason it gives when it fails."""

    test: Callable[[Match], bool]
    why: str


@dataclass(frozen=True)
class Pattern:
    """A declared region: the tree from its root, and checks over the captures."""

    root: Pat
    checks: tuple[Check, ...] = ()

    @property
    def anchors(self) -> frozenset[str]:
        """The ops a root node can have: where `find` tries the pattern."""
        return frozenset(_root_ops(self.root))


def _root_ops(p: Pat) -> Iterator[str]:
    if isinstance(p, Op):
        yield from p.ops
    elif isinstance(p, Alt):
        for option in p.options:
            yield from _root_ops(option)


@dataclass(frozen=True)
class Match:
    """The captures of a match: `m["pv"]` is a captured node (a Var's: the node of its value),
    `m.ref("x")` the value read there; `nodes` are every node an Op matched, root first."""

    graph: Graph
    anchor: Node
    refs: dict[str, Ref]
    nodes: tuple[Node, ...]

    def __getitem__(self, name: str) -> Node:
        return self.graph[self.refs[name].node]

    def __contains__(self, name: str) -> bool:
        return name in self.refs

    def get(self, name: str) -> Node | None:
        return self[name] if name in self.refs else None

    def ref(self, name: str) -> Ref:
        return self.refs[name]


@dataclass(frozen=True)
class Mismatch:
    """Why a candidate is not the pattern, in one line."""

    reason: str
    progress: int = 0  # nodes matched before the failure: alternatives report the furthest
    node: str | None = None  # where the node was of an op other than `expected`
    expected: tuple[str, ...] = ()


@dataclass
class _State:
    graph: Graph
    anchor: str
    refs: dict[str, Ref] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)

    def copy(self) -> _State:
        return _State(self.graph, self.anchor, dict(self.refs), list(self.nodes))

    def fail(self, why: str, node: Node, **extra: str) -> Mismatch:
        """`why` said of `node`, where the match got to."""
        reason = why.format(node=node.name, op=node.op, anchor=self.anchor, **extra)
        return Mismatch(reason, len(self.nodes))


def _unexpected(node: Node, ops: tuple[str, ...], progress: int) -> Mismatch:
    reason = f"{node.name} is {node.op}, where {' or '.join(ops)} was expected"
    return Mismatch(reason, progress, node.name, ops)


def _bind(st: _State, name: str, ref: Ref, node_only: bool) -> Mismatch | None:
    bound = st.refs.setdefault(name, ref)
    if bound == ref or (node_only and bound.node == ref.node):
        return None
    why = "{node} is read as {name}, which is {bound} elsewhere"
    return st.fail(why, st.graph[ref.node], name=name, bound=bound.node)


def _match(p: Pat, ref: Ref, st: _State) -> Mismatch | None:
    """Match `p` at the value `ref`, adding to `st`; None when it matches."""
    node = st.graph[ref.node]
    if isinstance(p, Var):
        return _bind(st, p.name, ref, node_only=False)
    if isinstance(p, Alt):
        return _alt(p, ref, st)
    assert isinstance(p, Op)
    if node.op not in p.ops:
        return st.fail(p.why, node) if p.why else _unexpected(node, p.ops, len(st.nodes))
    if ref.index != p.out:
        why = f"{{node}}: output {ref.index} is read, where output {p.out} was expected"
        return st.fail(why, node)
    if p.name is not None:
        seen = p.name in st.refs
        miss = _bind(st, p.name, Ref(node.name, p.out), node_only=True)
        if miss is not None or seen:  # met again: its inputs were matched the first time
            return miss
    if len(node.inputs) < len(p.inputs):
        return st.fail(
            f"{{node}} has {len(node.inputs)} inputs, where {len(p.inputs)} were expected", node
        )
    st.nodes.append(node)
    for sub, r in zip(p.inputs, node.inputs):
        miss = _match(sub, r, st)
        if miss is not None:
            return miss
    return None


def _alt(p: Alt, ref: Ref, st: _State) -> Mismatch | None:
    fails = []
    for option in p.options:
        trial = st.copy()
        miss = _match(option, ref, trial)
        if miss is None:
            st.refs, st.nodes = trial.refs, trial.nodes
            return None
        fails.append(miss)
    furthest = max(f.progress for f in fails)
    if p.why and furthest == len(st.nodes):  # no option got past its root
        return st.fail(p.why, st.graph[ref.node])
    top = [f for f in fails if f.progress == furthest]
    said = [f for f in top if not f.expected]
    if said:
        return said[-1]
    # every option met another op at one node: say each op that was expected there
    at = [f for f in top if f.node == top[-1].node]
    ops = tuple(dict.fromkeys(op for f in at for op in f.expected))
    return _unexpected(st.graph[top[-1].node], ops, furthest)  # type: ignore[index]


def match(graph: Graph, pattern: Pattern, node: Node) -> Match | Mismatch:
    """The pattern with its root at `node`: the captures, or why it differs (checks last)."""
    st = _State(graph, node.name)
    miss = _match(pattern.root, Ref(node.name), st)
    if miss is not None:
        return miss
    m = Match(graph, node, st.refs, tuple(st.nodes))
    for check in pattern.checks:
        if not check.test(m):
            names = {k: r.node for k, r in st.refs.items()}
            return Mismatch(check.why.format(anchor=node.name, **names), len(st.nodes))
    return m


def find(graph: Graph, pattern: Pattern) -> Iterator[tuple[Node, Match | Mismatch]]:
    """Each node, in graph order, whose op the pattern's root can have, and its match."""
    anchors = pattern.anchors
    for node in graph.nodes():
        if node.op in anchors:
            yield node, match(graph, pattern, node)
