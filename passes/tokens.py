"""The `tokens` pass: which ops mix information across token positions, and exactly which input
positions each output position depends on.

Both answers are derived from the op table's signatures and the roles of the dims bound to them;
no op or node is listed by name.

Mixing rule, for one op: an output value at some positions reads input values at others when
  1. a position axis of an input is absent from the outputs (contracted or reduced away: PV), or
  2. the op reads a position axis in full for each output value (`reduce`: softmax over keys), or
  3. an output has two position axes that no single input has together (Q K^T pairs t with s).
Letters that a row declares `same_position` (KV concat, MoE slots) index one absolute position.

Dependence sets: every position axis is placed on the absolute positions its dim declares
(`Dim.positions`: past 0..P-1, new tokens P..S-1). A tensor with one position axis carries, per
position, the set of input positions it depends on; one with two (scores, t x s) carries a row
set per t, a column set per s and the interval of s each t is allowed to see (narrowed by a row's
`relation`, e.g. the mask). Sets are exact bit matrices for short sequences, and intervals (their
hull, exact for causal and window masks, whose sets are contiguous) for long ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphllm.errors import PassError
from graphllm.ir import TOKEN_ROLES, Dim, Graph, Node
from graphllm.limits import require_memory
from graphllm.ops import OPS, SOURCE, bind_node
from graphllm.passes.registry import register

EXACT_LIMIT = 256  # positions up to which sets are exact bit matrices
_BIG = np.iinfo(np.int64).max // 4


# -- the mixing verdict ------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    mixes: bool
    reason: str


_LETTERS_CACHE: dict[tuple, tuple[list[list[str]], list[list[str]]]] = {}


def position_letters(graph: Graph, node: Node) -> tuple[list[list[str]], list[list[str]]]:
    """Canonical position letters of each input and output operand, in axis order."""
    # the same op on the same types recurs in every layer; the key holds all this function reads
    key = (
        node.op,
        tuple(graph.input_types(node)),
        tuple(sorted(node.attrs.get("axes", {}).items())),
    )
    hit = _LETTERS_CACHE.get(key)
    if hit is None:
        if len(_LETTERS_CACHE) > 50_000:
            _LETTERS_CACHE.clear()
        hit = _LETTERS_CACHE[key] = _position_letters(graph, node)
    return hit


def _position_letters(graph: Graph, node: Node) -> tuple[list[list[str]], list[list[str]]]:
    spec = OPS[node.op]
    env, ell = bind_node(graph, node)
    canon = {x: grp[0] for grp in spec.same_position for x in grp}
    axes = node.attrs.get("axes", {})

    in_ellipsis = ["..." + d.name for d in ell if d.role in TOKEN_ROLES]

    def letters(operand: tuple) -> list[str]:
        out = []
        for ax in operand:
            if ax == "...":
                out += in_ellipsis
                continue
            d: Dim | None = (env.get(ax) or axes.get(ax)) if isinstance(ax, str) else None
            if d is not None and d.role in TOKEN_ROLES:
                out.append(canon.get(ax, ax))
        return out

    sig = spec.signature
    return [letters(o) for o in sig.inputs], [letters(o) for o in sig.outputs]


def mixing_verdict(
    graph: Graph, node: Node, letters: tuple[list[list[str]], list[list[str]]] | None = None
) -> Verdict:
    """Whether `node` mixes token positions, and why (from its signature alone)."""
    spec = OPS[node.op]
    if spec.category == SOURCE:
        return Verdict(False, "a graph input or weight")
    ins, outs = letters or position_letters(graph, node)
    out_letters = {x for o in outs for x in o}
    for i, letters in enumerate(ins):
        for x in letters:
            if x not in out_letters:
                return Verdict(True, f"contracts position axis {x} of input {i} ({spec.sig})")
    for x in spec.reduce:
        if any(x in o for o in outs):  # a reduced letter that is a position axis here
            return Verdict(True, f"each output reads the whole position axis {x} ({spec.sig})")
    for o in outs:
        if len(set(o)) > 1 and not any(set(o) <= set(i) for i in ins):
            pair = " and ".join(o)
            return Verdict(True, f"pairs positions {pair} taken from different inputs ({spec.sig})")
    return Verdict(False, "each output value reads its own positions only")


# -- dependence sets -----------------------------------------------------------------------------
class Deps:
    """Per-position sets of input positions: an (N, N) bit matrix, or intervals [lo, hi]."""

    def __init__(self, n: int, exact: bool) -> None:
        self.n, self.exact = n, exact
        if exact:
            self.m = np.zeros((n, n), dtype=bool)
        else:
            self.lo = np.full(n, _BIG, dtype=np.int64)
            self.hi = np.full(n, -_BIG, dtype=np.int64)

    @classmethod
    def identity(cls, n: int, exact: bool, support: np.ndarray) -> Deps:
        d = cls(n, exact)
        idx = np.nonzero(support)[0]
        if exact:
            d.m[idx, idx] = True
        else:
            d.lo[idx] = d.hi[idx] = idx
        return d

    def copy(self) -> Deps:
        d = Deps.__new__(Deps)
        d.n, d.exact = self.n, self.exact
        if self.exact:
            d.m = self.m.copy()
        else:
            d.lo, d.hi = self.lo.copy(), self.hi.copy()
        return d

    def union(self, other: Deps) -> Deps:
        if other is self or other.is_empty():
            return self
        if self.is_empty():
            return other
        d = self.copy()
        if self.exact:
            d.m |= other.m
        else:
            d.lo, d.hi = np.minimum(self.lo, other.lo), np.maximum(self.hi, other.hi)
        return d

    def is_empty(self) -> bool:
        return not self.m.any() if self.exact else bool((self.hi < self.lo).all())

    def keep(self, rows: np.ndarray) -> Deps:
        """Empty the sets of positions where `rows` is False."""
        d = self.copy()
        if self.exact:
            d.m[~rows] = False
        else:
            d.lo[~rows], d.hi[~rows] = _BIG, -_BIG
        return d

    def range_union(self, lo: np.ndarray, hi: np.ndarray) -> Deps:
        """Position t gets the union of this object's sets over positions lo[t]..hi[t]."""
        n = self.n
        lo_c, hi_c = np.clip(lo, 0, n), np.clip(hi, -1, n - 1)
        empty = hi_c < lo_c
        d = Deps(n, self.exact)
        if self.exact:
            cum = np.vstack([np.zeros((1, n), np.int32), np.cumsum(self.m, axis=0, dtype=np.int32)])
            a, b = np.where(empty, 0, lo_c), np.where(empty, 0, hi_c + 1)
            d.m = (cum[b] - cum[a]) > 0
        else:
            d.lo = _range_reduce(self.lo, lo_c, hi_c, np.minimum, _BIG)
            d.hi = _range_reduce(self.hi, lo_c, hi_c, np.maximum, -_BIG)
        return d.keep(~empty)

    def sizes(self) -> np.ndarray:
        if self.exact:
            return self.m.sum(axis=1)
        return np.maximum(self.hi - self.lo + 1, 0)

    def extent(self, t: int) -> tuple[int, int]:
        """(how many positions position t depends on, the first of them; -1 when none)."""
        if self.exact:
            idx = np.flatnonzero(self.m[t])
            return len(idx), int(idx[0]) if len(idx) else -1
        size = max(int(self.hi[t] - self.lo[t] + 1), 0)
        return size, int(self.lo[t]) if size else -1

    def row(self, t: int) -> list[int]:
        if self.exact:
            return np.nonzero(self.m[t])[0].tolist()
        return list(range(int(self.lo[t]), int(self.hi[t]) + 1)) if self.hi[t] >= self.lo[t] else []

    def matrix(self) -> np.ndarray:
        if self.exact:
            return self.m.copy()
        k = np.arange(self.n)[None, :]
        return (k >= self.lo[:, None]) & (k <= self.hi[:, None])


