"""transformers' kernel-tagged functions recorded whole, as one unit each.

transformers marks the functions a kernel may replace with
`use_kernel_func_from_hub_with_fallback(name, package)`: the gated delta rule in its chunked and
its recurrent form (FLA's `chunk_gated_delta_rule`, `fused_recurrent_gated_delta_rule`; Kimi Delta
Attention's `chunk_kda`, `fused_recurrent_kda`, the rule with a decay per key channel), Mamba2's
chunked selective scan (mamba_ssm's `mamba_chunk_scan_combined`), Mamba-1's selective scan
(`selective_scan_fn`) and the causal depthwise convolution from a zero start
(`causal_conv1d_fn`). Their torch fallbacks loop over chunks or tokens in Python, so no trace at
one length holds at another; recorded whole (a `delta`, `ssm`, `ssm1` or `conv` event), they
lower onto rows whose FLOPs, bytes and mixing are the kernels'. A recurrence transformers loops
over in a method of the model's own class, untagged (the RG-LRU's `_rnn_scan`), is swapped by
the method's name and parameters (METHODS) and recorded the same way (an `lru` event).

A tagged function is found by its kernel name, in the modeling modules of the model's own
classes; within `kernel_units` each is swapped for a recording stand-in that
makes its outputs' shapes. A function that loops over the tokens in Python but carries no tag
(RWKV's `rwkv_linear_attention`, a `wkv` event) is found by its name there instead (`LOOPS`).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from graphllm.errors import ConfigError
from graphllm.trace.capture import STATE


def _delta(form: str) -> Callable[..., Any]:
    def unit(query: Any, key: Any, value: Any, g: Any, beta: Any, *args: Any, **kw: Any) -> Any:
        import torch

        rec = STATE.recorder
        chunk = args[0] if args else kw.get("chunk_size", 64)
        state0 = kw.get("initial_state", args[1] if len(args) > 1 else None)
        b, _, h, dv = value.shape
        with rec.quiet():
            out = torch.empty(value.shape, dtype=query.dtype, device=value.device)
            state = torch.empty((b, h, key.shape[-1], dv), dtype=torch.float32, device=value.device)
        attrs = {
            "form": form,
            "chunk": int(chunk),
            "l2norm": bool(kw.get("use_qk_l2norm_in_kernel")),
        }
        rec.unit("delta", (query, key, value, g, beta, state0), attrs, (out, state))
        return out, state if kw.get("output_final_state", False) else None

    return unit


def _conv_fn(x: Any, weight: Any, bias: Any = None, activation: Any = None, **kw: Any) -> Any:
    """A causal depthwise conv of (B, C, S) from a zero start: S outputs."""
    import torch

    rec = STATE.recorder
    with rec.quiet():
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    attrs = {"activation": activation, "padded_to": rec.padded_to.get(rec.ids.get(id(x)))}
    rec.unit("conv", (x, weight, bias), attrs, (out,))
    return out


def _first_conv_step(update: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' cache layer's conv-state update, in one form for any length at a first
    step. transformers pads a first step shorter than the kernel to K positions (its conv then
    runs on them) and keeps the last K: a branch on the length, so no one recording holds on
    both sides of K. The same state is the step padded (or cut) to K, and a conv from a zero
    start computes the step's outputs from the step alone; the conv's input is marked, so
    `reference_conv_flops` counts the K positions transformers' torch code convolves."""

    def step(layer: Any, x: Any, state_idx: int = 0, conv_kernel_size: Any = None, **kw: Any):
        import torch.nn.functional as F

        k = conv_kernel_size
        if layer.has_previous_state[state_idx] or layer.record_past or k is None:
            return update(layer, x, state_idx, conv_kernel_size, **kw)
        t = x.shape[-1]
        # K - T zeros before a shorter step; a negative pad keeps a longer one's last K
        update(layer, F.pad(x, (k - t, 0)), state_idx, conv_kernel_size, **kw)
        if state_idx == 0:  # the layer counted the K positions it was given: the step has T
            layer.cumulative_length_linear.add_(t - k)
        rec = STATE.recorder
        rec.padded_to[rec.val(x).vid] = int(k)
        return x

    return step


def _require_modelled(scan: str, *features: tuple[str, bool]) -> None:
    """One line naming every feature of a `scan` call that graphllm does not model (those
    whose flag is set)."""
    unmodelled = [what for what, present in features if present]
    if unmodelled:
        raise ConfigError(
            f"a {scan} scan with {', '.join(unmodelled)}, which graphllm does not model"
        )


