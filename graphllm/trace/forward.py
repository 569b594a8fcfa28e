"""Record a causal LM's forward at one (B, T, P) probe: prefill (P = 0) or a cached step.

The inputs are the ones graphllm's built graphs take (`input_ids`, `position_ids`, the past
cache as `past_key_values.{i}.*`); the outputs `logits` and the cache after the step
(`present.{i}.*`), each carried piece found by walking transformers' cache object (or, for a
cache kept as a plain list of tensors stacked over the layers, RWKV's `state`, each layer's
column: graphllm.trace.stacked), never by a layer's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import traceback
from collections.abc import Iterator
from typing import Any

from graphllm.errors import ConfigError, NoCacheError
from graphllm.ir import CACHE, STATE
from graphllm.trace.capture import Recording, recorder_modes
from graphllm.trace.expert_units import experts_units
from graphllm.trace.kernels import kernel_units, loop_functions, method_units
from graphllm.trace.layers import (
    Looped,
    Unlike,
    layer_index,
    layer_paths,
    replaying,
    representatives,
    split_kind,
)
from graphllm.trace.loops import loop_units
from graphllm.trace.routed_blocks import routed_units
from graphllm.trace.stacked import apart_in_layers, entries, held_apart, listed
from graphllm.trace.symbolic import Point
from graphllm.trace.units import lifting, lifting_experts, norm_units

# a cache layer's attribute -> the name its tensor has in graphllm's (and onnxruntime-genai's)
# inputs and outputs; any other tensor keeps its attribute's name
# what a cache layer keeps a position (tensors that grow with the tokens), and the name graphllm
# gives it: its keys and values, and a sparse layer's indexer keys (DSA)
_CACHE_NAMES = {"keys": "key", "values": "value", "indexer_keys": "indexer_keys"}


def record(model: Any, point: Point) -> Recording:
    """The forward of `model` at `point` as a Recording."""
    while True:
        try:
            return _record(model, point)
        except Looped:  # a looped model: every layer records each of its calls
            model._graphllm_layer_kinds = {}
        except Unlike as e:  # a layer that takes other dtypes: a kind of its own
            split_kind(model, e.path)


def _record(model: Any, point: Point) -> Recording:
    with _module_attributes_kept(model):  # the states a forward leaves on modules, dropped after
        return _record_step(model, point)


def _record_step(model: Any, point: Point) -> Recording:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    batch, seq, past = point
    rec = Recording()
    names = {id(m): n for n, m in model.named_modules() if n}
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    dispatch, functions, box = recorder_modes(rec, names)
    device = next(model.parameters()).device
    takes = inspect.signature(model.forward).parameters
    takes_positions = "position_ids" in takes
    cache_arg = cache_argument(model)
    # each norm, eager experts and ScatterMoE class checked on real values, before the fake
    # mode
    for checked in (norm_units, experts_units, routed_units):
        checked(model)
    attributes = _attribute_values(model)
    values = _buffer_values(model)
    # made before the fake mode: its counters (a window's length) are real tensors, constants
    handed = handed_cache(model)
    # the experts lifted in the prefill before a step too: their own code may not trace
    with mode, lifting_experts(model, box):
        tensors = _fake_weights(model, mode, box, values)
        holder = None if handed is None else model  # the states it keeps on its modules
        cache = _past(model, tensors, box, functions, (batch, past, takes_positions), handed)
        kwargs = _step_inputs(box, batch, seq, device, takes_positions)
        if cache is not None:
            kwargs[cache_arg] = cache
        hooks = box.scope_hooks()
        try:
            with (
                functions,
                dispatch,
                replaying(model, box),
                lifting(model, box),
                kernel_units(model),
                loop_units(model),
                apart_in_layers(model, box, cache_arg, layer_paths(model)),
                _tensor_attributes(model, mode, box, attributes),
            ):
                out = torch.func.functional_call(model, tensors, (), kwargs, strict=False)
                # before the attributes are restored
                states = [] if holder is None else module_states(model, "present")
        except (ConfigError, Looped, Unlike):
            raise
        except Exception as e:  # the model's own code failed on fake tensors: say where
            raise ConfigError(_failure(e, box.scope)) from None
        finally:
            for h in hooks:
                h.remove()
    _note_outputs(rec, box, out, cache, states)
    return rec


def _past(
    model: Any, tensors: Any, box: Any, functions: Any, sizes: tuple[int, int, bool], handed: Any
) -> Any:
    """The cache of a prefill of `past` tokens (without one, the cache a model that returns
    none is `handed`, or None), its tensors the recording's inputs: the step's past as
    transformers' cache object holds it (and the states its modules keep beside it)."""
    batch, past, positions = sizes
    if not past:
        return handed
    device = next(model.parameters()).device
    # (functions: a tensor deep-copied is cloned; loop_functions and method_units: one op for
    # a loop over the tokens)
    with box.quiet(), functions, loop_functions(model), method_units(model):
        cache = _prefill(model, tensors, batch, past, device, positions, handed)
        if listed(cache):  # each layer's entry a tensor of its own
            cache = held_apart(cache)
    holder = None if handed is None else model
    for name, t, _ in cache_tensors(cache, "past_key_values", holder):
        box.source(t, "input", name)
    for name, t in _counters(cache):  # bookkeeping: dropped unless read
        box.source(t, "input", name)
    return cache


