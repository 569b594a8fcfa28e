"""The graph: nodes (op applications) and refs (the tensors on edges), in topological order.

The graph knows no particular op: it asks the op table (graphllm.ir.opspec, filled by
graphllm.ops) for each node's output types as the node is added.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from graphllm.errors import GraphError

if TYPE_CHECKING:
    import networkx as nx

from graphllm.ir.dims import TensorType
from graphllm.ir.opspec import OPS, infer

CACHE = "cache"  # a graph output that the next step takes back as an input (the KV cache)
OUTPUT_ROLES = frozenset({CACHE})


class Ref(NamedTuple):
    """One output of a node: the tensor on an edge."""

    node: str
    index: int = 0


@dataclass(slots=True, eq=False)
class Node:
    """An op application. `meta` is where passes leave typed results."""

    name: str
    op: str
    inputs: tuple[Ref, ...]
    attrs: dict[str, Any]
    outputs: tuple[TensorType, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> TensorType:
        return self.outputs[0]

    def __str__(self) -> str:
        return self.name


class Graph:
    """A decoder as ops (nodes) and tensors (edges). Insertion order is a topological order.

    Nodes and users live in plain dicts (building a 405B graph is a hot path); `to_networkx()`
    gives the same graph as a networkx DiGraph for graph algorithms.
    """

    def __init__(self, name: str = "graph", bindings: dict[str, float] | None = None) -> None:
        self.name = name
        self.bindings: dict[str, float] = dict(bindings or {})
        self._nodes: dict[str, Node] = {}
        self._users: dict[str, list[str]] = {}
        self.outputs: dict[str, Ref] = {}
        self.output_roles: dict[str, str] = {}  # output name -> its role (OUTPUT_ROLES)
        self.meta: dict[str, Any] = {}
        self._nx: nx.DiGraph | None = None

    # -- construction --------------------------------------------------------------------------
    def add(
        self,
        op: str,
        name: str,
        inputs: Iterable[Ref | Node] = (),
        attrs: dict[str, Any] | None = None,
        outputs: tuple[TensorType, ...] | None = None,
    ) -> Node:
        """Append a node; its output types are inferred from the op table unless given."""
        if name in self._nodes:
            raise GraphError(f"{name}: a node of that name exists already")
        refs = tuple(r if isinstance(r, Ref) else Ref(r.name) for r in inputs)
        for r in refs:
            if r.node not in self._nodes:
                raise GraphError(f"{name}: input {r.node} is not in the graph (yet)")
        node = Node(name, op, refs, dict(attrs or {}), ())
        node.outputs = outputs if outputs is not None else infer(self, node)
        self._nodes[name] = node
        self._users[name] = []
        for r in refs:
            self._users[r.node].append(name)
        self._nx = None
        return node

    def set_output(self, name: str, ref: Ref | Node, role: str | None = None) -> None:
        """Make `ref` the graph output `name`; `role` says what it is for (OUTPUT_ROLES)."""
        if role is not None and role not in OUTPUT_ROLES:
            raise GraphError(f"graph output {name}: unknown role {role!r}")
        self.outputs[name] = ref if isinstance(ref, Ref) else Ref(ref.name)
        if role is None:
            self.output_roles.pop(name, None)
        else:
            self.output_roles[name] = role

    # -- queries -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, name: str) -> bool:
        return name in self._nodes

    def __getitem__(self, name: str) -> Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise GraphError(f"no node named {name!r}") from None

    def nodes(self, op: str | None = None) -> Iterator[Node]:
        """All nodes in topological order, optionally only those of one op."""
        if op is None:
            return iter(self._nodes.values())
        return (n for n in self._nodes.values() if n.op == op)

    def topo(self) -> list[Node]:
        return list(self._nodes.values())

    def users(self, node: Node | str) -> list[Node]:
        name = node if isinstance(node, str) else node.name
        return [self._nodes[u] for u in self._users[name]]

    def type_of(self, ref: Ref) -> TensorType:
        return self._nodes[ref.node].outputs[ref.index]

    def input_types(self, node: Node) -> list[TensorType]:
        return [self._nodes[r.node].outputs[r.index] for r in node.inputs]

    def scope(self, prefix: str) -> list[Node]:
        """Nodes whose name is `prefix` or lies under it (`model.layers.3` -> that block)."""
        dotted = prefix + "."
        return [n for n in self._nodes.values() if n.name == prefix or n.name.startswith(dotted)]

    def output_role(self, name: str) -> str | None:
        return self.output_roles.get(name)

    def cache_outputs(self) -> dict[str, Ref]:
        """The outputs a next step reads back as its past (keys and values, a latent, a state)."""
        return {k: r for k, r in self.outputs.items() if self.output_roles.get(k) == CACHE}

    def params(self) -> list[Node]:
        return [n for n in self._nodes.values() if n.op == "param"]

    def edges(self) -> Iterator[tuple[str, str, Ref]]:
        for n in self._nodes.values():
            for r in n.inputs:
                yield r.node, n.name, r

    def num_edges(self) -> int:
        return sum(len(n.inputs) for n in self._nodes.values())

    def to_networkx(self) -> nx.DiGraph:
        """The graph as a networkx DiGraph (built on first use, cached until the next change)."""
        if self._nx is None:
            import networkx as nx  # 0.2 s to import: only when an algorithm needs it

            g = nx.DiGraph()
            g.add_nodes_from((n.name, {"node": n}) for n in self._nodes.values())
            g.add_edges_from((src, dst, {"index": r.index}) for src, dst, r in self.edges())
            self._nx = g
        return self._nx

    def subgraph(self, names: Iterable[str]) -> Graph:
        """A new Graph of the named nodes; inputs from outside become dangling refs kept as-is."""
        keep = set(names)
        sub = Graph(self.name, self.bindings)
        for n in self._nodes.values():
            if n.name in keep:
                sub._nodes[n.name] = n
                sub._users[n.name] = [u for u in self._users[n.name] if u in keep]
        return sub

    # -- invariants ----------------------------------------------------------------------------
    def verify(self) -> None:
        """Check every node against its op spec; raise GraphError naming the first bad node."""
        seen: set[str] = set()
        for n in self._nodes.values():
            if n.op not in OPS:
                raise GraphError(f"{n.name}: unknown op {n.op!r}")
            for r in n.inputs:
                if r.node not in seen:
                    raise GraphError(f"{n.name}: input {r.node} does not come before it")
                if r.index >= len(self._nodes[r.node].outputs):
                    raise GraphError(f"{n.name}: input {r.node} has no output {r.index}")
            expected = infer(self, n)
            if expected != n.outputs:
                got = ", ".join(str(t) for t in n.outputs)
                want = ", ".join(str(t) for t in expected)
                raise GraphError(f"{n.name} ({n.op}): outputs are {got}, the op table gives {want}")
            seen.add(n.name)
        for out, r in self.outputs.items():
            if r.node not in self._nodes:
                raise GraphError(f"graph output {out}: no node {r.node}")

    # -- printing ------------------------------------------------------------------------------
    def format_node(self, n: Node, bound: bool = False) -> str:
        b = self.bindings if bound else None
        outs = ", ".join(t.format(b) for t in n.outputs)
        args = ", ".join(r.node if r.index == 0 else f"{r.node}[{r.index}]" for r in n.inputs)
        keys = [k for k in n.attrs if k not in ("axes", "kind", "type", "inv_freq")]
        attrs = "".join(f", {k}={_short(n.attrs[k])}" for k in keys)
        return f"%{n.name} : {outs} = {n.op}({args}{attrs})"

    def print(self, bound: bool = False) -> str:
        """One line per node, fx-style: `%name : shape = op(inputs, attrs)`."""
        lines = [self.format_node(n, bound) for n in self._nodes.values()]
        lines += [f"output {k} = %{r.node}" for k, r in self.outputs.items()]
        return "\n".join(lines)


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."
