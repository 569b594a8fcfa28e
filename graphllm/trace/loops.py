"""Model methods whose torch code loops over blocks or tokens in Python, with no kernel tag to
swap them by (graphllm.trace.kernels): a table of stand-ins, each run in the method's place.

A stand-in runs the method's own code before and after its loop, op for op under the recorder,
and records the loop as one unit. It is written from one version of the method: the method's
source (from its `def` on) is fingerprinted, and a model whose method's source is not the one
its stand-in was written from is refused in one line rather than traced as the older code.

- MiniMax-01's lightning attention (`MiniMaxLightningAttention.forward`): from a zero state
  transformers loops over blocks of `block_size` positions, from the cache's state over the
  new tokens (the intra-block scores under a decay mask, the state read and updated); the
  loop is one `lightning` event (graphllm.ops.lightning), the state the cache keeps in its
  `linear_cache` list read before it and written after it, as the method does.
"""

from __future__ import annotations

import hashlib
import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from graphllm.errors import ConfigError
from graphllm.trace.capture import STATE


def _lightning_forward(
    self: Any,
    hidden_states: Any,
    position_embeddings: Any = None,
    attention_mask: Any = None,
    cache: Any = None,
    **kwargs: Any,
) -> tuple[Any, Any]:
    """MiniMaxLightningAttention.forward with its block and token loops one `lightning` unit."""
    import torch
    import torch.nn.functional as F

    own = sys.modules[type(self).__module__]  # the modeling module's padding helper
    cache = cache if cache is not None else kwargs.get("past_key_values")
    batch, seq, _ = hidden_states.shape
    heads, width = self.num_attention_heads, self.head_dim
    qkv = self.act_fn(self.qkv_proj(hidden_states))
    qkv = own.apply_mask_to_padding_states(qkv, attention_mask)
    qkv = qkv.reshape(batch, seq, heads, 3 * width)
    q, k, v = (x.transpose(1, 2) for x in torch.split(qkv, width, dim=3))
    state0 = cache.get_linear_cache(self.layer_idx) if cache is not None else None
    rec = STATE.recorder
    with rec.quiet():
        out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
        state = torch.empty((batch, heads, width, width), dtype=v.dtype, device=v.device)
    # the decay tables beside the rate are read as the method reads them (their powers of the
    # rate are the kernel's to compute; the lowering keeps them as the checkpoint's tensors)
    tables = (self.query_decay, self.key_decay, self.diagonal_decay)
    attrs = {"block": int(self.block_size)}
    rec.unit("lightning", (q, k, v, self.slope_rate, *tables, state0), attrs, (out, state))
    out = out.transpose(1, 2).reshape(batch, seq, heads * width)
    out = self.norm(out)
    out = F.sigmoid(self.output_gate(hidden_states)) * out
    out = self.out_proj(out)
    if cache is not None:
        cache.set_linear_cache(self.layer_idx, state)
    return out, state


# (class name, method) -> (the fingerprint of the method's source its stand-in reproduces,
# the stand-in); transformers 5.25's source
METHODS: dict[tuple[str, str], tuple[str, Callable[..., Any]]] = {
    ("MiniMaxLightningAttention", "forward"): ("024f8feec2d07c75", _lightning_forward),
}


def fingerprint(fn: Any) -> str:
    """The first 16 hex digits of the sha256 of a method's source from its `def` on (its
    decorators left out: they rename arguments, they compute nothing)."""
    lines = inspect.getsource(inspect.unwrap(fn)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("def "))
    return hashlib.sha256("\n".join(lines[start:]).encode()).hexdigest()[:16]


@contextmanager
def loop_units(model: Any) -> Iterator[None]:
    """Within the block, each method of the model's classes that METHODS holds runs its
    stand-in; a method whose source is not its stand-in's is refused (before any is swapped)."""
    swapped = [
        (cls, attr, vars(cls)[attr], stand_in)
        for cls in {type(m) for m in model.modules()}
        for (name, attr), (known, stand_in) in METHODS.items()
        if cls.__name__ == name and attr in vars(cls) and _held_to(cls, attr, known)
    ]
    for cls, attr, _, stand_in in swapped:
        setattr(cls, attr, stand_in)
    try:
        yield
    finally:
        for cls, attr, fn, _ in swapped:
            setattr(cls, attr, fn)


def _held_to(cls: type, attr: str, known: str) -> bool:
    """True where the method's source is the one its stand-in reproduces; else refused."""
    try:
        found = fingerprint(vars(cls)[attr])
    except (OSError, TypeError):  # no source to read: nothing to hold it to
        found = None
    if found != known:
        raise ConfigError(
            f"{cls.__name__}.{attr} is not the code graphllm records its loop from "
            "(transformers 5.25's): its loop over blocks and tokens is not modelled"
        )
    return True