def _range_reduce(v: np.ndarray, lo: np.ndarray, hi: np.ndarray, op: Any, empty: int) -> np.ndarray:
    """op over v[lo[t]..hi[t]] for every t, with a sparse table (O(N log N))."""
    ok = hi >= lo
    if len(v) > 1 and bool(np.all(v[1:] >= v[:-1])):  # sorted (causal sets): read the end
        out = np.full(len(lo), empty, dtype=v.dtype)
        out[ok] = v[lo[ok]] if op is np.minimum else v[hi[ok]]
        return out
    n = len(v)
    table = [v]
    span = 1
    while 2 * span <= n:
        prev = table[-1]
        table.append(op(prev[:-span], prev[span:]))
        span *= 2
    out = np.full(len(lo), empty, dtype=v.dtype)
    length = np.where(ok, hi - lo + 1, 1)
    k = np.floor(np.log2(length)).astype(int)
    for level in np.unique(k[ok]):
        sel = ok & (k == level)
        t = table[level]
        out[sel] = op(t[lo[sel]], t[hi[sel] - (1 << level) + 1])
    return out


@dataclass
class _One:
    """A tensor with one position axis: which positions it holds, and their sets."""

    support: np.ndarray
    deps: Deps


@dataclass
class _Two:
    """A tensor with two position axes: row (the first) and column (the second)."""

    support: np.ndarray  # rows present
    row: Deps
    col: Deps
    lo: np.ndarray  # allowed columns per row: [lo, hi]
    hi: np.ndarray