def _step_inputs(box: Any, batch: int, seq: int, device: Any, positions: bool) -> dict[str, Any]:
    """The recorded step's input_ids (and position_ids, where the model takes them), each a
    source of the recording."""
    import torch

    ids = torch.zeros((batch, seq), dtype=torch.long, device=device)
    box.source(ids, "input", "input_ids")
    kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": True}
    if positions:
        kwargs["position_ids"] = pos = torch.zeros((batch, seq), dtype=torch.long, device=device)
        box.source(pos, "input", "position_ids")
    return kwargs


def cache_argument(model: Any) -> str:
    """The keyword a model's forward takes its cache by (Mamba2's `cache`, RWKV's `state`; any
    other keyword it would take and ignore)."""
    takes = inspect.signature(model.forward).parameters
    return next((k for k in ("cache", "state") if k in takes), "past_key_values")


def _buffer_values(model: Any) -> dict[str, Any]:
    """The buffers' values (None on the meta device), read before the fake mode takes every op."""
    return {
        n: None if b.device.type == "meta" else b.detach().float().numpy()
        for n, b in model.named_buffers()
    }


def _note_outputs(rec: Recording, box: Any, out: Any, handed: Any, states: list) -> None:
    """Into `rec`: the representative layers' notes, the logits and the cache the step wrote."""
    rec.layers = {
        k: {a: b for a, b in v.items() if a != "structure"} for k, v in box.layers.items()
    }
    rec.outputs["logits"] = (box.val(out.logits).vid, None)
    made = {vid for ev in rec.events for vid in ev.outs}
    cache = cache_of(out)
    carried = cache_tensors(handed if cache is None else cache, "present") + states
    for name, t, role in carried:
        vid = box.ids.get(id(t))
        if vid in made:  # what the step wrote, not a constant the layer keeps beside it
            rec.outputs[name] = (vid, role)


def _fake_weights(model: Any, mode: Any, box: Any, values: dict[str, Any]) -> dict[str, Any]:
    """The model's parameters and buffers as fake tensors, each a source of the recording."""
    tensors = {}
    repeats = tuple(f"{path}." for path in representatives(model))
    for name, p in model.named_parameters():
        if name.startswith(repeats):  # a repeated layer never runs: its representative does
            continue
        tensors[name] = fake = mode.from_tensor(p)
        box.source(fake, "param", name)
    stored = set(model.state_dict())  # a persistent buffer is a checkpoint tensor: a weight
    for name, b in model.named_buffers():
        tensors[name] = fake = mode.from_tensor(b)
        box.source(fake, "param" if name in stored else "constant", name, values[name])
    return tensors


def _attribute_values(model: Any) -> dict[tuple[str, str], Any]:
    """Tensors modules hold as plain attributes, neither weight nor buffer (longrope's long
    and short frequencies): (module path, attribute) -> the tensor and its value. Read once a
    model, before any forward: one may leave tensors of its own behind (a cache of cos/sin)."""
    import torch

    known = getattr(model, "_graphllm_tensor_attributes", None)
    if known is not None:
        return known
    out = {}
    for path, m in model.named_modules():
        for attr, t in vars(m).items():
            if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter):
                value = None if t.device.type == "meta" else t.detach().float().numpy()
                out[(path, attr)] = (t, value)
    model._graphllm_tensor_attributes = out
    return out


