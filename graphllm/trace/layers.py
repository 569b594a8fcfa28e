"""Recurring decoder layers: recorded once per kind, replayed for the rest.

A 126-layer model runs the same layer 126 times. Layers whose modules are alike (the same
classes, the same parameter shapes, the same plain attributes: a sliding layer's window, a
layer's type; the layer's own index aside) are one kind. While a forward is recorded the first
layer of each kind runs; every later one of its kind is replaced by a `replay` event (its input
and output tensors, the layer it repeats), and `expand` writes the representative's events
again under the repeat's names (its scope, its parameters, its cache entries) before lowering.
The graph is the same as a full recording's; the recording is a layer of each kind long.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from graphllm.errors import ConfigError
from graphllm.trace.capture import Event, Recording, Val

# attributes that name the layer's position, not its kind
_INDEX_ATTRS = frozenset(
    {"layer_idx", "layer_id", "layer_index", "idx", "layer_number", "block_idx"}
)
_PLAIN = (int, float, str, bool, type(None))
_LAYER = re.compile(r"^(?:.*\.)?(?:layers|h|blocks|layer)\.(\d+)$")


_IN_LAYER = re.compile(r"^(?:.*\.)?(?:layers|h|blocks|layer)\.(\d+)(?:\.|$)")


def layer_index(path: str) -> int | None:
    """The index of the decoder layer holding the module at `path` (the innermost), else None."""
    found = [int(m.group(1)) for m in _IN_LAYER.finditer(path)]
    return found[-1] if found else None


def _plain(v: Any) -> bool:
    return isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(isinstance(x, _PLAIN) for x in v))


def signature(module: Any) -> tuple:
    """What makes a layer the kind it is: its modules' classes and plain attributes, and its
    parameters' names, shapes and dtypes."""
    parts = []
    for name, sub in module.named_modules():
        attrs = tuple(
            sorted(
                (k, v)
                for k, v in vars(sub).items()
                if not k.startswith("_") and k not in _INDEX_ATTRS and _plain(v)
            )
        )
        parts.append((name, type(sub).__name__, attrs))
    params = tuple((n, tuple(p.shape), str(p.dtype)) for n, p in module.named_parameters())
    return tuple(parts), params


class Looped(Exception):
    """A layer ran a second time in one forward (a looped model's, HRM's): what a call of it
    reads and writes (its cache entry) depends on the call, so no layer may stand for another."""


class Unlike(Exception):
    """A layer took other inputs than the first layer of its kind: other dtypes (Mamba's first
    layer reads the embedding's bf16, the later ones the fp32 residual: its code casts where the
    representative's did not), or more or fewer tensors (GLM-5's later layers are handed the
    layer before's selection of keys, its first none). It starts a kind of its own
    (`split_kind`)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


def split_kind(model: Any, path: str) -> None:
    """`path`, which repeated a layer of another kind, and every later layer that did: a kind
    of their own, `path` its first."""
    kinds = model._graphllm_layer_kinds
    rep = kinds.pop(path)
    order = list(dict(model.named_modules()))
    for p, r in kinds.items():
        if r == rep and order.index(p) > order.index(path):
            kinds[p] = path


def layer_paths(model: Any) -> list[str]:
    """The paths of the model's decoder layers (and of any module named like one inside)."""
    return [path for path, _ in model.named_modules() if _LAYER.match(path)]


def representatives(model: Any) -> dict[str, str]:
    """Each repeating decoder layer's path -> the path of the first layer of its kind (found
    once a model: every probe of it asks)."""
    known = getattr(model, "_graphllm_layer_kinds", None)
    if known is not None:
        return known
    layers = {path: m for path, m in model.named_modules() if _LAYER.match(path)}
    shared = _sharing(layers)
    first: dict[tuple, str] = {}
    out: dict[str, str] = {}
    for path, module in layers.items():
        if path in shared:
            continue
        sig = signature(module)
        rep = first.setdefault(sig, path)
        if rep != path:
            out[path] = rep
    model._graphllm_layer_kinds = out
    return out


def _sharing(layers: dict[str, Any]) -> set[str]:
    """The layers that hold a parameter another layer holds too (Zamba's shared transformer
    block, tied into every hybrid layer): each runs itself, reading the one tensor, and picks
    its own adapters by its index, so none repeats another."""
    holders: dict[int, set[str]] = {}
    for path, m in layers.items():
        for p in m.parameters():
            holders.setdefault(id(p), set()).add(path)
    top = {p for p in layers if not any(p.startswith(q + ".") for q in layers)}
    return {p for paths in holders.values() if len(paths & top) > 1 for p in paths}


