"""Einsum-style axis signatures: parsing, and binding an op's input dims to its letters.

`"b t d, f d -> b t f"`: operands separated by commas, axes by spaces. `...` stands for any leading
axes passed through unchanged; `(h e)` is one stored axis whose size is the product of h and e.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from graphllm.errors import GraphError
from graphllm.ir.dims import Dim

ELLIPSIS = "..."
Axis = str | tuple[str, ...]  # a letter, ELLIPSIS, or a group of letters


@dataclass(frozen=True)
class Signature:
    inputs: tuple[tuple[Axis, ...], ...]
    outputs: tuple[tuple[Axis, ...], ...]

    @property
    def letters(self) -> tuple[str, ...]:
        """Every distinct letter, in order of first appearance."""
        seen: dict[str, None] = {}
        for operand in self.inputs + self.outputs:
            for ax in operand:
                for letter in ax if isinstance(ax, tuple) else (ax,):
                    if letter != ELLIPSIS:
                        seen[letter] = None
        return tuple(seen)

    def output_letters(self) -> set[str]:
        return {x for op in self.outputs for ax in op for x in _flat(ax)}


def _flat(ax: Axis) -> tuple[str, ...]:
    return ax if isinstance(ax, tuple) else (ax,)


SCALAR = "_"  # an operand of no axes (a 0-d tensor), where one must be written


def _parse_operand(text: str) -> tuple[Axis, ...]:
    if text.strip() == SCALAR:
        return ()
    axes: list[Axis] = []
    group: list[str] | None = None
    for tok in text.replace("(", " ( ").replace(")", " ) ").split():
        if tok == "(":
            group = []
        elif tok == ")":
            assert group is not None, text
            axes.append(tuple(group))
            group = None
        elif group is not None:
            group.append(tok)
        else:
            axes.append(tok)
    return tuple(axes)


@cache
def parse(sig: str) -> Signature:
    """Parse a signature once; results are cached by string."""
    lhs, rhs = sig.split("->")
    ins = tuple(_parse_operand(s) for s in lhs.split(",")) if lhs.strip() else ()
    outs = tuple(_parse_operand(s) for s in rhs.split(","))
    return Signature(ins, outs)


def bind(
    sig: Signature, dims_in: list[tuple[Dim, ...]], axes: dict[str, Dim], where: str
) -> tuple[dict[str, Dim], tuple[Dim, ...]]:
    """Bind letters to the input dims (and to `axes` for letters only outputs have).

    Returns the letter->Dim map and the dims the ellipsis stands for. Raises GraphError naming
    `where` when a letter is bound to two different dims or a rank does not fit.
    """
    env: dict[str, Dim] = {}
    ell: tuple[Dim, ...] | None = None
    if len(dims_in) != len(sig.inputs):
        raise GraphError(f"{where}: takes {len(sig.inputs)} inputs, got {len(dims_in)}")
    for i, (operand, dims) in enumerate(zip(sig.inputs, dims_in)):
        if ELLIPSIS in operand:
            n_ell = len(dims) - (len(operand) - 1)
            if n_ell < 0:
                raise GraphError(f"{where}: input {i} has rank {len(dims)}, too small")
            k = operand.index(ELLIPSIS)
            these = tuple(dims[k : k + n_ell])
            if ell is None:
                ell = these
            elif ell != these:
                raise GraphError(
                    f"{where}: input {i} leading dims {_dims(these)} differ from {_dims(ell)}"
                )
            dims = dims[:k] + (None,) + dims[k + n_ell :]  # type: ignore[operator]
        elif len(dims) != len(operand):
            raise GraphError(
                f"{where}: input {i} has rank {len(dims)} ({_dims(dims)}), "
                f"signature operand has {len(operand)}"
            )
        for ax, d in zip(operand, dims):
            if ax == ELLIPSIS:
                continue
            if isinstance(ax, tuple):
                _bind_group(ax, d, env, axes, where, i)
                continue
            prev = env.get(ax)
            if prev is None:
                env[ax] = d
            elif prev != d:
                raise GraphError(
                    f"{where}: axis {ax} is {_dim(prev)} in one input, {_dim(d)} in {i}"
                )
    return env, ell or ()


def _bind_group(
    group: tuple[str, ...], d: Dim, env: dict[str, Dim], axes: dict[str, Dim], where: str, i: int
) -> None:
    size = 1
    for letter in group:
        part = env.get(letter) or axes.get(letter)
        if part is None or part.size is None:
            raise GraphError(f"{where}: axis {letter} of group ({' '.join(group)}) is not known")
        env.setdefault(letter, part)
        size *= part.size
    if d.size != size:
        raise GraphError(
            f"{where}: input {i} axis {_dim(d)} should be ({' '.join(group)}) = {size} in size"
        )


def output_dims(
    sig: Signature, env: dict[str, Dim], ell: tuple[Dim, ...], axes: dict[str, Dim], where: str
) -> list[tuple[Dim, ...]]:
    """Dims of each output: letters from the inputs or from `axes`, groups from `axes`."""
    outs = []
    for operand in sig.outputs:
        dims: list[Dim] = []
        for ax in operand:
            if ax == ELLIPSIS:
                dims.extend(ell)
            elif isinstance(ax, tuple):
                dims.append(_group_dim(ax, env, axes, where))
            else:
                dims.append(_letter_dim(ax, env, axes, where))
        outs.append(tuple(dims))
    return outs


def _letter_dim(letter: str, env: dict[str, Dim], axes: dict[str, Dim], where: str) -> Dim:
    """An output letter's dim: an input's axis, else the one `axes` gives."""
    d = env.get(letter) or axes.get(letter)
    if d is None:
        raise GraphError(f"{where}: output axis {letter} is neither an input axis nor given")
    return d


def _group_dim(
    group: tuple[str, ...], env: dict[str, Dim], axes: dict[str, Dim], where: str
) -> Dim:
    """The dim `axes` gives an output group `(h e)`: as large as its letters together."""
    key = "(" + " ".join(group) + ")"
    d = axes.get(key)
    if d is None:
        raise GraphError(f"{where}: output axis {key} needs a dim in attrs['axes']")
    size = 1
    for letter in group:
        part = env.get(letter) or axes.get(letter)
        size = size * part.size if part is not None and part.size else 0
    if d.size != size:
        raise GraphError(f"{where}: output axis {key} is {_dim(d)}, expected {size}")
    return d


def _dim(d: Dim) -> str:
    return f"{d.name}={d.size}" if d.size is not None else d.name


def _dims(ds: tuple[Dim, ...]) -> str:
    return "×".join(str(d) for d in ds) or "()"