# A, B, C and D: the names transformers passes them by
def _ssm_chunked(
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    chunk_size: int,
    D: Any = None,
    dt_bias: Any = None,
    initial_states: Any = None,
    dt_softplus: bool = False,
    dt_limit: tuple[float, float] = (0.0, float("inf")),
    return_final_states: bool = False,
    **kw: Any,
) -> Any:
    """Mamba2's chunked scan (mamba_ssm's `mamba_chunk_scan_combined` contract): x (B, T, H,
    P), dt (B, T, H) before its bias, A (H), B and C (B, T, G, N) -> y and the final state."""
    import torch

    rec = STATE.recorder
    _require_modelled(
        "Mamba2",
        ("no D skip", D is None),
        ("no dt_bias", dt_bias is None),
        ("dt without softplus", not dt_softplus),
        ("a gate z inside the scan", kw.get("z") is not None),
        ("an upper limit on dt", float(dt_limit[1]) != float("inf")),
    )
    bsz, _, h, p = x.shape
    with rec.quiet():
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        state = torch.empty((bsz, h, p, B.shape[-1]), dtype=torch.float32, device=x.device)
    attrs = {"chunk_size": int(chunk_size), "dt_min": float(dt_limit[0])}
    rec.unit("ssm", (x, dt, A, B, C, D, dt_bias, initial_states), attrs, (y, state))
    return (y, state) if return_final_states else y


# A, B, C, D and z: the names transformers passes them by
def _ssm1_scan(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    **kw: Any,
) -> Any:
    """Mamba-1's scan (mamba_ssm's `selective_scan_fn` contract): u and delta (B, D, T), A
    (D, N), B and C (B, N, T) -> y (B, D, T) and the last state (B, D, N), from a zero state."""
    import torch

    rec = STATE.recorder
    _require_modelled(
        "Mamba-1",
        ("no D skip", D is None),
        ("no gate z", z is None),
        ("no delta_bias", delta_bias is None),
        ("delta without softplus", not delta_softplus),
        ("B or C in groups", B.dim() != 3 or C.dim() != 3),
    )
    bsz, channels, _ = u.shape
    with rec.quiet():
        y = torch.empty(u.shape, dtype=u.dtype, device=u.device)
        state = torch.empty((bsz, channels, A.shape[-1]), dtype=torch.float32, device=u.device)
    rec.unit("ssm1", (u, delta, A, B, C, D, z, delta_bias), {}, (y, state))
    return (y, state) if return_last_state else y


def _wkv4(
    time_decay: Any,
    time_first: Any,
    key: Any,
    value: Any,
    state: Any = None,
    return_state: bool = False,
) -> Any:
    """RWKV-4's WKV recurrence (transformers' `rwkv_linear_attention` contract): key and value
    (B, T, D), time_decay and time_first (D), the state (num, den, max; each (B, D)) or None
    -> the output (B, T, D, the key's dtype) and the final state, a list of three (fp32), where
    a state came in or is asked for."""
    import torch

    rec = STATE.recorder
    bsz, _, channels = key.shape
    with rec.quiet():
        out = torch.empty(key.shape, dtype=key.dtype, device=key.device)
        final = [
            torch.empty((bsz, channels), dtype=torch.float32, device=key.device) for _ in range(3)
        ]
    carried = tuple(state) if state is not None else ()
    rec.unit("wkv", (key, value, time_decay, time_first, *carried), {}, (out, *final))
    return out, final if (return_state or state is not None) else None


def _linear_recurrence(
    module: Any,
    hidden_states: Any,
    recurrent_gate: Any,
    reset: Any,
    recurrent_states: Any = None,
    acc_dtype: Any = None,
) -> Any:
    """The RG-LRU's scan (transformers' `RecurrentGemmaRglru._rnn_scan` contract): x and a
    (B, T, D), the reset at a document's first position (B, T, 1), the carried state (B, D) or
    None (zeros) -> y (B, T, D) and the final state in fp32. The decay's reset is the model's
    own elementwise code, traced; the loop over the tokens is the unit."""
    import torch

    _require_modelled(
        "RG-LRU", ("an accumulator other than fp32", acc_dtype not in (None, torch.float32))
    )
    rec = STATE.recorder
    decay = recurrent_gate * ~reset
    bsz, _, width = hidden_states.shape
    with rec.quiet():
        y = torch.empty(hidden_states.shape, dtype=hidden_states.dtype, device=decay.device)
        state = torch.empty((bsz, width), dtype=torch.float32, device=decay.device)
    rec.unit("lru", (hidden_states, decay, recurrent_states), {}, (y, state))
    return y, state


# a method of a model's own class that loops over the tokens in Python, untagged -> its
# recording stand-in, and the parameters it must take (by name, in order) to be that contract
METHODS: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {
    "_rnn_scan": (
        _linear_recurrence,
        ("self", "hidden_states", "recurrent_gate", "reset", "recurrent_states", "acc_dtype"),
    ),
}


# the kernel name transformers tags a function with -> its recording stand-in. Mamba-1's
# `selective_state_update` needs none: transformers calls it for one new token after a past
# (or in a loop over tokens, which no one recording follows), and the decode probes take
# several; the lowering steps from the carried state at one token (graphllm.trace.recurrences).
# `mamba_inner_fn` runs only in training.
UNITS: dict[str, Callable[..., Any]] = {
    "chunk_gated_delta_rule": _delta("chunked"),
    "fused_recurrent_gated_delta_rule": _delta("step"),
    # KDA: the same contract with g per key channel (B, T, H, d_k)
    "chunk_kda": _delta("chunked"),
    "fused_recurrent_kda": _delta("step"),
    "causal_conv1d_fn": _conv_fn,
    "mamba_chunk_scan_combined": _ssm_chunked,
    "selective_scan_fn": _ssm1_scan,
}