@contextlib.contextmanager
def _tensor_attributes(model: Any, mode: Any, box: Any, attributes: dict) -> Iterator[None]:
    """Within the block, each such attribute is a fake tensor of the recording, a constant."""
    modules = dict(model.named_modules())
    before = {path: dict(vars(m)) for path, m in modules.items()}
    for (path, attr), (t, value) in attributes.items():
        fake = mode.from_tensor(t)
        box.source(fake, "constant", f"{path}.{attr}" if path else attr, value)
        setattr(modules[path], attr, fake)
    try:
        yield
    finally:  # every module's attributes as they were: nothing of this forward stays behind
        for path, m in modules.items():
            for attr in [a for a in vars(m) if a not in before[path]]:
                delattr(m, attr)
            for attr, v in before[path].items():
                if vars(m).get(attr) is not v:
                    setattr(m, attr, v)


def _prefill(
    model: Any,
    tensors: dict[str, Any],
    batch: int,
    past: int,
    device: Any,
    positions: bool,
    handed: Any,
) -> Any:
    """The cache after `past` tokens: what a cached step starts from (not recorded).
    `handed`: the cache the model is given, for a model that returns none (it keeps the one it
    is handed), else None."""
    import torch

    ids = torch.zeros((batch, past), dtype=torch.long, device=device)
    kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": True}
    if positions:
        kwargs["position_ids"] = torch.zeros((batch, past), dtype=torch.long, device=device)
    if handed is not None:
        kwargs[cache_argument(model)] = handed
    out = torch.func.functional_call(model, tensors, (), kwargs, strict=False)
    cache = cache_of(out) if handed is None else handed
    if cache is None:
        raise NoCacheError("the model returns no cache, so a cached step cannot be traced")
    _refuse_whole_sequence_step(model)
    return cache


def cache_of(out: Any) -> Any:
    """The cache a forward's output holds, under the name the model gives it (`cache`,
    `past_key_values`, RWKV's `state`), or None."""
    for name in ("cache", "past_key_values", "state"):
        cache = getattr(out, name, None)
        if cache is not None:
            return cache
    return None


def _refuse_whole_sequence_step(model: Any) -> None:
    """A model that keeps a cache but whose generation feeds each cached step the whole
    sequence's ids (CPM-Ant: its forward prepends its prompt, numbers the positions and builds
    the mask over every token, then drops the cached prefix itself) has another step than
    graphllm's, which reads the new tokens alone: refused in one line."""
    import torch

    try:
        step = model.prepare_inputs_for_generation(
            torch.zeros((1, 3), dtype=torch.long), next_sequence_length=1
        )
    except Exception:  # generation that needs more than the ids: the step is judged by its run
        return
    ids = step.get("input_ids") if isinstance(step, dict) else None
    if ids is not None and ids.shape[-1] != 1:
        raise ConfigError(
            "the model's cached step reads the whole sequence's ids (its generation feeds them "
            "all after a cache, and its forward drops the cached prefix itself), where "
            "graphllm's cached step reads the new tokens alone"
        )


def handed_cache(model: Any) -> Any:
    """A new cache for a model whose forward takes one but whose output carries none
    (RecurrentGemma's CausalLMOutput): it keeps the cache it is handed, and makes one it never
    returns when handed none. None for any other model."""
    from transformers import DynamicCache

    returns = inspect.signature(type(model).forward).return_annotation
    if (
        not dataclasses.is_dataclass(returns)
        or "cache" not in inspect.signature(model.forward).parameters
    ):
        return None
    fields = {f.name for f in dataclasses.fields(returns)}
    if fields & {"past_key_values", "cache"}:
        return None
    return DynamicCache(config=model.config)


@contextlib.contextmanager
def _module_attributes_kept(model: Any) -> Iterator[None]:
    """Within the block, the model's modules may take tensors as attributes (the states a
    forward keeps on them); after it, each such attribute is what it was before (deleted where
    it is new). Other attributes (the layer kinds graphllm notes on the model) stay."""
    import torch

    before = {m: dict(vars(m)) for m in model.modules()}
    try:
        yield
    finally:
        for m, attrs in before.items():
            for attr, v in list(vars(m).items()):
                if not isinstance(v, torch.Tensor) or attrs.get(attr) is v:
                    continue
                if attr in attrs:
                    setattr(m, attr, attrs[attr])
                else:
                    delattr(m, attr)