_NONE = None  # a tensor without position axes (weights)


@dataclass(frozen=True)
class TokenReport:
    """Mixing verdict per node, and the dependence of every output position on input positions."""

    verdicts: dict[str, Verdict]
    mixing_nodes: list[tuple[str, str]]
    exact: bool
    positions: int  # S: past + new
    past: int  # P
    deps: Deps = field(repr=False)  # of the logits, over absolute positions 0..S-1
    per_layer: list[dict[str, int]] = field(default_factory=list)

    @property
    def receptive_field(self) -> int:
        """How many input positions the last position's output depends on."""
        return int(self.deps.sizes()[-1])

    def depends_on(self, t: int) -> list[int]:
        """Input positions (absolute) that the output at new token t depends on."""
        return self.deps.row(self.past + t)

    @property
    def dependence(self) -> np.ndarray:
        """(T, S) bool matrix: output at new token t x input position; for short sequences.
        With logits for the last position only, the rows of the other positions are empty."""
        return self.deps.matrix()[self.past :]

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [{"name": n, "op": op} for n, op in self.mixing_nodes],
            "mixing_ops": sorted({op for _, op in self.mixing_nodes}),
            "receptive_field": self.receptive_field,
            "per_layer": self.per_layer,
            "sets": "exact" if self.exact else "intervals",
        }


@register("tokens", requires=("verify",), options=("exact_sets",))
def token_pass(
    graph: Graph, results: dict[str, Any] | None = None, exact_sets: bool | None = None
) -> TokenReport:
    """Mixing verdicts for every node and dependence sets through all layers; `exact_sets`:
    bit sets of positions rather than intervals (default: when the sequence is short)."""
    letters = {
        n.name: position_letters(graph, n) for n in graph.nodes() if OPS[n.op].category != SOURCE
    }
    fed = _fed_by_inputs(graph)
    verdicts = {
        n.name: mixing_verdict(graph, n, letters.get(n.name))
        if n.name in fed
        else Verdict(False, "made from weights and constants alone")
        for n in graph.nodes()
    }
    mixing = [(n.name, n.op) for n in graph.nodes() if verdicts[n.name].mixes]
    p_len, s_len = sequence(graph)
    exact = exact_sets
    if exact is None:
        exact = s_len <= EXACT_LIMIT
    require_memory(
        propagation_bytes(s_len, bool(exact)),
        f"the tokens pass ({'bit sets' if exact else 'intervals'} over {s_len:,} positions)",
    )
    info, reach = _propagate(graph, s_len, bool(exact), letters)
    logits = info[graph.outputs["logits"].node]
    if not isinstance(logits, _One):
        raise PassError("tokens: the logits have no single position axis")
    per_layer = [
        {"layer": i, "reach": reach[name][0], "first": reach[name][1]}
        for i, name in enumerate(graph.meta.get("blocks", []))
        if name in reach
    ]
    return TokenReport(verdicts, mixing, bool(exact), s_len, p_len, logits.deps, per_layer)


def _fed_by_inputs(graph: Graph) -> set[str]:
    """The nodes a graph input reaches: an op on weights and constants alone (a causal buffer
    sliced to the positions) carries no token's information, whatever its axes pair."""
    fed: set[str] = set()
    for n in graph.nodes():
        if n.op == "input" or any(r.node in fed for r in n.inputs):
            fed.add(n.name)
    return fed


# Arrays of positions alive at once while propagating, measured on llama3-8b and deepseek-v3 with
# room to spare: the inputs of a node, its output and the residual stream, a few sets each.
_LIVE_SETS = 12


def propagation_bytes(n: int, exact: bool) -> float:
    """Peak bytes of the dependence sets over `n` positions: per set an n x n bit matrix (and the
    int32 prefix sums of a range union), or two int64 bounds per position (and the sparse table
    of a range reduction, log2(n) levels of them)."""
    if exact:
        return _LIVE_SETS * n * n + 4.0 * n * n
    levels = max(n, 2).bit_length()
    return _LIVE_SETS * 17.0 * n + 8.0 * levels * n