@contextmanager
def replaying(model: Any, box: Any) -> Iterator[None]:
    """Within the block, each layer of a kind seen before is a `replay` event, and each
    representative's events, inputs and outputs are noted in `box.layers`."""
    import torch

    reps = representatives(model)
    modules = dict(model.named_modules())
    handles = []
    box.layers, box.replayed = {}, set()
    for rep in set(reps.values()):
        handles += _note(modules[rep], rep, box, torch)
    for path, rep in reps.items():
        slots = _slots(modules[rep], modules[path])
        modules[path].forward = _replay(path, rep, slots, box, torch)
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        for path in reps:
            del modules[path].forward  # the class's forward again


def _tensors(x: Any, torch: Any) -> list[Any]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _tensors(v, torch)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _tensors(v, torch)]
    return []


def _note(module: Any, path: str, box: Any, torch: Any) -> list[Any]:
    def pre(mod: Any, args: Any, kwargs: Any) -> None:
        if path in box.layers:
            raise Looped(path)
        known = [t for t in _tensors((args, kwargs), torch) if id(t) in box.ids]
        ins = [box.ids[id(t)] for t in known]
        dtypes = [str(t.dtype) for t in known]
        box.layers[path] = {"start": len(box.rec.events), "ins": ins, "dtypes": dtypes}

    def post(mod: Any, args: Any, kwargs: Any, out: Any) -> None:
        note = box.layers[path]
        note["end"] = len(box.rec.events)
        note["outs"] = [box.ids[id(t)] for t in _tensors(out, torch)]
        note["structure"] = out

    return [
        module.register_forward_pre_hook(pre, with_kwargs=True),
        module.register_forward_hook(post, with_kwargs=True),
    ]


def _slots(rep: Any, repeat: Any) -> dict[str, str]:
    """The cache entries of `rep`'s modules -> those of `repeat`'s, by the index each module
    keeps its cache under (`layer_idx`): a layer may hold several (LongCat-Flash's two
    attentions a layer use entries 2i and 2i + 1)."""
    out = {}
    for (_, a), (_, b) in zip(rep.named_modules(), repeat.named_modules()):
        i, j = getattr(a, "layer_idx", None), getattr(b, "layer_idx", None)
        if isinstance(i, int) and isinstance(j, int):
            out[str(i)] = str(j)
    return out


def _replay(path: str, rep: str, slots: dict[str, str], box: Any, torch: Any) -> Any:
    def forward(*args: Any, **kwargs: Any) -> Any:
        if path in box.replayed:
            raise Looped(path)
        box.replayed.add(path)
        note = box.layers.get(rep)
        if note is None or "end" not in note:
            raise ConfigError(f"{path} repeats {rep}, which has not run before it")
        known = [t for t in _tensors((args, kwargs), torch) if id(t) in box.ids]
        ins = [box.ids[id(t)] for t in known]
        if len(ins) != len(note["ins"]) or [str(t.dtype) for t in known] != note["dtypes"]:
            raise Unlike(path)
        with box.quiet():
            out = _like(note["structure"], torch)
        outs = tuple(box.number(t) for t in _tensors(out, torch))
        box.rec.events.append(
            Event(
                "replay",
                tuple(Val(v) for v in ins),
                {"of": rep, "as": path, "slots": slots},
                outs,
                path,
            )
        )
        return out

    return forward


def _like(x: Any, torch: Any) -> Any:
    """New tensors of the shapes and dtypes of `x`'s, in its structure."""
    if isinstance(x, torch.Tensor):
        return torch.empty_like(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*(_like(v, torch) for v in x))
    if isinstance(x, (list, tuple)):
        return type(x)(_like(v, torch) for v in x)
    if isinstance(x, dict):
        return type(x)({k: _like(v, torch) for k, v in x.items()})
    return x


