"""Sharding as data, and the SPMD transform that propagates it through the op table's signatures.

A `Mesh` names axes of devices (`tp`, `ep`, ...; `mb` numbers microbatches, which run one after
another on the same devices). A tensor's `Sharding` says, for each tensor axis, which mesh axes cut
it in blocks (outermost first), and over which mesh axes it holds partial sums still to be added.

`spmd(graph, mesh, seeds)` rewrites a graph into the program of one rank: every split dim becomes a
local dim (`h/8`), and where an op needs its inputs laid out otherwise than they arrive, collective
nodes are inserted. The rules, per node and mesh axis, read only the op's signature letters and its
row's `reduce`, `linear` and `carries` fields:
- a letter an op reads whole for each output (`reduce`) that is split is gathered first;
- the inputs' splits over a mesh axis name candidate letters; the target is the letter a weight is
  split on (weights never move), else one the output keeps (in output order), else a contracted one;
- an input split on another letter is exchanged onto the target by an all-to-all when it has the
  target letter, else gathered; an input holding the target whole is cut locally (a weight or graph
  input is simply loaded that way);
- a target the output does not keep is contracted: the output holds partial sums (a contraction, or a
  weight read by a gather such as a vocab-parallel embedding), and a summand input (a bias) is held
  by one rank only; any other op gathers instead;
- partial sums pass through an op's `linear` groups untouched; anywhere else they are reduced:
  reduce-scattered onto the target's axis when the op splits over the same mesh axis, or onto the
  token axis on a mesh axis with sequence parallelism, else all-reduced. A reduction is done once and
  reused by every later consumer.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from graphllm.errors import GraphError
from graphllm.ir import CACHE, STATE, TOKEN_ROLES, Dim, Graph, Node, Ref, TensorType
from graphllm.ir.signature import ELLIPSIS
from graphllm.ops import MOVEMENT, OPS, SOURCE, linear_groups

Split = tuple[str, int]  # (mesh axis, blocks): a rank holds block coord // (size / blocks)
Relation = Callable[[str, str], bool]  # letters one split cuts alike


class _cached:
    """functools.cached_property without its lock (Python 3.11 takes one on every first read):
    a plan builds tens of thousands of shardings, each asked once. The value lands in the
    instance's __dict__, where later reads find it before this descriptor."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn, self.name = fn, fn.__name__

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass(frozen=True)
class Mesh:
    """Named axes of ranks, outermost first. `mb` (microbatches) is not a device axis."""

    axes: tuple[tuple[str, int], ...]

    @_cached
    def _sizes(self) -> dict[str, int]:
        # the layout rules ask a mesh its sizes and names for every node: built once
        return dict(self.axes)

    def size(self, name: str) -> int:
        return self._sizes.get(name, 1)

    @_cached
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def devices(self) -> int:
        return math.prod(s for n, s in self.axes if n != "mb")

    def coords(self) -> Iterator[dict[str, int]]:
        """Every rank's coordinates (microbatches included), in row-major order."""
        for c in itertools.product(*(range(s) for _, s in self.axes)):
            yield dict(zip(self.names, c))

    def stride(self, name: str) -> int:
        """Distance in device ranks between neighbours along a mesh axis (inner axes vary fastest)."""
        inner = self.names[self.names.index(name) + 1 :]
        return math.prod(self.size(n) for n in inner if n != "mb")


