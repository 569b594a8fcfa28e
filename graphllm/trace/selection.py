"""Selected-keys attention in a trace (DeepSeek Sparse Attention): an indexer's top-k over the
keys, handed to the attention function as the indices each query reads.

The recorder runs a selecting module's top-k over every key and notes the k it keeps
(graphllm.trace.capture); here that top-k is the `topk_select` row (True at each query's
min(k, S) best keys). What the model's code does with the indices on their way to the
attention (casts, an axis of one) is followed as bookkeeping on that one boolean tensor, and
the attention that reads them (transformers hands them to a kernel as `indices` where it
does not build eager's mask of them) masks with `mask_selected`: the relation's bound, and
within it only the selected keys, at most k a query.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graphllm.errors import ConfigError
from graphllm.ir import Ref

# what keeps every selected index where it was (a cast, a copy, an axis of one added or
# dropped); a slice or a reshape would keep another set, and is refused
_CARRY = {"_to_copy", "unsqueeze", "squeeze", "clone", "alias", "detach", "copy"}
_CARRY |= {"lift_fresh", "lift_fresh_copy"}


@dataclass(frozen=True)
class Selection:
    """The indices of the selected keys, as the `topk_select` row's output `ref` holds them
    (True where selected); `topk` the keys kept a query."""

    ref: Ref
    topk: int


def select(lw: Any, ev: Any, scores: Ref) -> None:
    """The top-k of a selecting module: the `topk_select` row on its scores; its indices are
    the selection (its values are not what the model reads)."""
    keep = int(ev.kwargs["keep"])
    name = lw.unique(f"{ev.scope}.select" if ev.scope else "select")
    node = lw.g.add("topk_select", name, (scores,), {"topk": keep})
    lw.selections[ev.outs[1]] = Selection(Ref(node.name), keep)


def follow(lw: Any, ev: Any, kind: str, vals: list[Any]) -> None:
    """An op on a selection's indices: the same selection, or an error."""
    sel = next(lw.selections[v.vid] for v in vals if v.vid in lw.selections)
    if kind in _CARRY and len(vals) == 1:
        lw.selections[ev.outs[0]] = sel
    else:
        raise ConfigError(
            f"{ev.scope or 'the model'} computes with its selected keys (aten.{kind}) in a way "
            "graphllm does not model"
        )


def selected_keys(lw: Any, ev: Any, indices: Any) -> Selection | None:
    """The selection an attention reads as its `indices`, or None where it reads none."""
    if indices is None:
        return None
    sel = lw.selections.get(indices.vid)
    if sel is None:
        raise ConfigError(
            f"{ev.scope}: the attention reads key indices graphllm does not find a selecting "
            "module's top-k in"
        )
    return sel
