"""Named dims with roles, and tensor types: what every edge of the graph carries."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache

from graphllm.errors import GraphError

ROLES = frozenset(
    {
        "batch",
        "token",  # query positions: the new tokens of this step
        "key_token",  # positions attended over (past + new)
        "slot",  # routed token-expert pairs inside an expert; each slot holds one token
        "hidden",
        "head",
        "kv_head",
        "head_dim",
        "ffn",
        "vocab",
        "expert",
        "topk",
        "rope",
    }
)
TOKEN_ROLES = frozenset({"token", "key_token", "slot"})
HEAD_ROLES = frozenset({"head", "kv_head"})
_TERM = re.compile(r"\s*([+-]?)\s*([A-Za-z_][\w/]*|\d+)\s*")


@dataclass(frozen=True, slots=True)
class Dim:
    """A named axis size. `size` None means symbolic, bound by a Workload (B, T, P, S, C).

    `positions` says which absolute token positions a position axis indexes, as the half-open
    range [start, stop) of two sums of bound names and integers (`("P", "P+T")`: the new tokens
    after P past ones), evaluated by `position_range`. None: positions 0..size-1. A block of the
    axis (a shard) keeps the range of the whole axis it is cut from.
    """

    name: str
    role: str
    size: int | None = None
    positions: tuple[str, str] | None = None
    # dims are hashed on every cached shape inference: compute it once
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise GraphError(f"dim {self.name}: unknown role {self.role!r}")
        if self.positions is not None:
            if self.role not in TOKEN_ROLES or len(self.positions) != 2:
                raise GraphError(
                    f"dim {self.name}: positions are a (start, stop) pair of a "
                    f"position axis ({', '.join(sorted(TOKEN_ROLES))})"
                )
            for e in self.positions:
                _terms(e)  # a malformed rule fails where the dim is declared
        object.__setattr__(self, "_hash", hash((self.name, self.role, self.size, self.positions)))

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return self.name if self.size is None else str(self.size)

    def position_range(self, bindings: dict[str, float]) -> tuple[int, int]:
        """The absolute positions [start, stop) this axis indexes under `bindings`."""
        if self.positions is None:
            return 0, int(self.size if self.size is not None else bindings[self.name])
        start, stop = (_evaluate(e, bindings) for e in self.positions)
        return start, stop


@lru_cache(maxsize=256)
def _terms(expr: str) -> tuple[tuple[int, str | int], ...]:
    """`"P+T-1"` -> ((1, 'P'), (1, 'T'), (-1, 1)): signed names and integers."""
    out: list[tuple[int, str | int]] = []
    pos = 0
    while pos < len(expr):
        m = _TERM.match(expr, pos)
        if m is None or m.end() == pos or (out and not m.group(1)):
            raise GraphError(f"position rule {expr!r}: expected names and integers joined by +/-")
        sign = -1 if m.group(1) == "-" else 1
        out.append((sign, int(m.group(2)) if m.group(2).isdigit() else m.group(2)))
        pos = m.end()
    if not out:
        raise GraphError("position rule: empty")
    return tuple(out)


def _evaluate(expr: str, bindings: dict[str, float]) -> int:
    total = 0.0
    for sign, t in _terms(expr):
        if isinstance(t, str) and t not in bindings:
            raise GraphError(f"position rule {expr!r}: {t} is not bound")
        total += sign * (t if isinstance(t, int) else bindings[t])
    return int(total)


@dataclass(frozen=True, slots=True)
class TensorType:
    """Dims plus the storage dtype name (see graphllm.workload.DTYPES, or 'int64')."""

    dims: tuple[Dim, ...]
    dtype: str
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.dims, self.dtype)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def rank(self) -> int:
        return len(self.dims)

    def shape(self, bindings: dict[str, float] | None = None) -> tuple[float | int | str, ...]:
        """Concrete sizes where `bindings` give them, else the symbolic names."""
        b = bindings or {}
        return tuple(d.size if d.size is not None else b.get(d.name, d.name) for d in self.dims)

    def numel(self, bindings: dict[str, float]) -> float:
        n: float = 1
        for d in self.dims:
            n *= d.size if d.size is not None else bindings[d.name]
        return n

    def format(
        self, bindings: dict[str, float] | None = None, drop_unit_batch: bool = False
    ) -> str:
        """Dims joined by '×': `B×T×4096` symbolically, `1×3×8` once bound."""
        parts = []
        for d, s in zip(self.dims, self.shape(bindings)):
            if drop_unit_batch and d.role == "batch" and s == 1:
                continue
            parts.append(_fmt_size(s))
        return "×".join(parts) if parts else "scalar"

    def __str__(self) -> str:
        return self.format()


def _fmt_size(s: float | int | str) -> str:
    if isinstance(s, (int, str)):
        return str(s)
    s = float(s)  # a float, or a Fraction (balanced routing's slots per expert): 1.75, not 7/4
    return str(int(s)) if s.is_integer() else f"{s:g}"