@dataclass(frozen=True)
class Sharding:
    """Per tensor axis, its splits (outermost first); and the mesh axes holding partial sums."""

    axes: tuple[tuple[Split, ...], ...]
    partial: frozenset[str] = frozenset()

    @classmethod
    def whole(cls, rank: int) -> Sharding:
        return cls(((),) * rank)

    @_cached
    def _axis_of(self) -> dict[str, int]:
        # a plan partitions one graph hundreds of times and asks each sharding this for every
        # mesh axis of every node: looked up once (the first axis a mesh axis cuts wins)
        out: dict[str, int] = {}
        for i, splits in enumerate(self.axes):
            for m, _ in splits:
                out.setdefault(m, i)
        return out

    def axis_of(self, mesh: str) -> int | None:
        """The tensor axis split over `mesh`, if any."""
        return self._axis_of.get(mesh)

    @_cached
    def _blocks(self) -> tuple[int, ...]:
        return tuple(math.prod(p for _, p in splits) for splits in self.axes)

    def blocks(self, i: int) -> int:
        return self._blocks[i]

    def split(self, i: int, s: Split) -> Sharding:
        """Cut axis `i` further (the new split is innermost)."""
        axes = list(self.axes)
        axes[i] = (*axes[i], s)
        return Sharding(tuple(axes), self.partial)

    def unsplit(self, i: int, mesh: str, where: str) -> Sharding:
        """Gather axis `i` over `mesh`; only the innermost split of an axis can be gathered."""
        if not self.axes[i] or self.axes[i][-1][0] != mesh:
            raise GraphError(
                f"{where}: axis {i} is split {self.axes[i]}; cannot gather {mesh} first"
            )
        axes = list(self.axes)
        axes[i] = axes[i][:-1]
        return Sharding(tuple(axes), self.partial)

    def with_partial(self, mesh: str, on: bool) -> Sharding:
        p = self.partial | {mesh} if on else self.partial - {mesh}
        return Sharding(self.axes, frozenset(p))