def module_states(model: Any, prefix: str) -> list[tuple[str, Any, str]]:
    """(name, tensor, role) of each floating tensor a forward left on the model's modules as a
    plain attribute (RecurrentGemma's conv and RG-LRU states, which it keeps beside the cache
    object it is handed): `{prefix}.{layer}.{attribute}`, by the decoder layer holding the
    module."""
    import torch

    before = getattr(model, "_graphllm_tensor_attributes", {})
    out: dict[str, Any] = {}
    for path, m in model.named_modules():
        for attr, t in vars(m).items():
            if not isinstance(t, torch.Tensor) or isinstance(t, torch.nn.Parameter):
                continue
            if (path, attr) in before or not t.is_floating_point() or attr.startswith("_"):
                continue
            layer = layer_index(path)
            name = f"{prefix}.{layer}.{attr}"
            if layer is None or name in out:
                raise ConfigError(
                    f"{path} keeps a state {attr!r} on itself that graphllm cannot name by "
                    "its decoder layer (outside one, or a second of that name in it)"
                )
            out[name] = t
    return [(name, t, STATE) for name, t in out.items()]


def cache_tensors(cache: Any, prefix: str, model: Any = None) -> list[tuple[str, Any, str]]:
    """(name, tensor, role) of every tensor a cache object carries, layer by layer: its keys and
    values, and the states a linear-attention layer keeps by index (`conv_states`,
    `recurrent_states`, named in the singular where a layer keeps one of each); of a cache
    kept as a plain list of tensors stacked over the layers (RWKV's), each layer's entries
    (graphllm.trace.stacked). Integer tensors are its position counters, not model state.
    With `model`, the states its modules keep beside the cache too (`module_states`)."""
    import torch

    if listed(cache):
        return [(name, t, STATE) for name, t in entries(cache, prefix)]
    out = module_states(model, prefix) if model is not None else []
    for i, layer in enumerate(getattr(cache, "layers", None) or []):
        for attr, value in vars(layer).items():
            many = isinstance(value, (list, dict))
            items = dict(enumerate(value)) if isinstance(value, list) else value
            items = items if many else {0: value}
            tensors = {j: t for j, t in items.items() if isinstance(t, torch.Tensor)}
            for j, t in tensors.items():
                if t.numel() == 0 or not t.is_floating_point():
                    continue
                name = _CACHE_NAMES.get(attr, attr)
                if many:
                    name = name.removesuffix("s") if len(tensors) == 1 else f"{name}.{j}"
                role = CACHE if attr in _CACHE_NAMES else STATE
                out.append((f"{prefix}.{i}.{name}", t, role))
    for attr, value in vars(cache).items() if cache is not None else ():
        # states a cache object keeps itself, a list by layer (MiniMax's linear_cache)
        if attr != "layers" and isinstance(value, list):
            for i, t in enumerate(value):
                if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel():
                    out.append((f"{prefix}.{i}.{attr}", t, STATE))
    if cache is not None and not out and not hasattr(cache, "layers"):  # (none of a module's)
        raise ConfigError(f"graphllm does not read the cache object {type(cache).__name__}")
    return out


def _counters(cache: Any) -> list[tuple[str, Any]]:
    """The integer tensors a cache's layers keep (their token counts)."""
    import torch

    return [
        (f"past_key_values.{i}.{attr}", t)
        for i, layer in enumerate(getattr(cache, "layers", None) or [])
        for attr, t in vars(layer).items()
        if isinstance(t, torch.Tensor) and not t.is_floating_point()
    ]


def _failure(e: Exception, scope: str) -> str:
    where = scope or "the model"
    read = _value_read(e, where)
    if read:
        return read
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if len(first) > 200:
        first = first[:200] + "..."
    return f"the traced forward fails in {where}: {type(e).__name__}: {first}"


def _value_read(e: Exception, where: str) -> str | None:
    """The refusal of a model whose code reads a tensor's values where a trace has none (a
    `.item()`, a Python branch on a tensor, a shape chosen by the values): the construct and
    the line of the model's code that reads it; None for any other failure."""
    import torch
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
    )

    if isinstance(e, DataDependentOutputException):
        what = "reads a tensor's value in Python (.item(), a branch on a tensor)"
    elif isinstance(e, DynamicOutputShapeException):
        what = f"makes a tensor whose shape its values choose ({e.args[0] if e.args else 'op'})"
    else:
        return None
    # the model's own line: the last frame outside torch and graphllm's hooks
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    skip = (os.path.dirname(torch.__file__) + os.sep, package + os.sep)
    frames = [f for f in traceback.extract_tb(e.__traceback__) if not f.filename.startswith(skip)]
    at = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
    code = f": `{frames[-1].line}`" if frames and frames[-1].line else ""
    return f"{where} {what}{at}{code}, which a trace cannot follow"
