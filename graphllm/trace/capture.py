"""One forward of a transformers model on fake tensors, recorded as a list of events.

The model's parameters live on the meta device and its buffers (RoPE frequency tables) on the
CPU with their values; the forward runs under torch's FakeTensorMode, so nothing is computed and
any size costs the same. Three hooks record it:
- a TorchFunctionMode lifts `F.linear` whole (one `linear` event naming its weight), so a
  projection is not the views, transposes and matmuls it dispatches to;
- transformers' own extension points take the attention: an attention function registered under
  ATTENTION (one `attention` event: q, k, v, the mask and the module's scale, window, soft-cap
  and sinks) and a mask function (a `mask` event holding the mask function itself, which
  graphllm.trace.relation reads), so neither a score matrix nor a mask is computed;
- a TorchDispatchMode records every other aten op, with the module scope it ran in.
Tensors are numbered in the order they appear (`Val`), so two recordings of one model at other
sizes number theirs alike and graphllm.trace.symbolic can match them event by event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphllm.errors import ConfigError
from graphllm.trace.complex import is_complex_op, record_complex

ATTENTION = "graphllm_trace"  # the attn_implementation the traced model runs with
# the one a model that computes its attention itself runs with: its code is written for eager's
# masks (0 where a key is attended, the dtype's minimum where not), which its mask function gives
EAGER_MASKS = "graphllm_trace_eager"


@dataclass(frozen=True)
class Val:
    """A tensor of the recording, by number."""

    vid: int


@dataclass
class Event:
    """One recorded op: `op` is an aten overload ('aten::mm.default') or a unit ('linear',
    'attention', 'mask'); `args` the arguments with tensors as Val; `outs` the tensors made."""

    op: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    outs: tuple[int, ...]
    scope: str


@dataclass
class Recording:
    """A forward as events, and what its tensors are: `shapes` and `dtypes` per tensor;
    `sources` the tensors that come from outside the forward: ('param' | 'constant' | 'input',
    name); `values` a constant's value; `outputs` name -> (tensor, role)."""

    events: list[Event] = field(default_factory=list)
    shapes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    dtypes: dict[int, str] = field(default_factory=dict)
    sources: dict[int, tuple[str, str]] = field(default_factory=dict)
    values: dict[int, np.ndarray] = field(default_factory=dict)
    outputs: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    # module path -> its class name, for the scopes' kinds
    modules: dict[str, str] = field(default_factory=dict)
    # a representative decoder layer's path -> its events' span, input and output tensors
    # (graphllm.trace.layers)
    layers: dict[str, dict[str, Any]] = field(default_factory=dict)
    # tensors made in the forward that hold one layer's cache entry (a view of a cache kept
    # stacked over the layers, graphllm.trace.stacked) -> the entry's name, as an input's
    slots: dict[int, str] = field(default_factory=dict)


_DTYPES = {
    "torch.float64": "fp64",
    "torch.float32": "fp32",
    "torch.bfloat16": "bf16",
    "torch.float16": "fp16",
    "torch.int64": "int64",
    "torch.int32": "int32",
    "torch.bool": "bool",
}


def dtype_name(dtype: Any) -> str:
    name = _DTYPES.get(str(dtype))
    if name is None:
        raise ConfigError(f"the traced model computes in {dtype}, which graphllm does not model")
    return name


class _State:
    """What the hooks share while one forward is recorded (None between recordings)."""

    recorder: Any = None


STATE = _State()


def _attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kw: Any):
    """The attention function the traced model calls: one `attention` event."""
    import torch

    rec = STATE.recorder
    out_shape = (query.shape[0], query.shape[2], query.shape[1], value.shape[-1])
    with rec.quiet():
        out = torch.empty(out_shape, dtype=query.dtype, device=query.device)
    sinks = kw.get("s_aux", kw.get("sinks"))
    attrs = {
        "scaling": kw.get("scaling"),
        "sliding_window": kw.get("sliding_window"),
        "softcap": kw.get("softcap"),
        "is_causal": getattr(module, "is_causal", True),
    }
    # tensors the attention reads beyond q, k, v, the mask and the sinks: a bias added to the
    # scaled scores before the mask (Inkling's relative-position logits); the keys each query
    # reads, where the model hands its selection to a kernel rather than mask by it (DSA)
    extra = {k: kw[k] for k in ("position_bias", "indices") if kw.get(k) is not None}
    attrs["extra"] = tuple(extra)
    ins = (query, key, value, attention_mask, sinks, *extra.values())
    rec.unit("attention", ins, attrs, (out,))
    return out, None


