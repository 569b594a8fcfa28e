"""The (query, key) relation a transformers mask function encodes, as graphllm's mask attrs.

transformers builds every mask from a function of (batch, head, query position, key position)
in absolute positions. Read at a few positions it gives its form: causal (s <= t), a window
(t - W < s <= t), a chunk (s // C == t // C, s <= t) or bidirectional; the form found is then
checked against the function at positions around every boundary, and a function that matches
none is an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphllm.errors import ConfigError

_FAR = 1 << 20  # a query position past any window or chunk of a published config


def read_relation(fn: Callable[..., Any] | None) -> dict[str, Any]:
    """{'causal': bool, 'window': W | None[, 'chunk': C]} of mask function `fn` (None: causal)."""
    if fn is None:
        return {"causal": True, "window": None}
    fn = _one_sequence(fn)
    _unpadded(fn)

    def allowed(q: int, k: int) -> bool:
        try:
            return bool(fn(0, 0, q, k))
        except (AttributeError, TypeError):  # a function of index tensors, not numbers
            import torch

            zero = torch.tensor(0)
            return bool(fn(zero, zero, torch.tensor(q), torch.tensor(k)))

    try:
        causal = not allowed(_FAR, _FAR + 1)
        lo = _first_allowed(allowed, _FAR)
        relation: dict[str, Any] = {"causal": causal, "window": None}
        lo_next = _first_allowed(allowed, _FAR + 1)
        if lo > 0 and lo_next == lo + 1:
            relation["window"] = _FAR - lo + 1
        elif lo > 0 and lo_next == lo:  # a chunk: its start stays until the next chunk
            relation["chunk"] = _chunk(allowed)
        ok = _check(allowed, relation)
    except ConfigError:
        raise
    except Exception as e:
        raise ConfigError(f"the model's attention mask cannot be read: {e}") from None
    if not ok:
        raise ConfigError(
            f"the model's attention mask ({getattr(fn, '__qualname__', fn)}) is not a causal, "
            "sliding-window or chunked relation, which is what graphllm models"
        )
    return relation


def _everywhere(b: Any, h: Any, q: Any, k: Any) -> Any:
    return q >= 0  # True, a tensor where the positions are


def _nowhere(b: Any, h: Any, q: Any, k: Any) -> Any:
    return q < 0


# transformers' overlays that read a tensor of the tokens (the packed sequence each is of, the
# image block each is in), as they are for one text sequence a batch row, which is what
# graphllm models: no sequence boundary, no image block
_ONE_SEQUENCE = {
    "packed_sequence_mask_function.<locals>.inner_mask": _everywhere,
    "blockwise_overlay.<locals>.inner_mask": _nowhere,
}
_REMAP = "remap_positions_for_packed_sequence.<locals>.inner_mask"  # positions: the indices


def _one_sequence(fn: Any, seen: set[int] | None = None) -> Any:
    """`fn` with those overlays, in it and the functions it combines, as one sequence has them."""
    seen = seen if seen is not None else set()
    qual = getattr(fn, "__qualname__", "")
    if qual in _ONE_SEQUENCE:
        return _ONE_SEQUENCE[qual]
    cells = getattr(fn, "__closure__", None) or ()
    if qual == _REMAP:
        inner = [c.cell_contents for c in cells if callable(c.cell_contents)]
        return _one_sequence(inner[0], seen) if len(inner) == 1 else fn
    if id(fn) in seen:
        return fn
    seen.add(id(fn))
    for cell in cells:
        value = cell.cell_contents
        if isinstance(value, (list, tuple)) and value and all(callable(v) for v in value):
            cell.cell_contents = type(value)(_one_sequence(v, seen) for v in value)
        elif callable(value):
            cell.cell_contents = _one_sequence(value, seen)
    return fn


def _unpadded(fn: Any, seen: set[int] | None = None) -> None:
    """The tensors a mask function closes over that the traced forward made (fake ones: Llama
    4's left-padding offsets per sequence) set to zeros, in it and the functions it combines:
    graphllm models sequences without padding."""
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    seen = seen if seen is not None else set()
    if id(fn) in seen or not callable(fn):
        return
    seen.add(id(fn))
    for cell in getattr(fn, "__closure__", None) or ():
        value = cell.cell_contents
        if isinstance(value, FakeTensor):
            import torch

            with unset_fake_temporarily():
                cell.cell_contents = torch.zeros(tuple(value.shape), dtype=value.dtype)
        elif isinstance(value, (list, tuple)):
            for v in value:
                _unpadded(v, seen)
        else:
            _unpadded(value, seen)


def _first_allowed(allowed: Callable[[int, int], bool], q: int) -> int:
    """The first key position query q may see (keys 0..q allowed from there on)."""
    if allowed(q, 0):
        return 0
    lo, hi = 0, q  # allowed(q, hi) holds for every causal-like mask
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if allowed(q, mid) else (mid, hi)
    return hi


def _chunk(allowed: Callable[[int, int], bool]) -> int:
    """The chunk size: from the start of _FAR's chunk to the first query whose chunk starts
    elsewhere (a bisection: the start steps up once a chunk)."""
    start = _first_allowed(allowed, _FAR)
    lo, hi = _FAR, _FAR + _FAR
    if _first_allowed(allowed, hi) == start:
        raise ConfigError("the model's chunked attention mask has no chunk size graphllm can read")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _first_allowed(allowed, mid) == start else (lo, mid)
    return hi - start


def _expected(relation: dict[str, Any], q: int, k: int) -> bool:
    if relation["causal"] and k > q:
        return False
    w, c = relation.get("window"), relation.get("chunk")
    if w and k <= q - w:
        return False
    return not (c and k // c != q // c)


def _check(allowed: Callable[[int, int], bool], relation: dict[str, Any]) -> bool:
    edges = {0, 1, relation.get("window") or 0, relation.get("chunk") or 0}
    qs = {e + d for e in edges for d in (-2, -1, 0, 1, 2, 37) if e + d >= 0} | {_FAR, 5000}
    for q in qs:
        ks = {0, q, q + 1, q - 1} | {q - e + d for e in edges for d in (-1, 0, 1)}
        for k in ks:
            if k >= 0 and allowed(q, k) != _expected(relation, q, k):
                return False
    return True
