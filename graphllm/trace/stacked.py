"""A cache a model keeps as a plain list of tensors, each holding every layer's entry on its last
axis (RWKV's `state`: five (B, D, layers) tensors, which layer i reads as `s[:, :, i]` and
writes as `s[:, :, i] = x`), held as one tensor a layer and entry while a forward is recorded.

Recorded as transformers runs it, a layer would read and write its entry by its own index, a
constant of its recording: a repeated layer, written out from its kind's first one
(graphllm.trace.layers), would read that layer's entry. Held apart, each entry is a tensor of
its own, named `{prefix}.{layer}.state.{j}` like any cache layer's entries: a cached step's
inputs and outputs are one tensor a layer (the graph's, onnxruntime's), a repeated layer reads
and writes its own, and a layer's state is its own for the memory report. transformers' own
list (its step's input, its output) is read the same way (`cache_tensors`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from graphllm.errors import ConfigError

# the name of a listed cache's entries, `{prefix}.{layer}.state.{j}`
ENTRY = "state"


class Stacked:
    """One tensor of a listed cache, as its layers' entries (`columns`, each (B, ...)); indexed
    as transformers' code indexes the stacked tensor, by the layer on the last axis."""

    def __init__(self, columns: list[Any], dtype: Any) -> None:
        self.columns, self.dtype = columns, dtype

    def _layer(self, index: Any) -> int:
        ndim = self.columns[0].dim() + 1
        whole = (slice(None),) * (ndim - 1)
        if not (isinstance(index, tuple) and len(index) == ndim and index[:-1] == whole):
            raise ConfigError(
                f"the model indexes its listed cache as [{index}], not as one layer's entry on "
                "its last axis, which graphllm does not follow"
            )
        if not isinstance(index[-1], int) or not 0 <= index[-1] < len(self.columns):
            raise ConfigError(f"the model reads layer {index[-1]} of its listed cache")
        return index[-1]

    def __getitem__(self, index: Any) -> Any:
        return self.columns[self._layer(index)]

    def __setitem__(self, index: Any, value: Any) -> None:
        """A write of one layer's entry: the value, in the cache's dtype (a copy into the
        stacked tensor)."""
        i = self._layer(index)
        if tuple(value.shape) != tuple(self.columns[i].shape):
            raise ConfigError(
                f"the model writes a {tuple(value.shape)} tensor into a layer's entry of its "
                f"listed cache, of {tuple(self.columns[i].shape)}, which graphllm does not follow"
            )
        self.columns[i] = value if value.dtype == self.dtype else value.to(self.dtype)


def entries(cache: list[Any], prefix: str) -> list[tuple[str, Any]]:
    """(name, tensor) of each layer's entry of a listed cache, layer by layer: a Stacked's
    columns, a stacked tensor's views along its last axis."""
    columns = [
        t.columns if isinstance(t, Stacked) else [t[..., i] for i in range(t.shape[-1])]
        for t in cache
    ]
    layers = len(columns[0]) if columns else 0
    return [
        (f"{prefix}.{i}.{ENTRY}.{j}", cols[i])
        for i in range(layers)
        for j, cols in enumerate(columns)
    ]


def listed(cache: Any) -> bool:
    """Whether `cache` is a plain list of tensors (or of Stacked), not a cache object."""
    return isinstance(cache, (list, tuple)) and bool(cache) and all(_tensor_like(t) for t in cache)


def _tensor_like(t: Any) -> bool:
    return isinstance(t, Stacked) or (hasattr(t, "shape") and hasattr(t, "dtype"))


def held_apart(cache: list[Any]) -> list[Stacked]:
    """A listed cache made outside the recording (a cached step's past), each layer's entry a
    tensor of its own: the step's inputs."""
    return [Stacked([t[..., i].clone() for i in range(t.shape[-1])], t.dtype) for t in cache]


@contextmanager
def apart_in_layers(model: Any, box: Any, keyword: str, layers: list[str]) -> Iterator[None]:
    """Within the block, a listed cache the model makes itself (RWKV's state of a first step)
    and hands its first layer by `keyword` is held apart there: each entry a view of its
    stacked tensor, made before the layer (in the model's scope), and known to the recording
    by its name, so a repeated layer reads its own (`Recording.slots`)."""
    modules = dict(model.named_modules())

    def pre(module: Any, args: Any, kwargs: Any) -> None:
        cache = kwargs.get(keyword)
        if not isinstance(cache, list) or not listed(cache):
            return
        own = box.names.get(id(module))  # the layer's scope, entered just now: not yet
        top = box.stack.pop() if box.stack and box.stack[-1] == own else None
        try:
            for j, t in enumerate(cache):
                if isinstance(t, Stacked):
                    continue
                cache[j] = Stacked([t[..., i] for i in range(t.shape[-1])], t.dtype)
                for i, column in enumerate(cache[j].columns):
                    box.rec.slots[box.val(column).vid] = f"past_key_values.{i}.{ENTRY}.{j}"
        finally:
            if top is not None:
                box.stack.append(top)

    handles = [
        modules[path].register_forward_pre_hook(pre, with_kwargs=True, prepend=True)
        for path in layers
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
