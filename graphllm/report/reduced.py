"""A traced model's graph cut to one layer of each kind, as `plan.reduced_config` gives a built
family's: what `reuse` analyses and unrolls to stand for the whole.

A built family's reduced graph is built from a smaller config; a traced one's is cut from the
full graph (read from the trace cache), keeping what comes before and after the layers and the
first layer of each kind (`layer_kinds`: the trace found the rest repeat it), each renamed to
its reduced index, reading the reduced layer before it. The cut stands for the full graph only
where unrolling it gives the full graph back node for node (names, ops, output types and
inputs): `reduced_traced` checks that and gives None otherwise, so a traced model is never
analysed on a graph that differs from its own.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np

from graphllm.ir import Graph, Node, Ref
from graphllm.passes.cost import layer_scopes


def reduced_traced(full: Graph) -> tuple[Graph, list[int]] | None:
    """The cut graph and each real layer's reduced index; None where the layers do not repeat
    or the cut cannot stand for the full graph."""
    layers = layer_scopes(full)
    kinds = full.meta.get("layer_kinds") or {}
    reps = list(dict.fromkeys(kinds.get(p, p) for p in layers))
    blocks = list(full.meta.get("blocks", ()))
    if len(reps) == len(layers) or len(blocks) != len(layers):
        return None
    kept = {layers.index(p): r for r, p in enumerate(reps)}
    runs = _runs(full, layers)
    if runs is None:
        return None
    small = _cut(full, runs, kept, blocks)
    if small is None:
        return None
    small.meta["config"] = replace(full.meta["config"], num_hidden_layers=len(reps))
    small.meta["scopes"] = _scopes(full.meta["scopes"], layers, kept)
    small.meta["blocks"] = [_rename(blocks[j], j, r) for j, r in sorted(kept.items())]
    small.meta["layer_kinds"] = {}
    return small, [reps.index(kinds.get(p, p)) for p in layers]


def _runs(full: Graph, layers: list[str]) -> list[int | None] | None:
    """Each node's real layer by its place: a layer's run spans its first node to its last, a
    node between two runs going with the next (a cache input read first there); None for
    what comes before and after. None where the runs interleave."""
    pos = {p: j for j, p in enumerate(layers)}
    nodes = list(full.nodes())
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, n in enumerate(nodes):
        j = _layer_index(n.name, pos)
        if j is not None:
            first.setdefault(j, k)
            last[j] = k
    if sorted(first) != list(range(len(layers))):
        return None
    if any(first[j + 1] <= last[j] for j in range(len(layers) - 1)):
        return None
    out: list[int | None] = []
    j = 0
    for k in range(len(nodes)):
        while j < len(layers) and k > last[j]:
            j += 1
        out.append(j if j < len(layers) and (j > 0 or k >= first[0]) else None)
    return out


def _layer_index(name: str, pos: dict[str, int]) -> int | None:
    """The index of the layer scope holding `name` (its shortest dotted prefix that is one),
    as `cost.layer_of` finds it, without its table of every scope of the name."""
    at = name.find(".")
    while at != -1:
        j = pos.get(name[:at])
        if j is not None:
            return j
        at = name.find(".", at + 1)
    return pos.get(name)


def _rename(name: str, j: int, r: int) -> str:
    """Real layer j's name as reduced layer r's: its first dotted component `j` becomes `r`."""
    return re.sub(rf"(?<=\.){j}(?=\.|$)", str(r), name, count=1) if j != r else name


def _cut(
    full: Graph, runs: list[int | None], kept: dict[int, int], blocks: list[str]
) -> Graph | None:
    """The kept nodes, renamed, each reduced layer reading the one before it and what comes
    after reading the last; None where a kept node reads a dropped one otherwise."""
    small = full.derive()
    names: dict[str, str] = {}
    last_real = len(blocks) - 1
    reduced_block = {j: _rename(blocks[j], j, r) for j, r in kept.items()}
    order = sorted(kept)
    for n, j in zip(full.nodes(), runs, strict=True):
        if j is not None and j not in kept:
            continue
        stream: dict[str, str] = {}
        if j is None:
            stream[blocks[last_real]] = reduced_block[order[-1]]
        elif j > 0:
            stream[blocks[j - 1]] = reduced_block[order[order.index(j) - 1]]
        ins = []
        for x in n.inputs:
            src = stream.get(x.node, names.get(x.node))
            if src is None:
                return None
            ins.append(Ref(src, x.index))
        name = n.name if j is None else _rename(n.name, j, kept[j])
        if name in small:
            return None
        names[n.name] = name
        small.add(n.op, name, ins, dict(n.attrs), n.outputs)
    _outputs(full, small, names, runs, kept)
    return small


def _outputs(
    full: Graph, small: Graph, names: dict[str, str], runs: list[int | None], kept: dict[int, int]
) -> None:
    """The kept nodes' graph outputs, a layer's named for its reduced index."""
    layer_at = {n.name: j for n, j in zip(full.nodes(), runs, strict=True)}
    for key, ref in full.outputs.items():
        if ref.node not in names:
            continue
        j = layer_at[ref.node]
        name = key if j is None else _rename(key, j, kept[j])
        small.set_output(name, Ref(names[ref.node], ref.index), full.output_roles.get(key))


def _scopes(scopes: dict[str, str], layers: list[str], kept: dict[int, int]) -> dict[str, str]:
    """The scopes of what comes before and after and of the kept layers, renamed."""
    pos = {p: j for j, p in enumerate(layers)}
    out = {}
    for prefix, kind in scopes.items():
        layer = next((p for p in _heads(prefix) if p in pos), None)
        if layer is None:
            out[prefix] = kind
        elif pos[layer] in kept:
            out[_rename(prefix, pos[layer], kept[pos[layer]])] = kind
    return out


def _heads(prefix: str) -> list[str]:
    """`prefix` and every dotted prefix of it."""
    parts = prefix.split(".")
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)]


def same_nodes(full: Graph, names: list[str], reps: list[Node], inputs: list[list[str]]) -> bool:
    """Whether an unrolled sequence is `full` node for node: the same names in the same order,
    each with its stand-in's op, attributes and output types, reading the same outputs of the
    same nodes (a layer index kept in an attribute would differ)."""
    if len(names) != len(full):
        return False
    for n, name, rep, ins in zip(full.nodes(), names, reps, inputs, strict=True):
        if n.name != name or n.op != rep.op or n.outputs != rep.outputs:
            return False
        if [x.node for x in n.inputs] != ins or not _same_attrs(n.attrs, rep.attrs):
            return False
        if [x.index for x in n.inputs] != [x.index for x in rep.inputs]:  # the same outputs read
            return False
    return True


def _same_attrs(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal attributes, but for `stored_as` (the checkpoint tensors a weight is read from,
    named by its layer): no analysis reads it."""
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        w = b[k]
        if v is w or k == "stored_as":
            continue
        if isinstance(v, np.ndarray) or isinstance(w, np.ndarray):
            if not (isinstance(v, np.ndarray) and isinstance(w, np.ndarray)):
                return False
            if v.dtype != w.dtype or not np.array_equal(v, w):
                return False
        elif v != w:
            return False
    return True