def _mask(batch_size: int, q_length: int, kv_length: int, **kw: Any):
    """The mask function the traced model calls: a `mask` event holding the mask function; the
    mask is sdpa's form, True where a key is attended."""
    import torch

    return _mask_event((batch_size, 1, q_length, kv_length), torch.bool, kw, additive=False)


def _eager_mask(batch_size: int, q_length: int, kv_length: int, **kw: Any):
    """The mask function of EAGER_MASKS: the same event, the mask in eager's form (added to
    the scores: 0 where a key is attended, the dtype's minimum where not)."""
    import torch

    shape = (batch_size, 1, q_length, kv_length)
    return _mask_event(shape, kw.get("dtype", torch.float32), kw, additive=True)


def _mask_event(shape: tuple[int, ...], dtype: Any, kw: dict[str, Any], additive: bool) -> Any:
    import torch

    rec = STATE.recorder
    with rec.quiet():
        out = torch.ones(shape, dtype=dtype, device=kw.get("device", "meta"))
    attrs = {
        "function": kw.get("mask_function"),
        "q_offset": kw.get("q_offset", 0),
        "kv_offset": kw.get("kv_offset", 0),
        "q_length": shape[2],
        "kv_length": shape[3],
        "additive": additive,
    }
    rec.unit("mask", (), attrs, (out,))
    return out


# an experts module's activation class -> graphllm's row
_ACTIVATIONS = {"SiLU": "silu", "SiLUActivation": "silu", "GELUTanh": "gelu_tanh"}
_ACTIVATIONS |= {"PytorchGELUTanh": "gelu_tanh", "NewGELUActivation": "gelu_tanh"}


def _experts(module: Any, hidden: Any, top_k_index: Any, top_k_weights: Any) -> Any:
    """The experts function the traced model calls: one `experts` event (dispatch into slots,
    the experts' matmuls, the weighted combine) where graphllm has the rows for its form, else
    transformers' batched-matmul code, traced op by op."""
    import torch
    from transformers.integrations import moe

    act = _ACTIVATIONS.get(type(getattr(module, "act_fn", None)).__name__)
    plain = (
        act is not None
        and module.has_gate
        and not module.has_bias
        and not getattr(module, "has_post_expert_norm", False)
        and getattr(module, "is_concatenated", True)
        and type(module)._apply_gate is getattr(moe, "_default_apply_gate", None)
    )
    if not plain:
        return moe.batched_mm_experts_forward(module, hidden, top_k_index, top_k_weights)
    rec = STATE.recorder
    with rec.quiet():
        out = torch.empty_like(hidden)
    weights = (module.gate_up_proj, module.down_proj)
    layout = "matmul" if module.is_transposed else "linear"
    attrs = {"act": act, "roles": ("gate_up", "down"), "layouts": (layout, layout)}
    rec.unit("experts", (hidden, top_k_index, top_k_weights, *weights), attrs, (out,))
    return out


def register_attention() -> None:
    """Register ATTENTION with transformers' attention, mask and experts interfaces, and
    EAGER_MASKS with its attention and mask ones (once a process)."""
    from transformers.integrations.moe import ExpertsInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION, _attention)
    AttentionMaskInterface.register(ATTENTION, _mask)
    AttentionInterface.register(EAGER_MASKS, _attention)
    AttentionMaskInterface.register(EAGER_MASKS, _eager_mask)
    ExpertsInterface.register(ATTENTION, _experts)