def expand(rec: Recording, args: list[Any], shapes: dict[int, Any], layers: dict) -> list[Any]:
    """Replace each replay event of `rec` by its representative's events under the repeat's
    names; returns the fitted args of the new event list (`shapes` gains the new tensors')."""
    events: list[Event] = []
    new_args: list[Any] = []
    by_name = {name: vid for vid, (kind, name) in rec.sources.items() if kind == "input"}
    by_name |= {name: vid for vid, name in rec.slots.items()}
    fresh = [max(rec.shapes) + 1]
    # a repeat's output that is one of its inputs handed back (a layer passing the layer
    # before's selection of keys on) -> that input, for everything after it
    same: dict[int, int] = {}
    for ev, a in zip(rec.events, args):
        if same:
            ev = Event(ev.op, _map_vals(ev.args, _via(same)), ev.kwargs, ev.outs, ev.scope)
            a = _map_vals(a, _via(same))
        if ev.op != "replay":
            events.append(ev)
            new_args.append(a)
            continue
        note = layers[ev.kwargs["of"]]
        span = slice(note["start"], note["end"])
        rep, path = ev.kwargs["of"], ev.kwargs["as"]
        for module, cls in list(rec.modules.items()):  # the repeat's modules: the same classes
            if module == rep or module.startswith(rep + "."):
                rec.modules.setdefault(path + module[len(rep) :], cls)
        copy = _Copy(rec, shapes, ev, note, by_name, fresh)
        same.update(copy.handed_back)
        for rev, ra in zip(rec.events[span], args[span]):
            outs = tuple(copy.vid(o) for o in rev.outs)
            ins = _map_vals(rev.args, copy.vid)
            events.append(Event(rev.op, ins, rev.kwargs, outs, copy.names.name(rev.scope)))
            new_args.append(_map_vals(ra, copy.vid))
        for name, (vid, role) in list(rec.outputs.items()):
            renamed = copy.names.cache(name)
            if name.startswith("present.") and renamed != name and vid in copy.vmap:
                rec.outputs[renamed] = (copy.vmap[vid], role)
    for name, (vid, role) in list(rec.outputs.items()):
        rec.outputs[name] = (same.get(vid, vid), role)
    rec.events = events
    return new_args


def _via(same: dict[int, int]) -> Any:
    return lambda v: same.get(v, v)


class _Copy:
    """The tensors of one repeat: its representative's, renumbered where the repeat has its
    own (inputs and outputs it was called with, what it makes, its weights and cache)."""

    def __init__(
        self, rec: Recording, shapes: dict, ev: Event, note: dict, by_name: dict, fresh: list[int]
    ) -> None:
        self.rec, self.shapes, self.by_name, self.fresh = rec, shapes, by_name, fresh
        self.names = _Renamer(ev.kwargs["of"], ev.kwargs["as"], ev.kwargs.get("slots") or {})
        self.vmap = dict(zip(note["ins"], (v.vid for v in ev.args)))
        # an output that is an input handed back is no new tensor: the repeat's own input
        self.handed_back = {
            n: self.vmap[o] for o, n in zip(note["outs"], ev.outs) if o in self.vmap
        }
        self.vmap.update((o, n) for o, n in zip(note["outs"], ev.outs) if o not in self.vmap)
        self.inside = {o for e in rec.events[note["start"] : note["end"]] for o in e.outs}

    def vid(self, v: int) -> int:
        if v in self.vmap:
            return self.vmap[v]
        rec = self.rec
        kind, name = rec.sources.get(v, ("", ""))
        if kind == "input" or v in rec.slots:  # the repeat's own cache entry, where it has one
            name = rec.slots.get(v, name)
            self.vmap[v] = self.by_name.get(self.names.cache(name), v)
            return self.vmap[v]
        if not (v in self.inside or (kind and self.names.name(name) != name)):
            return v  # made before the layer and shared: a mask, the rotary tables
        new = self.vmap[v] = self.fresh[0]
        self.fresh[0] += 1
        self.shapes[new] = self.shapes[v]
        rec.shapes[new], rec.dtypes[new] = rec.shapes[v], rec.dtypes[v]
        if kind:
            rec.sources[new] = (kind, self.names.name(name))
            if v in rec.values:
                rec.values[new] = rec.values[v]
        return new


class _Renamer:
    """Names under a representative layer -> the same names under its repeat."""

    def __init__(self, rep: str, path: str, slots: dict[str, str]) -> None:
        self.rep, self.path = rep, path
        # the cache entries by the modules' own indices; else the layers' positions
        self.slots = slots or {rep.rsplit(".", 1)[-1]: path.rsplit(".", 1)[-1]}

    def name(self, name: str) -> str:
        if name == self.rep or name.startswith(self.rep + "."):
            return self.path + name[len(self.rep) :]
        return name

    def cache(self, name: str) -> str:
        """past_key_values.{r}.key -> past_key_values.{i}.key (present. the same)."""
        parts = name.split(".")
        if len(parts) > 2 and parts[1] in self.slots and parts[0] in ("past_key_values", "present"):
            parts[1] = self.slots[parts[1]]
        return ".".join(parts)


def _map_vals(x: Any, vid_of: Any) -> Any:
    if isinstance(x, Val):
        return Val(vid_of(x.vid))
    if isinstance(x, tuple):
        return tuple(_map_vals(v, vid_of) for v in x)
    return x