# functions that loop over the tokens in Python and carry no kernel tag, by the name their
# modeling module gives them -> the recording stand-in: RWKV's WKV recurrence (its CUDA kernel is
# loaded by the model's own code, and the dispatcher runs the torch loop without it)
LOOPS: dict[str, Callable[..., Any]] = {"rwkv_linear_attention": _wkv4}


def kernel_name(fn: Any) -> str | None:
    """The kernel name a tagged function carries, else None: the `kernel_layer_name` of the
    module `kernels` makes of it, or (without `kernels`) the name transformers' fallback
    wrapper closes over."""
    name = getattr(type(fn), "kernel_layer_name", None)
    if name is None and inspect.isfunction(fn) and hasattr(fn, "__wrapped__"):
        try:
            name = inspect.getclosurevars(fn).nonlocals.get("func_name")
        except (TypeError, ValueError):
            return None
    return name if isinstance(name, str) else None


def tagged(model: Any) -> list[tuple[Any, str, str]]:
    """(modeling module, global name, kernel name) of each tagged function the model's classes'
    modules hold."""
    modules = {sys.modules.get(type(m).__module__) for m in model.modules()}
    out = []
    for mod in modules:
        for attr, fn in list(vars(mod).items()) if mod is not None else ():
            name = kernel_name(fn)
            if name is not None:
                out.append((mod, attr, name))
    return out


def _loops(model: Any) -> list[tuple[Any, str]]:
    """(modeling module, global name) of each function of LOOPS the model's classes' modules
    hold."""
    modules = {sys.modules.get(type(m).__module__) for m in model.modules()}
    return [
        (mod, attr)
        for mod in modules
        if mod is not None
        for attr in LOOPS
        if callable(vars(mod).get(attr))
    ]


@contextmanager
def loop_functions(model: Any) -> Iterator[None]:
    """Within the block, each function of LOOPS the model's modules hold records one event
    (nothing while the recorder is quiet: a cached step's past, run before the step and not
    recorded, then costs one op a layer, not a Python loop over its tokens)."""
    looped = [(mod, attr, vars(mod)[attr]) for mod, attr in _loops(model)]
    for mod, attr, _ in looped:
        setattr(mod, attr, LOOPS[attr])
    try:
        yield
    finally:
        for mod, attr, fn in looped:
            setattr(mod, attr, fn)


@contextmanager
def kernel_units(model: Any) -> Iterator[None]:
    """Within the block, each tagged function graphllm has a unit for records one event, and
    the cache's conv states start in one form for any length."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    swapped = [
        (mod, attr, getattr(mod, attr)) for mod, attr, name in tagged(model) if name in UNITS
    ]
    for mod, attr, _ in swapped:
        setattr(mod, attr, UNITS[kernel_name(getattr(mod, attr))])  # type: ignore[index]
    layers = [
        (cls, vars(cls)["update_conv_state"])
        for cls in _subclasses(LinearAttentionCacheLayerMixin)
        if _updates_conv(cls)
    ]
    for cls, update in layers:
        cls.update_conv_state = _first_conv_step(update)  # type: ignore[attr-defined]
    try:
        with loop_functions(model), method_units(model):
            yield
    finally:
        for mod, attr, fn in swapped:
            setattr(mod, attr, fn)
        for cls, update in layers:
            cls.update_conv_state = update  # type: ignore[attr-defined]


@contextmanager
def method_units(model: Any) -> Iterator[None]:
    """Within the block, each method of METHODS the model's classes define is its stand-in:
    in a recorded forward one event, in an unrecorded one (a past's prefill) no Python loop
    over its tokens (a window's thousands)."""
    methods = own_methods(model)
    for cls, attr, _ in methods:
        setattr(cls, attr, METHODS[attr][0])
    try:
        yield
    finally:
        for cls, attr, fn in methods:
            setattr(cls, attr, fn)


def own_methods(model: Any) -> list[tuple[type, str, Any]]:
    """(class, method name, method) of each method in METHODS that a class of the model's
    modules defines itself with that contract's parameters."""
    out = []
    for cls in {type(m) for m in model.modules()}:
        for attr, (_, params) in METHODS.items():
            fn = vars(cls).get(attr)
            if inspect.isfunction(fn) and tuple(inspect.signature(fn).parameters) == params:
                out.append((cls, attr, fn))
    return out


def _subclasses(cls: type) -> list[type]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _subclasses(sub))]


def _updates_conv(cls: type) -> bool:
    """Whether `cls` defines the conv-state update itself (not abstractly)."""
    fn = vars(cls).get("update_conv_state")
    return fn is not None and not getattr(fn, "__isabstractmethod__", False)