def local_dim(d: Dim, blocks: int, bindings: dict[str, float], where: str) -> Dim:
    """The block of `d` one rank holds; symbolic local dims get their bindings."""
    if blocks == 1:
        return d
    name = f"{d.name}/{blocks}"
    if d.size is not None:
        if d.size % blocks:
            raise GraphError(f"{where}: {blocks} blocks do not divide {d.name}={d.size}")
        return Dim(name, d.role, d.size // blocks, d.positions)
    whole = bindings[d.name]
    if float(whole).is_integer() and whole % blocks and d.role in ("batch", "token"):
        raise GraphError(f"{where}: {blocks} blocks do not divide {d.name}={int(whole)}")
    # exact: an int block, or a Fraction (a rank's share of balanced routing's slots), so the
    # rank's FLOP counts stay exact (cost.py)
    bindings[name] = whole // blocks if whole % blocks == 0 else Fraction(whole) / blocks
    return Dim(name, d.role, positions=d.positions)  # a block of the whole axis's range


def _local_shape(shape: tuple[int, ...], sh: Sharding, where: str) -> tuple[int, ...]:
    """A concrete whole shape cut as `sh` cuts its axes (the traced rows' `shape` attrs)."""
    if not sh._axis_of:
        return tuple(shape)
    if len(shape) != len(sh.axes) or any(n % b for n, b in zip(shape, sh._blocks)):
        raise GraphError(f"{where}: shape {tuple(shape)} does not cut as {sh.axes}")
    return tuple(n // b for n, b in zip(shape, sh._blocks))


def local_type(t: TensorType, sh: Sharding, bindings: dict[str, float], where: str) -> TensorType:
    if not sh._axis_of:  # held whole: the type as it is
        return t
    blocks = sh._blocks
    dims = tuple(local_dim(d, blocks[i], bindings, where) for i, d in enumerate(t.dims))
    return TensorType(dims, t.dtype)


# -- the transform -----------------------------------------------------------------------------
@dataclass
class _Arg:
    """One input of the node being laid out, as it stands in the rank's program so far."""

    ref: Ref | None  # None: a graph input or weight not placed yet (it takes any layout)
    sh: Sharding
    gtype: TensorType  # the whole tensor's type
    letters: list[str]  # the letter class of each axis
    src: str  # the source graph's tensor (node name)
    param: bool
    integer: bool

    def pos(self, x: str, rel: Relation) -> int | None:
        """The first axis cut by the split that cuts letter `x`."""
        return next((i for i, y in enumerate(self.letters) if rel(x, y)), None)


class _Related:
    """Letters one split cuts alike: equal, or paired in the op's row (`carries`)."""

    def __init__(self, carries: tuple[tuple[str, str], ...]) -> None:
        self.pairs = {frozenset(p) for p in carries}

    def __call__(self, x: str, y: str) -> bool:
        return x == y or frozenset((x, y)) in self.pairs


@functools.cache
def _related(carries: tuple[tuple[str, str], ...]) -> Relation:
    """The relation of an op row's `carries`; plain equality (a C call) for the many rows with
    none, since the layout rules ask it for every letter pair of every node."""
    return _Related(carries) if carries else operator.eq


def operand_letters(operand: tuple, rank: int) -> list[str]:
    """The lead letter of each axis: a group `(h e)` is split as its first letter."""
    out: list[str] = []
    for ax in operand:
        if ax == ELLIPSIS:
            out += [f"...{k}" for k in range(rank - (len(operand) - 1))]
        else:
            out.append(ax[0] if isinstance(ax, tuple) else ax)
    return out


@functools.cache
def _letters(operand: tuple, rank: int) -> list[str]:
    # read only (the layout rules never change a letter list), so one list serves every node
    return operand_letters(operand, rank)


def _output_keys(operand: tuple, rank: int) -> list[str | None]:
    """For each output axis the attrs['axes'] key that may define it (a letter or `(h e)`)."""
    out: list[str | None] = []
    for ax in operand:
        if ax == ELLIPSIS:
            out += [None] * (rank - (len(operand) - 1))
        else:
            out.append("(" + " ".join(ax) + ")" if isinstance(ax, tuple) else ax)
    return out


class _SPMD:
    def __init__(
        self,
        graph: Graph,
        mesh: Mesh,
        seeds: dict[str, Sharding],
        scatter: frozenset[str],
        keep_split: frozenset[str],
        checked: bool = True,
    ) -> None:
        self.src, self.mesh, self.seeds = graph, mesh, seeds
        self.checked = checked  # each node's local types against the op table's, as it is added
        self.scatter = scatter  # mesh axes with sequence parallelism: reduce-scatter on tokens
        self.keep_split = keep_split  # roles whose splits graph outputs keep (tokens, batch)
        self.g = graph.derive()
        self.val: dict[Ref, tuple[Ref, Sharding]] = {}
        self.memo: dict[tuple, tuple[Ref, Sharding]] = {}
        self.reduced: dict[tuple[Ref, str], tuple[Ref, Sharding]] = {}
        self.sliced: dict[Ref, tuple[tuple[str, int], tuple[Ref, Sharding]]] = {}
        self._types: dict[tuple[TensorType, tuple[int, ...]], TensorType] = {}

    def _local(self, t: TensorType, sh: Sharding, where: str) -> TensorType:
        """`local_type` of this program (one bindings): a collective asks it for the same
        tensor and layout as the nodes around it; a failure is raised afresh, naming `where`."""
        key = (t, sh._blocks)  # the type depends on the blocks of each axis alone
        hit = self._types.get(key)
        if hit is None:
            hit = self._types[key] = local_type(t, sh, self.g.bindings, where)
        return hit

    # -- values ------------------------------------------------------------------------------
    def _arg(self, n: Node, i: int, letters: list[str]) -> _Arg:
        r = n.inputs[i]
        src = self.src[r.node]
        gtype = self.src.type_of(r)
        if r in self.val:
            ref, sh = self.val[r]
        else:  # a source: its seed, or whole; it may still take further splits
            ref = None
            sh = self.seeds.get(r.node) or Sharding.whole(gtype.rank)
        weight = src.op == "param" or r.node in self.seeds  # a seeded view of a weight's rows
        return _Arg(ref, sh, gtype, letters, r.node, weight, gtype.dtype == "int64")

    def _place(self, a: _Arg) -> None:
        """Put a source into the rank's program with the layout decided so far."""
        if a.ref is not None:
            return
        src = self.src[a.src]
        t = self._local(a.gtype, a.sh, a.src)
        attrs = {**src.attrs, "type": t}
        if "shape" in attrs and src.op != "param":  # a traced creation's concrete shape
            attrs["shape"] = _local_shape(attrs["shape"], a.sh, src.name)
        node = self.g.add(src.op, src.name, (), attrs)
        node.meta["sharding"] = (a.sh,)
        a.ref = Ref(node.name)
        self.val[a.ref] = (a.ref, a.sh)

    def _ltype(self, a: _Arg, sh: Sharding) -> TensorType:
        return self._local(a.gtype, sh, a.src)

    # -- collectives -------------------------------------------------------------------------
    def _collective(self, op: str, a: _Arg, m: str, sh: Sharding, **attrs: Any) -> None:
        self._place(a)
        assert a.ref is not None
        key = (a.ref, op, m, tuple(sorted(attrs.items())))
        hit = self.memo.get(key)
        if hit is None:
            before, after = self._ltype(a, a.sh).dims, self._ltype(a, sh).dims
            dims = tuple((i, d) for i, (b, d) in enumerate(zip(before, after)) if b != d)
            base = a.ref.node if a.ref.index == 0 else f"{a.ref.node}.{a.ref.index}"
            name = f"{base}.{op}"
            k = 1
            while name in self.g:
                name = f"{base}.{op}.{m}" if k == 1 else f"{base}.{op}.{m}{k}"
                k += 1
            full = {"mesh": m, "group": self.mesh.size(m), **attrs}
            if dims:
                full["axes"] = {f"@{i}": d for i, d in dims}
            node = self.g.add(op, name, (a.ref,), full)
            node.meta["sharding"] = (sh,)
            hit = self.memo[key] = (Ref(name), sh)
        a.ref, a.sh = hit

    def _gather(self, a: _Arg, j: int, m: str) -> None:
        if a.ref is None:  # a source not yet placed: load it whole on this mesh axis
            axes = list(a.sh.axes)
            axes[j] = tuple(s for s in axes[j] if s[0] != m)
            a.sh = Sharding(tuple(axes), a.sh.partial)
            return
        if a.ref in self.sliced and self.sliced[a.ref][0] == (m, j):  # undo a local cut
            a.ref, a.sh = self.sliced[a.ref][1]
            return
        inner = self._innermost(a, j, m)
        self._collective("all_gather", a, m, a.sh.unsplit(j, m, a.src), axis=j)
        for q, blocks in reversed(inner):
            self._cut(a, q, j, blocks)

    def _innermost(self, a: _Arg, j: int, m: str) -> list[Split]:
        """Gather the splits of axis `j` inside `m` (to cut again after), so that `m` is the
        innermost: a collective over `m` then acts on contiguous blocks."""
        inner = []
        while a.sh.axes[j][-1][0] != m:
            q = a.sh.axes[j][-1]
            self._collective("all_gather", a, q[0], a.sh.unsplit(j, q[0], a.src), axis=j)
            inner.append(q)
        return inner

    def _all_to_all(self, a: _Arg, m: str, j: int, t: int, blocks: int) -> None:
        inner = self._innermost(a, j, m)
        sh = a.sh.unsplit(j, m, a.src).split(t, (m, blocks))
        self._collective("all_to_all", a, m, sh, split_axis=t, concat_axis=j)
        for q, b in reversed(inner):
            self._cut(a, q, j, b)

    def _cut(self, a: _Arg, m: str, t: int, blocks: int) -> None:
        """Hold block `t` of an axis every rank holds whole: free (a source loads it so)."""
        if a.ref is None:
            a.sh = a.sh.split(t, (m, blocks))
            return
        before = (a.ref, a.sh)
        self._collective("shard_slice", a, m, a.sh.split(t, (m, blocks)), axis=t)
        assert a.ref is not None
        self.sliced[a.ref] = ((m, t), before)

    def _reduce(self, a: _Arg, m: str, onto: int | None) -> None:
        """Add up partial sums over `m`: scattered onto axis `onto`, or onto the tokens under
        sequence parallelism, else all-reduced. Later consumers reuse the result."""
        assert a.ref is not None
        if onto is None and m in self.scatter:
            n = self.mesh.size(m)
            for i, d in enumerate(a.gtype.dims):
                size = self._ltype(a, a.sh).dims[i]
                whole = size.size if size.size is not None else self.g.bindings[size.name]
                if d.role == "token" and a.sh.axis_of(m) is None and whole % n == 0:
                    onto = i
                    break
        ref = a.ref
        if onto is None:
            self._collective("all_reduce", a, m, a.sh.with_partial(m, False))
        else:
            sh = a.sh.with_partial(m, False).split(onto, (m, self.mesh.size(m)))
            self._collective("reduce_scatter", a, m, sh, axis=onto)
        self.reduced[(ref, m)] = (a.ref, a.sh)

    # -- one node ----------------------------------------------------------------------------
    def node(self, n: Node) -> None:
        spec = OPS[n.op]
        if spec.category == SOURCE:
            return
        if n.name in self.seeds:  # only a view of a weight's rows takes a seed of its own
            if not self._loads_rows(n):
                raise GraphError(f"{n.name} ({n.op}): a seed on a node that is no weight's view")
            return
        rel = _related(spec.carries)
        ins, outs, flat = self._node_letters(n, spec)
        args = [self._arg(n, i, ins[i]) for i in range(len(n.inputs))]
        targets = {m: self._decide(n, spec, args, flat, rel, m) for m in self.mesh.names}
        for a in args:
            self._place(a)
        partial = frozenset(m for m, (_, p) in targets.items() if p)
        cuts = any(t is not None for t, _ in targets.values())
        out_sh = []
        for k, letters in enumerate(outs):
            dims = n.outputs[k].dims
            if not cuts:  # no mesh axis cuts a letter: every output axis is whole
                out_sh.append(Sharding(((),) * len(letters), partial))
                continue
            axes = tuple(
                self._out_splits(args, targets, rel, y, dims[j]) for j, y in enumerate(letters)
            )
            out_sh.append(Sharding(axes, partial))
        self._emit(n, args, out_sh)

    def _node_letters(self, n: Node, spec: Any) -> tuple[list, list, list[str]]:
        """The letters of a source node's inputs and outputs, and the outputs' flattened: the
        same in every program partitioned from one graph, so kept with it (plan partitions one
        graph for every layout)."""
        cached = self.src.meta.get("_spmd_letters")
        if cached is None or cached[0] != self.src.version:
            cached = self.src.meta["_spmd_letters"] = (self.src.version, {})
        hit = cached[1].get(n.name)
        if hit is None:
            sig = spec.signature
            ins = [_letters(op, t.rank) for op, t in zip(sig.inputs, self.src.input_types(n))]
            outs = [_letters(op, t.rank) for op, t in zip(sig.outputs, n.outputs)]
            hit = cached[1][n.name] = (ins, outs, [x for o in outs for x in o])
        return hit

    def _loads_rows(self, n: Node) -> bool:
        """A seeded view of a weight's rows (Mamba2's in_proj read per group) read straight
        from the checkpoint: the rank loads its block of the viewed rows (param attrs `rows`,
        applied before the cut), so it holds 1/tp of the weight and no view runs."""
        if not (OPS[n.op].view and len(n.inputs) == 1 and "index" in n.attrs):
            return False
        p = self.src[n.inputs[0].node]
        if p.op != "param" or Ref(p.name) in self.val:
            return False
        sh = self.seeds[n.name]
        t = local_type(n.out, sh, self.g.bindings, n.name)
        node = self.g.add(
            "param", p.name, (), {**p.attrs, "type": t, "rows": list(n.attrs["index"])}
        )
        node.meta["sharding"] = (sh,)
        self.val[Ref(p.name)] = self.val[Ref(n.name)] = (Ref(p.name), sh)
        return True

    def _out_splits(
        self,
        args: list[_Arg],
        targets: dict[str, tuple[str | None, bool]],
        rel: Relation,
        y: str,
        d: Dim,
    ) -> tuple[Split, ...]:
        """The splits of the output axis of letter `y` (dim `d`): each mesh axis whose target
        cuts `y`, as it cuts an input axis of a letter related to it."""
        # the mesh axes whose target `y` is related to: most output letters have none
        live = {m: t for m, (t, _) in targets.items() if t is not None and rel(y, t)}
        if not live:
            return ()
        splits: list[Split] = []
        for a in args:
            for i, x in enumerate(a.letters):
                for s in a.sh.axes[i]:
                    t = live.get(s[0])
                    if t is None or not rel(x, t):
                        continue
                    if s[0] not in [q for q, _ in splits]:
                        splits.append(self._carry(s, d, x != y))
        if len(splits) > 1 and any(x != y for a in args for x in a.letters if rel(x, y)):
            # a carried axis (MoE slots) takes splits from several letters: name its blocks in
            # mesh order (their order within a rank is the op's own)
            splits.sort(key=lambda q: self.mesh.names.index(q[0]))
        return tuple(splits)

    def _carry(self, s: Split, d: Dim, carried: bool) -> Split:
        """A split carried to another letter (KV heads -> query heads) cuts it as finely as the
        mesh axis allows."""
        m, blocks = s
        n = self.mesh.size(m)
        if carried and blocks < n and (d.size is None or d.size % n == 0):
            return (m, n)
        return s

    def _decide(
        self,
        n: Node,
        spec: Any,
        args: list[_Arg],
        out_letters: list[str],
        rel: Relation,
        m: str,
    ) -> tuple[str | None, bool]:
        """Lay the inputs out over mesh axis `m`: (the letter it cuts, whether partial). Each
        round settles one thing (a reduced letter gathered, partial sums reduced) and looks again."""
        if not any(m in a.sh._axis_of or m in a.sh.partial for a in args):
            return None, False  # nothing over `m` to lay out: what the first round finds
        for _ in range(8):
            for a in args:  # a partial sum reduced for an earlier consumer is reused
                if m in a.sh.partial and (a.ref, m) in self.reduced:
                    a.ref, a.sh = self.reduced[(a.ref, m)]
            splits = [(i, a.sh.axis_of(m)) for i, a in enumerate(args)]
            splits = [(i, j) for i, j in splits if j is not None]
            partial = [i for i, a in enumerate(args) if m in a.sh.partial]
            if not splits and not partial:
                return None, False
            red = [(i, j) for i, j in splits if self._whole(spec, args[i], j, out_letters)]
            if red:
                for i, j in red:
                    self._gather(args[i], j, m)
                continue
            target, blocks = self._target(args, splits, out_letters, rel, m)
            kept = target is not None and any(rel(y, target) for y in out_letters)
            if partial:
                if self._settle_partial(spec, args, partial, target, kept, rel, m):
                    return None, True
                continue
            assert target is not None
            holds_param = any(args[i].param and rel(args[i].letters[j], target) for i, j in splits)
            if not kept and not (spec.is_contraction or holds_param):
                for i, j in splits:
                    self._gather(args[i], j, m)
                continue
            for i, a in enumerate(args):
                self._onto(n, spec, i, a, target, blocks, kept, rel, m)
            return target, not kept
        raise GraphError(f"{n.name} ({n.op}): no layout of its inputs over mesh axis {m}")

    @staticmethod
    def _whole(spec: Any, a: _Arg, j: int, out_letters: list[str]) -> bool:
        """Whether input axis j must be whole: a letter the op reduces, or positions a
        sequence op (a causal conv's window, a recurrence) reads in order into others of its
        output (a sequence-parallel stream reaching a traced Mamba mixer no plan cuts)."""
        x = a.letters[j]
        if x in spec.reduce:
            return True
        return (
            spec.relation is not None
            and a.gtype.dims[j].role in TOKEN_ROLES
            and x not in out_letters
        )

    def _settle_partial(
        self,
        spec: Any,
        args: list[_Arg],
        partial: list[int],
        target: str | None,
        kept: bool,
        rel: Relation,
        m: str,
    ) -> bool:
        """Inputs holding partial sums over `m`: True when they pass through one of the op's
        linear groups as they are; else they are reduced (scattered onto the target's axis when
        the output keeps it)."""
        if target is None:
            group = self._passes_partial(spec, args, partial)
            if group is not None:
                for i in group:
                    if m not in args[i].sh.partial:  # a source: one rank holds it
                        args[i].sh = args[i].sh.with_partial(m, True)
                return True
        for i in partial:
            t = args[i].pos(target, rel) if kept else None
            self._reduce(args[i], m, t)
        return False

    def _onto(
        self,
        n: Node,
        spec: Any,
        i: int,
        a: _Arg,
        target: str,
        blocks: int,
        kept: bool,
        rel: Relation,
        m: str,
    ) -> None:
        """Bring input `i` onto the split of letter `target` over `m`: exchanged (all-to-all) or
        gathered off another letter, then cut locally; a summand of a contraction whose target
        is contracted is held by one rank."""
        j = a.sh.axis_of(m)
        if j is not None and rel(a.letters[j], target):
            return  # already there
        t = a.pos(target, rel)
        if j is not None and t is not None and a.ref is not None:
            self._all_to_all(a, m, j, t, blocks)
            return
        if j is not None:
            self._gather(a, j, m)
        if t is not None:
            self._cut(a, m, t, blocks)
        elif not kept and self._summand(spec, i):
            if a.ref is not None:
                raise GraphError(f"{n.name} ({n.op}): input {i} would be added per rank")
            a.sh = a.sh.with_partial(m, True)

    def _target(
        self,
        args: list[_Arg],
        splits: list[tuple[int, int]],
        out_letters: list[str],
        rel: Relation,
        m: str,
    ) -> tuple[str | None, int]:
        """The letter mesh axis `m` cuts: a weight's, else one the output keeps, in its order."""
        if not splits:
            return None, 1
        cands = [(i, j) for i, j in splits if args[i].param] or splits
        classes = [args[i].letters[j] for i, j in cands]
        kept = [c for y in out_letters for c in classes if y == c]  # the letter itself first
        kept += [c for y in out_letters for c in classes if rel(y, c)]
        target = kept[0] if kept else classes[0]
        i, j = cands[classes.index(target)]
        blocks = next(p for q, p in args[i].sh.axes[j] if q == m)
        return target, blocks

    @staticmethod
    def _passes_partial(spec: Any, args: list[_Arg], partial: list[int]) -> tuple[int, ...] | None:
        """A linear group holding every partial input whose other members are unplaced sources
        (which then hold their value on one rank only)."""
        for group in linear_groups(spec, [a.integer for a in args]):
            if set(partial) <= set(group) and all(
                i in partial or args[i].ref is None for i in group
            ):
                return group
        return None

    @staticmethod
    def _summand(spec: Any, i: int) -> bool:
        """An input of a contraction none of whose axes is contracted: added, not multiplied."""
        sig = spec.signature
        letters = {x for ax in sig.inputs[i] for x in (ax if isinstance(ax, tuple) else (ax,))}
        return spec.is_contraction and letters <= sig.output_letters()

    def _emit(self, n: Node, args: list[_Arg], out_sh: list[Sharding]) -> None:
        spec = OPS[n.op]
        attrs = dict(n.attrs)
        local_outs = [self._local(t, sh, n.name) for t, sh in zip(n.outputs, out_sh)]
        if "axes" in attrs:  # dims the signature takes from attrs: their local blocks
            axes = dict(attrs["axes"])
            for op, t, lt in zip(spec.signature.outputs, n.outputs, local_outs):
                for key, d, ld in zip(_output_keys(op, t.rank), t.dims, lt.dims):
                    if key in axes and axes[key] == d:
                        axes[key] = ld
            attrs["axes"] = axes
        if "sizes" in attrs:
            attrs["sizes"] = [int(lt.dims[-1].size) for lt in local_outs]  # type: ignore[arg-type]
        if "shapes" in attrs:  # a traced op's concrete output shapes: the rank's blocks
            attrs["shapes"] = [
                _local_shape(s, sh, n.name) for s, sh in zip(attrs["shapes"], out_sh)
            ]
            attrs["shape"] = attrs["shapes"][0]
        refs = [a.ref for a in args]
        if not self.checked:  # the caller verifies the whole program after (partition)
            node = self.g.add(n.op, n.name, refs, attrs, tuple(local_outs))  # type: ignore[arg-type]
        else:
            node = self.g.add(n.op, n.name, refs, attrs)  # type: ignore[arg-type]
        if node.outputs != tuple(local_outs):
            got = ", ".join(str(t) for t in node.outputs)
            want = ", ".join(str(t) for t in local_outs)
            raise GraphError(f"{n.name} ({n.op}): local outputs {got}, the layout gives {want}")
        node.meta["sharding"] = tuple(out_sh)
        for k, sh in enumerate(out_sh):
            self.val[Ref(n.name, k)] = (Ref(n.name, k), sh)

    # -- graph outputs -----------------------------------------------------------------------
    def finish(self) -> Graph:
        for name, r in self.src.outputs.items():
            ref, sh = self.val[r]
            a = _Arg(ref, sh, self.src.type_of(r), [], r.node, False, False)
            for m in sorted(sh.partial, key=self.mesh.names.index):
                self._collective("all_reduce", a, m, a.sh.with_partial(m, False))
            # a rank keeps its own block of the cache and of the conv and recurrent states, as
            # engines do (a gather of either would be a collective every step that none runs)
            if self.src.output_role(name) not in (CACHE, STATE):
                for j, d in enumerate(a.gtype.dims):
                    if d.role in self.keep_split:
                        continue
                    for m, _ in reversed(a.sh.axes[j]):
                        self._gather(a, j, m)
            assert a.ref is not None
            self.g.set_output(name, a.ref, self.src.output_role(name))
        return self.g


def spmd(
    graph: Graph,
    mesh: Mesh,
    seeds: dict[str, Sharding],
    scatter: frozenset[str] = frozenset(),
    keep_split: frozenset[str] = frozenset({"batch", *TOKEN_ROLES}),
    checked: bool = True,
) -> Graph:
    """The program of one rank of `mesh` for `graph`, its sources laid out as `seeds` say.
    `checked`: infer each node's outputs from the op table as it is added and compare them with
    the layout's local types; False for a caller that verifies the program it gets (partition),
    which checks the same thing once."""
    t = _SPMD(graph, mesh, seeds, scatter, keep_split, checked)
    for n in graph.nodes():
        t.node(n)
    return t.finish()


def hoist_gathers(g: Graph) -> Graph:
    """all_gather(copy(x)) -> copy(all_gather(x)) where a single-use copy expands x (the GQA head
    repeat) and the gathered axis passes through it: the smaller tensor crosses the wire. In place;
    returns `g`."""
    swaps: list[tuple[Node, Node]] = []  # (the copy, the all_gather reading it)
    for a in g.nodes():
        if not OPS[a.op].gathers:
            continue
        r = g[a.inputs[0].node]
        spec = OPS[r.op]
        if (
            spec.category != MOVEMENT
            or spec.view
            or len(r.inputs) != 1
            or len(g.users(r)) != 1
            or r.out.numel(g.bindings) <= g.type_of(r.inputs[0]).numel(g.bindings)
        ):
            continue
        sig = spec.signature
        ins = operand_letters(sig.inputs[0], g.type_of(r.inputs[0]).rank)
        outs = operand_letters(sig.outputs[0], r.out.rank)
        x = outs[a.attrs["axis"]]
        if x in ins and x not in r.attrs.get("axes", {}):
            swaps.append((r, a))
    for r, a in swaps:
        src = r.inputs[0]
        sig = OPS[r.op].signature
        j = a.attrs["axis"]
        x = operand_letters(sig.outputs[0], r.out.rank)[j]
        j_in = operand_letters(sig.inputs[0], g.type_of(src).rank).index(x)
        attrs = {**a.attrs, "axis": j_in, "axes": {f"@{j_in}": a.attrs["axes"][f"@{j}"]}}
        name = f"{src.node}.all_gather"
        with g.inserting_before(r):
            gathered = g.add(a.op, f"{a.name}.hoisted" if name in g else name, [src], attrs)
            moved = g.add(r.op, f"{r.name}.hoisted", [gathered], r.attrs)
        sh = g[src.node].meta["sharding"][src.index]
        gathered.meta["sharding"] = (sh.unsplit(j_in, a.attrs["mesh"], a.name),)
        moved.meta["sharding"] = a.meta["sharding"]
        g.replace_all_uses_with(a, moved)
        g.erase(a)
        g.erase(r)
        g.rename(moved, r.name)  # the copy keeps its name, and the gather its own when it can
        if gathered.name != name:
            g.rename(gathered, a.name)
    return g


def block_index(sh_axis: tuple[Split, ...], mesh: Mesh, c: dict[str, int]) -> int:
    """Which block of an axis rank `c` holds: its splits read outermost first."""
    idx = 0
    for m, blocks in sh_axis:
        idx = idx * blocks + c[m] // (mesh.size(m) // blocks)
    return idx