def sequence(graph: Graph) -> tuple[int, int]:
    """(where the new tokens start, how many absolute positions there are): the first position
    a query axis indexes, and the end of the furthest range any position axis indexes."""
    b = graph.bindings
    dims = {d for n in graph.nodes() for t in n.outputs for d in t.dims if d.role in TOKEN_ROLES}
    ranges = [(d.role, *d.position_range(b)) for d in dims]
    if not ranges:
        raise PassError("tokens: the graph has no position axis")
    first = min((lo for role, lo, _ in ranges if role == "token"), default=0)
    return first, max(hi for _, _, hi in ranges)


def _propagate(
    graph: Graph, n: int, exact: bool, letters: dict[str, tuple]
) -> tuple[dict[str, Any], dict[str, tuple[int, int]]]:
    """Abstract execution over positions: a _One/_Two/None per node (its output 0; the outputs of
    a multi-output op share their positions). Returns the infos of the logits, and the extent of
    the last position's set at each block output (taken as it is made, so that the blocks' sets
    are freed like any other: they are n long each)."""
    blocks = set(graph.meta.get("blocks", ()))
    # the logits only: a cache output (two a layer) kept to the end would hold its sets all along
    keep = {graph.outputs["logits"].node}
    reach: dict[str, tuple[int, int]] = {}
    uses = {n.name: len(graph.users(n)) for n in graph.nodes()}
    info: dict[str, Any] = {}
    b = graph.bindings
    narrower: dict[Any, Any] = {}  # output type -> the positions it holds, or False: all
    for node in graph.nodes():
        vals = [info[r.node] for r in node.inputs]
        out = step(node, vals, letters.get(node.name), n, exact, b, narrower)
        if node.name in blocks and isinstance(out, _One):
            reach[node.name] = out.deps.extent(n - 1)
        if uses[node.name] or node.name in keep:
            info[node.name] = out
        for r in node.inputs:  # free what no later node reads (bit matrices are N x N)
            uses[r.node] -= 1
            if uses[r.node] == 0 and r.node not in keep:
                info.pop(r.node, None)
    return info, reach


def step(
    node: Node,
    vals: list[Any],
    letters: tuple | None,
    n: int,
    exact: bool,
    b: dict[str, int],
    narrower: dict[Any, Any],
) -> Any:
    """One node's positions from its inputs' (`vals`); the same for the same node of every
    layer of its kind given the same inputs (report/reuse.py)."""
    spec = OPS[node.op]
    if spec.category == SOURCE:
        pos = [d for d in node.out.dims if d.role in TOKEN_ROLES]
        if not pos:
            return _NONE
        lo, hi = pos[0].position_range(b)
        sup = np.zeros(n, bool)
        sup[max(lo, 0) : max(hi, 0)] = True  # a conv state's first K-1 may precede 0
        return _One(sup, Deps.identity(n, exact, sup))
    assert letters is not None
    ins, outs = letters
    out = _apply(node, ins, outs[0], vals, n)
    held = narrower.get(node.out)
    if held is None:
        pos = [d for d in node.out.dims if d.role in TOKEN_ROLES]
        held = False
        if len(pos) == 1:
            lo, hi = pos[0].position_range(b)
            if lo > 0 or hi < n:  # an output that holds fewer positions than its input
                held = np.zeros(n, bool)
                held[max(lo, 0) : max(hi, 0)] = True
        narrower[node.out] = held
    if held is not False and isinstance(out, _One):
        out = _One(out.support & held, out.deps.keep(held))
    return out


def _apply(node: Node, ins: list[list[str]], out: list[str], vals: list[Any], n: int) -> Any:
    """One op's effect on positions, by the shape of its position letters."""
    if not out or all(v is _NONE for v in vals):  # made from no token (a constant's slice)
        return _NONE
    if (
        len(ins) == 1
        and ins[0] == out
        and isinstance(vals[0], _One)
        and OPS[node.op].relation is None
    ):
        return vals[0]  # a source's two position axes (made from positions) kept as they are
    same = _passed_through(ins, out, vals) if len(out) == 1 else None
    if same is not None:
        return same
    exact = next((_exact(v) for v in vals if v is not _NONE), True)
    if len(out) == 1:
        return _to_one(node, ins, out[0], vals, n, exact)
    two = _to_two(node, ins, out, vals, n, exact) if len(out) == 2 else None
    if two is not None:
        return two
    raise PassError(f"tokens: {node.name}: no rule for positions {ins} -> {out}")


def _passed_through(ins: list[list[str]], out: list[str], vals: list[Any]) -> Any:
    """The input's positions when every input with positions is one and the same tensor value on
    the output's letters (sets are never mutated, so it is returned as it is); else None."""
    first = None
    for x, v in zip(ins, vals):
        if v is _NONE:
            continue
        if x != out or (first is not None and v is not first):
            return None
        first = v
    return first