def recorder_modes(rec: Recording, names: dict[int, str]) -> tuple[Any, Any, _Box]:
    """The dispatch mode, the function mode and the recorder of one recording; `names`:
    id(module) -> its path."""
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    box = _Box(rec, names)

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            keep = box.selects.get(box.scope) if func is torch.ops.aten.topk.default else None
            if keep is not None:
                args = _select_all(args, kwargs)
            out = func(*args, **kwargs)
            if box.silent == 0 and func.namespace == "aten":
                noted = {**kwargs, "keep": keep} if keep is not None else kwargs
                box.record(str(func), args, noted, out, torch)
            return out

    class Functions(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.linear and box.silent == 0:
                with box.quiet():
                    out = func(*args, **kwargs)
                bias = args[2] if len(args) > 2 else kwargs.get("bias")
                box.unit("linear", (args[0], args[1], bias), {}, (out,))
                return out
            if func is torch.Tensor.__deepcopy__:
                # a copy of its values (Inkling2-Loop's cache layers, one for each pass), not a
                # copy of its storage's bytes
                return args[0].clone()
            return func(*args, **kwargs)

    STATE.recorder = box
    return Dispatch(), Functions(), box


# a module's attribute holding the number of keys it selects for each query (DeepSeek Sparse
# Attention's indexer): a top-k it runs is a selection of keys
_SELECT_ATTRS = ("index_topk",)


def _select_all(args: tuple, kwargs: dict[str, Any]) -> tuple:
    """A selection's top-k run over the whole axis (recorded with the k it keeps as `keep`):
    the model's code takes min(k, keys), a branch on the length that no one recording holds for
    (every key below k); graphllm's `topk_select` row takes the min itself."""
    x, dim = args[0], (list(args[2:3]) or [kwargs.get("dim", -1)])[0]
    return (x, int(x.shape[dim]), *args[2:])


# the views an in-place write into is followed back to the tensor they view
_WRITABLE_VIEWS = {"slice", "select", "permute", "transpose", "view", "_unsafe_view"}
_WRITABLE_VIEWS |= {"unsqueeze", "squeeze", "reshape"}


class _Box:
    """The recorder itself: tensor numbering, the scope stack and a silence counter."""

    def __init__(self, rec: Recording, names: dict[int, str]) -> None:
        self.rec, self.names = rec, names
        self.ids: dict[int, int] = {}
        self.keep: list[Any] = []  # tensors stay alive, so their ids stay theirs
        self.silent = 0
        self.stack: list[str] = []
        # a selecting module's path -> the keys it keeps (_SELECT_ATTRS)
        self.selects: dict[str, int] = {}
        self.made_by: dict[int, int] = {}  # a tensor -> the event that made it
        # a conv's input -> the length transformers' cache would have padded it to
        # (graphllm.trace.kernels)
        self.padded_to: dict[int, int] = {}

    @contextlib.contextmanager
    def quiet(self) -> Iterator[None]:
        self.silent += 1
        try:
            yield
        finally:
            self.silent -= 1

    def scope_hooks(self) -> tuple[Any, Any]:
        """Module hooks that keep the stack of module paths: remove both when done."""
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        def pre(module: Any, args: Any) -> None:
            name = self.names.get(id(module))
            if name is not None:
                self.stack.append(name)
                self.rec.modules.setdefault(name, type(module).__name__)
                keep = [getattr(module, a) for a in _SELECT_ATTRS if hasattr(module, a)]
                if keep and isinstance(keep[0], int):
                    self.selects[name] = keep[0]

        def post(module: Any, args: Any, out: Any) -> None:
            if id(module) in self.names and self.stack:
                self.stack.pop()

        return register_module_forward_pre_hook(pre), register_module_forward_hook(post)

    @property
    def scope(self) -> str:
        return self.stack[-1] if self.stack else ""

    def source(self, t: Any, kind: str, name: str, value: np.ndarray | None = None) -> int:
        vid = self.number(t)
        self.rec.sources[vid] = (kind, name)
        if value is not None:
            self.rec.values[vid] = value
        return vid

    def number(self, t: Any) -> int:
        vid = len(self.keep)
        self.ids[id(t)] = vid
        self.keep.append(t)
        shape = tuple(int(s) for s in t.shape)
        if t.is_complex():  # its real and imaginary parts (graphllm.trace.complex)
            self.rec.shapes[vid], self.rec.dtypes[vid] = (*shape, 2), "fp32"
        else:
            self.rec.shapes[vid], self.rec.dtypes[vid] = shape, dtype_name(t.dtype)
        return vid

    def alias(self, t: Any, val: Val) -> None:
        """`t` is the tensor `val` under another view (its numbers unchanged)."""
        self.ids[id(t)] = val.vid
        self.keep.append(t)

    def emit(self, op: str, args: tuple, out: Any = None, shape: tuple | None = None) -> Val:
        """An event of `op` written by the recorder itself: its output is `out`, or a tensor
        of `shape` (fp32) that no torch tensor stands for."""
        if out is not None:
            vid = self.number(out)
        else:
            vid = len(self.keep)
            self.keep.append(None)
            self.rec.shapes[vid], self.rec.dtypes[vid] = tuple(int(s) for s in shape), "fp32"
        self.made_by[vid] = len(self.rec.events)
        self.rec.events.append(Event(op, args, {}, (vid,), self.scope))
        return Val(vid)

    def val(self, t: Any) -> Val:
        vid = self.ids.get(id(t))
        if vid is None:
            raise ConfigError(
                f"the traced model uses a tensor of shape {tuple(t.shape)} made outside the "
                f"recorded forward (in {self.scope or 'the model'}), which graphllm cannot follow"
            )
        return Val(vid)

    def encode(self, x: Any, torch: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if not _is_fake(x) and id(x) not in self.ids:  # a real tensor: a constant
                return Val(self.source(x, "constant", "", _value(x)))
            return self.val(x)
        if isinstance(x, (list, tuple)):
            return tuple(self.encode(v, torch) for v in x)
        if isinstance(x, (torch.dtype,)):
            return dtype_name(x)
        if isinstance(x, (torch.device, torch.layout, torch.memory_format)):
            return None
        if isinstance(x, torch.SymInt):
            return int(x)
        return x

    def record(self, op: str, args: Any, kwargs: dict[str, Any], out: Any, torch: Any) -> None:
        if is_complex_op(args, out, torch):
            record_complex(self, op, tuple(args), out, torch)
            return
        enc_args = self.encode(tuple(args), torch)
        enc_kw = {k: self.encode(v, torch) for k, v in kwargs.items()}
        outs = out if isinstance(out, (tuple, list)) else (out,)
        if not all(isinstance(o, torch.Tensor) for o in outs):
            if op.startswith("aten::_local_scalar_dense"):
                raise ConfigError(
                    f"{self.scope or 'the model'} reads a tensor's value in Python (.item()), "
                    "which a trace cannot follow"
                )
            return  # a size query: nothing computed
        if _identity(op, args):  # the tensor as it was: nothing to record
            return
        # an in-place op's output is its first argument: numbered anew, so its later readers
        # read the op's result
        vids = tuple(self.number(o) for o in outs)
        self.made_by.update(dict.fromkeys(vids, len(self.rec.events)))
        self.rec.events.append(Event(op, enc_args, enc_kw, vids, self.scope))
        view = args and getattr(args[0], "_base", None) is not None
        if op.split(".")[1].endswith("_") and view and isinstance(enc_args[0], Val):
            self.write_through(enc_args[0], vids[0])

    def write_through(self, view: Val, written: int) -> None:
        """An in-place write into a view of another tensor changes that tensor: recorded as the
        op that makes it anew from what was written. A slice or a row (a key filled in two
        parts, `k[..., :n].copy_(a)`; a padding row zeroed) is a slice_scatter (select_scatter);
        a view of all of it (a permute, a transpose, a reshape) is written through whole, the
        view undone. Any other view is refused: the tensor it views would keep its old value."""
        ev = self.rec.events[self.made_by[view.vid]] if view.vid in self.made_by else None
        kind = ev.op.split(".")[1] if ev is not None else ""
        viewed = self.keep[ev.args[0].vid] if ev is not None and kind in _WRITABLE_VIEWS else None
        if viewed is None or self.ids.get(id(viewed)) != ev.args[0].vid:  # type: ignore[union-attr]
            raise ConfigError(
                f"{self.scope or 'the model'} writes in place into a view of another tensor "
                f"({ev.op if ev else 'a view made outside the forward'}), which graphllm "
                "does not follow"
            )
        base, rest = ev.args[0], ev.args[1:]  # type: ignore[union-attr]
        if kind in ("slice", "select"):
            op, args = f"aten.{kind}_scatter.default", (base, Val(written), *rest)
        elif kind == "permute":
            inverse = tuple(sorted(range(len(rest[0])), key=lambda i: rest[0][i] % len(rest[0])))
            op, args = "aten.permute.default", (Val(written), inverse)
        elif kind == "transpose":
            op, args = "aten.transpose.int", (Val(written), *rest)
        else:  # a reshape of all of it
            op, args = "aten.view.default", (Val(written), tuple(viewed.shape))
        vid = self.number(viewed)
        self.made_by[vid] = len(self.rec.events)
        self.rec.events.append(Event(op, args, {}, (vid,), self.scope))

    def unit(
        self, op: str, args: tuple, attrs: dict[str, Any], outs: tuple, scope: str | None = None
    ) -> None:
        import torch

        if self.silent:  # inside another unit, or a forward that is not recorded
            return
        enc = tuple(self.encode(a, torch) if a is not None else None for a in args)
        vids = tuple(self.number(o) for o in outs)
        self.rec.events.append(Event(op, enc, attrs, vids, self.scope if scope is None else scope))


# in-place ops that leave a tensor as it was when their second argument is 1
_BY_ONE = {"aten.div_.Tensor", "aten.div_.Scalar", "aten.mul_.Tensor", "aten.mul_.Scalar"}


def _identity(op: str, args: Any) -> bool:
    """An in-place division or product by the number 1 (RWKV's rescale of the layers below
    `rescale_every`, by 2^0): it changes nothing, and recording it would give a weight a new
    tensor that the repeated layers, which read their own weights, never see."""
    return op in _BY_ONE and len(args) > 1 and type(args[1]) in (int, float) and args[1] == 1


def _is_fake(t: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor)


def _value(t: Any) -> np.ndarray | None:
    """A real tensor's value (one the model made from Python numbers under the fake mode)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    if t.numel() == 0:
        return np.zeros(tuple(t.shape), np.float32)
    with unset_fake_temporarily():
        try:
            return t.detach().cpu().float().numpy()
        except RuntimeError:
            return None
