"""Named dims with roles, and tensor types: what every edge of the graph carries."""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class Dim:
    """A named axis size. `size` None means symbolic, bound by a Workload (B, T, P, S, C)."""

    name: str
    role: str
    size: int | None = None
    # dims are hashed on every cached shape inference: compute it once
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise GraphError(f"dim {self.name}: unknown role {self.role!r}")
        object.__setattr__(self, "_hash", hash((self.name, self.role, self.size)))

    def __hash__(self) -> int:
        return self._hash

    def __str__(self) -> str:
        return self.name if self.size is None else str(self.size)


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
    if isinstance(s, float):
        return str(int(s)) if s.is_integer() else f"{s:g}"
    return str(s)
