"""The graph: nodes (op applications, graphllm.ir.node) and refs (the tensors on edges), in
topological order.

The graph knows no particular op: it asks the op table (graphllm.ir.opspec, filled by
graphllm.ops) for each node's output types as the node is added.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from graphllm.errors import GraphError

if TYPE_CHECKING:
    import networkx as nx

from graphllm.ir.dims import TensorType
from graphllm.ir.node import Node, Ref
from graphllm.ir.opspec import OPS, infer

CACHE = "cache"  # a graph output that the next step takes back as an input (the KV cache)
# a graph output that the next step takes back in place of its past, of a size fixed
# whatever the sequence length (a linear-attention or Mamba layer's conv and recurrent state);
# it replaces the past rather than appending to it, so nothing may append to it in place
STATE = "state"
OUTPUT_ROLES = frozenset({CACHE, STATE})

# one counter for every graph: a version is never shared, so a cache keyed by it that a copy
# of meta carries into another graph can never match there
_VERSIONS = itertools.count(1)


class Graph:
    """A decoder as ops (nodes) and tensors (edges), kept in a topological order.

    Nodes live in a plain dict and the order in a list (building a 405B graph is a hot path:
    `add` appends in O(1)); the mutation verbs (`inserting_before`/`inserting_after`,
    `replace_input`, `replace_all_uses_with`, `erase`, `rename`) keep the order topological and
    every node's types consistent with its inputs, and bump `version`, which caches are keyed by.
    An insert or erase leaves a walk over `nodes()` in progress on the order it started with.
    `to_networkx()` gives the same graph as a networkx DiGraph for graph algorithms.
    """

    def __init__(self, name: str = "graph", bindings: dict[str, float] | None = None) -> None:
        self.name = name
        self.bindings: dict[str, float] = dict(bindings or {})
        self._nodes: dict[str, Node] = {}
        self._order: list[Node] = []
        self._users: dict[str, list[str]] = {}
        self.outputs: dict[str, Ref] = {}
        self.output_roles: dict[str, str] = {}  # output name -> its role (OUTPUT_ROLES)
        self.meta: dict[str, Any] = {}
        self._version = next(_VERSIONS)
        self._at: tuple[Node, bool] | None = None  # insertion point: (anchor, before it)
        self._nx: tuple[int, nx.DiGraph] | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        # a graph read back (the trace cache) is another graph: a version of its own, so that
        # no cache keyed by version takes it for the one it was written from
        self.__dict__.update(state)
        self._version = next(_VERSIONS)
        self._nx = None

    @property
    def version(self) -> int:
        """Changes with every change to the nodes, edges or outputs; unique across graphs."""
        return self._version

    def derive(self) -> Graph:
        """An empty graph with this one's bindings and its own copy of its meta (containers
        copied, caches left out): what a transform builds its output in."""
        g = Graph(self.name, self.bindings)
        g.meta = {
            k: copy.copy(v) if isinstance(v, (dict, list, set)) else v
            for k, v in self.meta.items()
            if not k.startswith("_")
        }
        return g

    # -- construction --------------------------------------------------------------------------
    def add(
        self,
        op: str,
        name: str,
        inputs: Iterable[Ref | Node] = (),
        attrs: dict[str, Any] | None = None,
        outputs: tuple[TensorType, ...] | None = None,
    ) -> Node:
        """Append a node (or place it at the insertion point, see `inserting_before`); its output
        types are inferred from the op table unless given."""
        if name in self._nodes:
            raise GraphError(f"{name}: a node of that name exists already")
        refs = tuple(r if isinstance(r, Ref) else Ref(r.name) for r in inputs)
        for r in refs:
            if r.node not in self._nodes:
                raise GraphError(f"{name}: input {r.node} is not in the graph (yet)")
        node = Node(name, op, refs, dict(attrs or {}), ())
        node.outputs = outputs if outputs is not None else infer(self, node)
        if self._at is None:
            self._order.append(node)
        else:
            self._insert(node)
        self._nodes[name] = node
        self._users[name] = []
        for r in refs:
            self._users[r.node].append(name)
        self._version = next(_VERSIONS)
        return node

    def input(self, name: str, type: TensorType) -> Node:
        """Add a graph input of type `type`."""
        return self.add("input", name, (), {"type": type})

    def param(self, name: str, type: TensorType, **attrs: Any) -> Node:
        """Add a weight of type `type` (attrs such as kind='mlp' as the passes read them)."""
        return self.add("param", name, (), {"type": type, **attrs})

    def set_output(self, name: str, ref: Ref | Node, role: str | None = None) -> None:
        """Make `ref` the graph output `name`; `role` says what it is for (OUTPUT_ROLES)."""
        if role is not None and role not in OUTPUT_ROLES:
            raise GraphError(f"graph output {name}: unknown role {role!r}")
        r = ref if isinstance(ref, Ref) else Ref(ref.name)
        if r.node not in self._nodes:
            raise GraphError(f"graph output {name}: no node {r.node}")
        self.outputs[name] = r
        if role is None:
            self.output_roles.pop(name, None)
        else:
            self.output_roles[name] = role
        self._version = next(_VERSIONS)

    # -- mutation ------------------------------------------------------------------------------
    @contextmanager
    def inserting_before(self, node: Node | str) -> Iterator[None]:
        """Within the block, `add` places nodes just before `node`, in the order they are added."""
        with self._inserting(self._node(node), before=True):
            yield

    @contextmanager
    def inserting_after(self, node: Node | str) -> Iterator[None]:
        """Within the block, `add` places nodes just after `node`, in the order they are added."""
        with self._inserting(self._node(node), before=False):
            yield

    @contextmanager
    def _inserting(self, anchor: Node, before: bool) -> Iterator[None]:
        saved, self._at = self._at, (anchor, before)
        try:
            yield
        finally:
            self._at = saved

    def _insert(self, node: Node) -> None:
        """Place `node` at the insertion point, after every one of its inputs."""
        anchor, before = self._at  # type: ignore[misc]
        if anchor.name not in self._nodes or self._nodes[anchor.name] is not anchor:
            raise GraphError(f"{node.name}: the insertion point {anchor.name} is not in the graph")
        i = self._order.index(anchor) + (0 if before else 1)
        for r in node.inputs:
            try:
                self._order.index(self._nodes[r.node], 0, i)
            except ValueError:
                where = f"before {anchor.name}" if before else f"after {anchor.name}"
                raise GraphError(
                    f"{node.name}: input {r.node} does not come before where it is inserted "
                    f"({where})"
                ) from None
        # a new list: iterators over the old order (a pass walking the graph) are not disturbed
        self._order = [*self._order[:i], node, *self._order[i:]]
        if not before:
            self._at = (node, False)  # the next one goes after this one: the block keeps its order

    def replace_input(self, node: Node | str, old: Ref | Node, new: Ref | Node) -> None:
        """Make `node` read `new` wherever it reads `old` (two nodes: each output by the same
        output of the other); the types must agree and `new` must come before `node`."""
        n = self._node(node)
        pairs = self._pairs(old, new, n.name)
        if not any(r in pairs for r in n.inputs):
            return
        self._check_before({w.node for w in pairs.values()}, n)
        self._rewire(n, pairs)

    def replace_all_uses_with(self, old: Ref | Node, new: Ref | Node) -> None:
        """Every reader of `old` and every graph output of it reads `new` instead (two nodes: each
        output by the same output of the other); `new` itself is left reading `old`, so a node
        inserted after `old` can take its place. The types must agree and `new` must come before
        each reader."""
        pairs = self._pairs(old, new, "")
        if not pairs:
            return
        news = {w.node for w in pairs.values()}
        users: dict[str, Node] = {}
        for name in dict.fromkeys(r.node for r in pairs):
            for u in self._users[name]:
                n = self._nodes[u]
                if u not in news and any(r in pairs for r in n.inputs):
                    users[u] = n
        for n in users.values():
            self._check_before(news, n)
        for n in users.values():
            self._rewire(n, pairs)
        outs = [k for k, r in self.outputs.items() if r in pairs]
        for k in outs:
            self.outputs[k] = pairs[self.outputs[k]]
        if outs:
            self._version = next(_VERSIONS)

    def erase(self, node: Node | str) -> None:
        """Remove a node that nothing reads any more (neither a node nor a graph output)."""
        n = self._node(node)
        users = sorted(set(self._users[n.name]))
        if users:
            raise GraphError(f"{n.name}: cannot erase it, {', '.join(users)} still read it")
        outs = [k for k, r in self.outputs.items() if r.node == n.name]
        if outs:
            raise GraphError(f"{n.name}: cannot erase it, it is graph output {', '.join(outs)}")
        for r in n.inputs:
            if r.node in self._users:  # a subgraph's inputs from outside have no entry
                self._users[r.node].remove(n.name)
        self._order = [m for m in self._order if m is not n]
        del self._nodes[n.name], self._users[n.name]
        self._version = next(_VERSIONS)

    def rename(self, node: Node | str, name: str) -> None:
        """Give a node another name; its readers and the graph outputs follow. Meta that refers
        to nodes by name (scopes, blocks) knows only the names it was given."""
        n = self._node(node)
        if name == n.name:
            return
        if name in self._nodes:
            raise GraphError(f"{n.name}: cannot rename it to {name}, a node of that name exists")
        old = n.name
        for u in set(self._users[old]):
            user = self._nodes[u]
            user.inputs = tuple(Ref(name, r.index) if r.node == old else r for r in user.inputs)
        for r in n.inputs:
            ul = self._users.get(r.node, [])  # a subgraph's inputs from outside have no entry
            ul[:] = [name if x == old else x for x in ul]
        for k, r in self.outputs.items():
            if r.node == old:
                self.outputs[k] = Ref(name, r.index)
        n.name = name
        self._nodes[name] = self._nodes.pop(old)
        self._users[name] = self._users.pop(old)
        self._version = next(_VERSIONS)

    def _node(self, node: Node | str) -> Node:
        n = self[node if isinstance(node, str) else node.name]
        if not isinstance(node, str) and n is not node:
            raise GraphError(f"{node.name}: that node belongs to another graph")
        return n

    def _pairs(self, old: Ref | Node, new: Ref | Node, where: str) -> dict[Ref, Ref]:
        """old ref -> new ref (two nodes: output by output); both exist and their types agree."""
        if isinstance(old, Node) and isinstance(new, Node):
            a, b = self._node(old), self._node(new)
            if len(a.outputs) != len(b.outputs):
                raise GraphError(
                    f"replace {a.name} with {b.name}: {len(a.outputs)} outputs against "
                    f"{len(b.outputs)}"
                )
            pairs = {Ref(a.name, i): Ref(b.name, i) for i in range(len(a.outputs))}
        else:  # a node beside a ref stands for its first output, as in `add`'s inputs
            o = old if isinstance(old, Ref) else Ref(self._node(old).name)
            w = new if isinstance(new, Ref) else Ref(self._node(new).name)
            pairs = {o: w}
        pairs = {o: w for o, w in pairs.items() if o != w}  # replacing a tensor by itself: no-op
        for o, w in pairs.items():
            to, tw = self._type(o), self._type(w)
            if to != tw:
                at = f"{where}: " if where else ""
                raise GraphError(f"{at}cannot replace {_ref(o)} ({to}) with {_ref(w)} ({tw})")
        return pairs

    def _type(self, r: Ref) -> TensorType:
        n = self[r.node]
        if r.index >= len(n.outputs):
            raise GraphError(f"{r.node} has no output {r.index}")
        return n.outputs[r.index]

    def _check_before(self, names: set[str], user: Node) -> None:
        i = self._order.index(user)
        for name in names:
            try:
                self._order.index(self._nodes[name], 0, i)
            except ValueError:
                raise GraphError(f"{user.name}: {name} does not come before it") from None

    def _rewire(self, n: Node, pairs: dict[Ref, Ref]) -> None:
        for r in n.inputs:
            if r in pairs:
                self._users[r.node].remove(n.name)
                self._users[pairs[r].node].append(n.name)
        n.inputs = tuple(pairs.get(r, r) for r in n.inputs)
        self._version = next(_VERSIONS)

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
            return iter(self._order)
        return (n for n in self._order if n.op == op)

    def topo(self) -> list[Node]:
        return list(self._order)

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
        return [n for n in self._order if n.name == prefix or n.name.startswith(dotted)]

    def output_role(self, name: str) -> str | None:
        return self.output_roles.get(name)

    def cache_outputs(self) -> dict[str, Ref]:
        """The outputs a next step reads back as its past (keys and values, a latent, a state)."""
        return {k: r for k, r in self.outputs.items() if self.output_roles.get(k) == CACHE}

    def state_outputs(self) -> dict[str, Ref]:
        """The outputs a next step reads back whole in place of its past (STATE: a conv or a
        recurrent state, constant in the sequence length)."""
        return {k: r for k, r in self.outputs.items() if self.output_roles.get(k) == STATE}

    def carried_outputs(self) -> dict[str, Ref]:
        """Everything a next step reads back: the cache and the states."""
        carried = (CACHE, STATE)
        return {k: r for k, r in self.outputs.items() if self.output_roles.get(k) in carried}

    def params(self) -> list[Node]:
        return [n for n in self._order if n.op == "param"]

    def edges(self) -> Iterator[tuple[str, str, Ref]]:
        for n in self._order:
            for r in n.inputs:
                yield r.node, n.name, r

    def num_edges(self) -> int:
        return sum(len(n.inputs) for n in self._order)

    def to_networkx(self) -> nx.DiGraph:
        """The graph as a networkx DiGraph (built on first use, cached until the next change)."""
        if self._nx is None or self._nx[0] != self.version:
            import networkx as nx  # 0.2 s to import: only when an algorithm needs it

            g = nx.DiGraph()
            g.add_nodes_from((n.name, {"node": n}) for n in self._order)
            g.add_edges_from((src, dst, {"index": r.index}) for src, dst, r in self.edges())
            self._nx = (self.version, g)
        return self._nx[1]

    def subgraph(self, names: Iterable[str]) -> Graph:
        """A new Graph of copies of the named nodes (meta left behind); inputs from outside
        become dangling refs kept as-is."""
        keep = set(names)
        sub = Graph(self.name, self.bindings)
        for n in self._order:
            if n.name in keep:
                c = Node(n.name, n.op, n.inputs, dict(n.attrs), n.outputs)
                sub._nodes[n.name] = c
                sub._order.append(c)
                sub._users[n.name] = [u for u in self._users[n.name] if u in keep]
        return sub

    # -- invariants ----------------------------------------------------------------------------
    def verify(self) -> None:
        """Check every node against its op spec; raise GraphError naming the first bad node."""
        seen: set[str] = set()
        for n in self._order:
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
        args = ", ".join(_ref(r) for r in n.inputs)
        keys = [k for k in n.attrs if k not in ("axes", "kind", "type", "inv_freq")]
        attrs = "".join(f", {k}={_short(n.attrs[k])}" for k in keys)
        return f"%{n.name} : {outs} = {n.op}({args}{attrs})"

    def print(self, bound: bool = False) -> str:
        """One line per node, fx-style: `%name : shape = op(inputs, attrs)`."""
        lines = [self.format_node(n, bound) for n in self._order]
        lines += [f"output {k} = %{r.node}" for k, r in self.outputs.items()]
        return "\n".join(lines)


def _ref(r: Ref) -> str:
    return r.node if r.index == 0 else f"{r.node}[{r.index}]"


def _short(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."