def _to_one(node: Node, ins: list[list[str]], t: str, vals: list[Any], n: int, exact: bool) -> _One:
    """An output with one position axis `t`: the union of what its inputs give each t."""
    sup, deps = np.zeros(n, bool), Deps(n, exact)
    paired = {x[1] for x, v in zip(ins, vals) if isinstance(v, _Two) and x[0] == t}
    for letters, v in zip(ins, vals):
        if v is _NONE or (len(letters) == 1 and letters[0] in paired and letters != [t]):
            continue  # no positions, or taken with its pair input
        if letters == [t]:
            sup, deps = sup | v.support, deps.union(v.deps)
            continue
        if isinstance(v, _Two) and letters[0] == t:
            seen, read = _contract_columns(ins, vals, letters[1], v)
            sup, deps = sup | seen, deps.union(read)
            continue
        if len(letters) != 1 or not isinstance(v, _One):
            raise PassError(f"tokens: {node.name}: no rule for positions {letters} -> {[t]}")
        spec = OPS[node.op]
        if spec.relation is None:
            # a whole position axis reduced away: every output position reads all of it
            deps = deps.union(v.deps.range_union(np.zeros(n, np.int64), np.full(n, n - 1)))
            continue
        # a window (a causal conv: K positions) or a prefix (a recurrence: every
        # earlier one) of the axis, as the row's relation says; a carried state stands for every
        # position before the first one the input holds
        read = v.deps
        if any(k < len(node.inputs) for k in spec.state_inputs):
            held = np.flatnonzero(v.support)
            past = np.arange(n) < (held[0] if held.size else 0)
            read = read.union(Deps.identity(n, exact, past))
        lo, hi = spec.relation(node.attrs, np.arange(n))
        deps = deps.union(read.range_union(lo, hi))
        sup = np.ones(n, bool)  # the output's own positions: narrowed to its axis's range after
    return _One(sup, deps.keep(sup))


def _contract_columns(
    ins: list[list[str]], vals: list[Any], s: str, v: _Two
) -> tuple[np.ndarray, Deps]:
    """Contract the column axis `s` of `v`: each row t reads row(t) and, for each allowed s,
    col(s) and every other input's set at s (V in P @ V). (The rows present, their sets.)"""
    col = v.col
    for x2, v2 in zip(ins, vals):
        if x2 == [s] and isinstance(v2, _One):
            col = col.union(v2.deps)
    seen = v.support & (v.hi >= v.lo)
    return seen, v.row.keep(seen).union(col.range_union(v.lo, v.hi))


def _to_two(
    node: Node, ins: list[list[str]], out: list[str], vals: list[Any], n: int, exact: bool
) -> _Two | None:
    """An output with two position axes (t, s): carried from an input that has both (a reduction
    over s folds the columns into the rows; a row's `relation` narrows the allowed columns), or
    paired from an input on t and one on s. None when no input gives them."""
    t, s = out
    for letters, v in zip(ins, vals):
        if isinstance(v, _Two) and letters == out:
            row, col, lo, hi = v.row, v.col, v.lo.copy(), v.hi.copy()
            if _reduces(node, s):
                row, col = row.union(col.range_union(lo, hi)).keep(v.support), Deps(n, exact)
            relation = OPS[node.op].relation
            if relation is not None:
                rlo, rhi = relation(node.attrs, np.arange(n))
                lo, hi = np.maximum(lo, rlo), np.minimum(hi, rhi)
            return _Two(v.support, row, col, lo, hi)
    rows = [v for letters, v in zip(ins, vals) if letters == [t] and isinstance(v, _One)]
    cols = [v for letters, v in zip(ins, vals) if letters == [s] and isinstance(v, _One)]
    if cols and not rows and all(t not in letters for letters in ins):
        # the columns broadcast over rows no input has (a bias a key, made a score matrix):
        # every row reads the same columns and nothing of its own position
        rows = [_One(np.ones(n, bool), Deps(n, exact))]
    if not (rows and cols):
        return None
    r, c = rows[0], cols[0]
    idx = np.nonzero(c.support)[0]
    lo = np.where(r.support, idx.min() if idx.size else _BIG, _BIG)
    hi = np.where(r.support, idx.max() if idx.size else -_BIG, -_BIG)
    return _Two(r.support.copy(), r.deps, c.deps, lo, hi)


def _exact(v: Any) -> bool:
    return v.deps.exact if isinstance(v, _One) else v.row.exact


def _reduces(node: Node, letter: str) -> bool:
    """Whether the op reads position axis `letter` in full for each output (softmax over s)."""
    return letter in OPS[node.op].reduce
