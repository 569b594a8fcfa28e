"""A Hub config.json -> transformers' own config and causal-LM model, for the traced frontend.

graphllm never runs code from a config: a config that needs remote code (`auto_map`) is
refused, and the model class is the one the installed transformers maps the model_type to.
"""

from __future__ import annotations

import inspect
import re
from collections import Counter
from typing import Any

from graphllm.echo import shown
from graphllm.errors import ConfigError
from graphllm.models.parse import json_float
from graphllm.trace.capture import ATTENTION, EAGER_MASKS, register_attention

INSTALL = "pip install 'graphllm[parity]' torch"


def require_transformers() -> Any:
    """The transformers module, or a ConfigError saying what to install."""
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as e:
        raise ConfigError(
            f"tracing a model graphllm does not build needs torch and transformers ({e.name} "
            f"is missing): {INSTALL}"
        ) from None
    return transformers


def hf_config(raw: dict[str, Any]) -> Any:
    """transformers' config of a causal LM from its config.json's fields; a multimodal
    wrapper's text decoder where the model_type is one (its text_config)."""
    transformers = require_transformers()
    # transformers' notices (deprecated arguments, fallbacks to torch code, token ids past a
    # small vocabulary) are about running or training the model, which a trace does not
    transformers.logging.set_verbosity_error()
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type = raw.get("model_type")
    if raw.get("auto_map") and not (isinstance(model_type, str) and model_type in CONFIG_MAPPING):
        raise ConfigError(
            f"model_type {shown(model_type)} needs the model's own code (auto_map), which "
            f"transformers {transformers.__version__} does not implement; graphllm never runs "
            "code from a config"
        )
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        raise ConfigError(
            f"unknown model_type {shown(model_type)}: neither a graphllm family nor "
            f"transformers {transformers.__version__} implements it"
        )
    # how the checkpoint stores its weights is graphllm's to model (graphllm.trace.stored), not
    # transformers' model's: built from the config alone, its quantizers are never applied
    fields = {
        k: _floats(v)
        for k, v in raw.items()
        if not k.startswith("_") and k != "quantization_config"
    }
    try:
        cfg = CONFIG_MAPPING[model_type](**fields)
    except Exception as e:  # transformers' and huggingface_hub's validation: one line
        first = str(e).strip().splitlines()
        said = " ".join(line.strip() for line in first[:2])[:300] if first else type(e).__name__
        raise ConfigError(f"transformers refuses this {model_type} config: {said}") from None
    _refuse_encoder(cfg)
    _refuse_drafter(cfg)
    _refuse_rescaling(cfg)
    text = getattr(cfg, "text_config", None)
    if text is None:  # a wrapper's text config class holds its family's sizes as defaults
        _require_sizes(raw, cfg)
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or (
        text is not None and text.model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    ):
        if text is None or text.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise ConfigError(
                f"model_type {model_type!r} is not a causal language model in transformers "
                f"{transformers.__version__}"
            )
        text.multimodal_model_type = model_type
        cfg = text
    return cfg


def causal_lm(cfg: Any, values: bool, dtype: str) -> Any:
    """The causal LM of `cfg` in eval mode: parameters on the meta device (no memory, any
    size), or with values (random) on the CPU for a model that is to run."""
    import torch
    from transformers import AutoModelForCausalLM

    register_attention()
    # a model that picks its attention classes by the implementation's name (GPT-Neo, GIT)
    # takes no registered function: it is built with its eager attention, recorded op by op
    # (the own-attention case), and its masks still come from graphllm's mask function, in
    # the eager form its code applies (MPT casts it to bool and fills where it is True)
    own = not _supports_attention_backend(cfg)
    cfg._attn_implementation = "eager" if own else ATTENTION
    if hasattr(cfg, "_experts_implementation"):
        # graphllm's experts (graphllm.trace.capture): routed experts onto graphllm's MoE rows
        # where it has them, else transformers' batched matmuls, traceable at any dtype (the
        # grouped_mm meta kernel takes bf16 alone, the eager loop reads routing values)
        cfg._experts_implementation = ATTENTION
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    device = torch.device("cpu" if values else "meta")
    try:
        with device:
            model = AutoModelForCausalLM.from_config(cfg, dtype=torch_dtype)
    except (TypeError, ValueError, KeyError, AttributeError, RuntimeError) as e:
        raise ConfigError(
            f"transformers cannot build this {cfg.model_type} model: {str(e).splitlines()[0]}"
        ) from None
    if own:
        model.config._attn_implementation = EAGER_MASKS
    return model.eval()


def _refuse_rescaling(cfg: Any) -> None:
    """A model that rescales itself at inference: RWKV's `rescale_every` N, with which its
    first forward in eval mode divides layer i's output projections by 2^(i // N) in place and
    every later one halves the hidden state after each N-th layer (an fp16 overflow guard).
    Below N layers neither happens (the division is by 1)."""
    every, layers = getattr(cfg, "rescale_every", 0), getattr(cfg, "num_hidden_layers", 0)
    if isinstance(every, int) and isinstance(layers, int) and 0 < every <= layers:
        raise ConfigError(
            f"rescale_every={every} with {layers} layers: transformers divides layer i's "
            f"output weights by 2^(i // {every}) at inference and halves the hidden state "
            f"every {every} layers, which graphllm does not model (rescale_every=0 turns it off)"
        )


def _refuse_encoder(cfg: Any) -> None:
    """A config whose model attends both ways: an encoder not set as a decoder, or one whose
    `causal` is False (XLM's default: a masked LM's attention)."""
    if getattr(cfg, "is_decoder", None) is False and hasattr(cfg, "add_cross_attention"):
        raise ConfigError(
            f"model_type {cfg.model_type!r} is an encoder (bidirectional unless is_decoder is "
            "set): graphllm models decoder-only causal language models"
        )
    if getattr(cfg, "causal", None) is False:
        raise ConfigError(
            f"model_type {cfg.model_type!r} is a bidirectional encoder here (its config's "
            "causal is False): graphllm models decoder-only causal language models"
        )


def _refuse_drafter(cfg: Any) -> None:
    """A speculative-decoding drafter (Gemma 4's assistant) runs on its target model's
    embeddings and KV states (`shared_kv_states`): no forward of its own to trace."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(cfg), None)
    if cls is not None and "shared_kv_states" in inspect.signature(cls.forward).parameters:
        raise ConfigError(
            f"model_type {cfg.model_type!r} is a drafter that attends to its target model's KV "
            "states (shared_kv_states), not a causal LM that runs on its own"
        )


def _supports_attention_backend(cfg: Any) -> bool:
    """Whether the causal-LM class of `cfg` calls the attention function registered under the
    config's implementation name (transformers' `_supports_attention_backend`)."""
    from transformers import MODEL_FOR_CAUSAL_LM_MAPPING

    cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(cfg), None)
    return cls is None or bool(getattr(cls, "_supports_attention_backend", False))


def _floats(x: Any) -> Any:
    """A config value with transformers 5's {"__float__": "Infinity"} as the float it stands for
    (the config class takes floats)."""
    if isinstance(x, dict):
        if set(x) == {"__float__"}:
            return json_float(x)
        return {k: _floats(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_floats(v) for v in x]
    return x


# the sizes a config must give itself: transformers' defaults would stand in for them silently
REQUIRED = ("vocab_size", "hidden_size", "num_hidden_layers")


def _require_sizes(raw: dict[str, Any], cfg: Any) -> None:
    stored = getattr(cfg, "attribute_map", {})  # a public name -> the field that holds it
    missing = [
        f
        for f in REQUIRED
        if hasattr(cfg, f)
        and not {f, stored.get(f)} & set(raw)
        # a size the config class derives from other fields (Nemotron-H's layer count from
        # its pattern) is not a default standing in
        and not isinstance(getattr(type(cfg), f, None), property)
    ]
    if missing:
        raise ConfigError(
            f"missing required field{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(f) for f in missing)} for model_type {cfg.model_type!r} "
            "(transformers' defaults would stand in for them)"
        )


def checkpoint_names(model: Any) -> dict[str, Any]:
    """The model's tensor name -> how its checkpoints store it, as transformers' own
    revert_weight_conversion saves it: a name, where it renames the tensor (Nemotron-H's
    `model.*` is `backbone.*` on the Hub); where it stores it in pieces (routed experts held as
    one `experts.gate_up_proj`, stored one tensor an expert and a projection; OLMo-Hybrid's
    conv1d, stored as a q, a k and a v conv), the pieces and how they join (`pieces`); where it
    joins it with others (q, k and v in one `query_key_value`), its slice of the joined tensor
    (`slices`); where it stores it transposed, the stored tensor and the axes (`transposed`);
    where the conversion is one graphllm does not read, `{"unread": its
    operations}`, refused where the tensor is read. A tensor no conversion names keeps its
    name."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    converters = get_model_conversion_mapping(model, add_legacy=False)
    if not converters:
        return {}
    reverse = _reversed(converters)
    state = model.state_dict()
    out: dict[str, Any] = {}
    # the tensors a converter saves joined in one, by (converter, the joined tensor's name)
    joined: dict[tuple[int, str], tuple[Any, list[tuple[int, str]]]] = {}
    for name, t in state.items():
        saved = _reverted(model, {name: t})
        found = _converter_of(reverse, name)
        if found is None:  # renamed at most
            if saved is not None and len(saved) == 1:
                ((new, kept),) = saved.items()
                if new != name and tuple(kept.shape) == tuple(t.shape):
                    out[name] = new
            continue
        conv, index = found
        if _kinds(conv) in SPLIT_ON_LOADING and saved is not None and len(saved) == 1:
            joined.setdefault((id(conv), next(iter(saved))), (conv, []))[1].append((index, name))
            continue
        how = pieces([conv], name, tuple(t.shape), saved) if saved else None
        how = how or (transposed(conv, tuple(t.shape), saved) if saved else None)
        out[name] = how if how is not None else unread(conv)
    for conv, group in joined.values():
        out |= _joined(model, conv, [n for _, n in sorted(group)], state)
    # a name two tensors are saved under, or another tensor's own, is not a rename
    targets = Counter(v for v in out.values() if isinstance(v, str))
    return {
        k: v
        for k, v in out.items()
        if not isinstance(v, str) or (targets[v] == 1 and v not in state)
    }


# the operations (transformers.core_model_loading's classes) of a conversion that splits one
# stored tensor into several of the model's on loading, which `slices` reads
SPLIT_ON_LOADING = (("Split",), ("Chunk",))


def _kinds(conv: Any) -> tuple[str, ...]:
    return tuple(type(op).__name__ for op in getattr(conv, "operations", []))


def unread(conv: Any) -> dict[str, str]:
    """A tensor stored through a conversion graphllm does not read, named by its operations."""
    return {"unread": ", ".join(_kinds(conv)) or type(conv).__name__}


def _reversed(converters: list[Any]) -> list[tuple[Any, Any]]:
    """(converter, its reverse) of each converter, in the order revert_weight_conversion tries
    them (the last first); a converter with no reverse (a quantizer's) is left out."""
    out = []
    for conv in converters[::-1]:
        if not hasattr(conv, "operations"):  # a renaming, applied by revert_weight_conversion
            continue
        try:
            out.append((conv, conv.reverse_transform()))
        except ValueError:
            continue
    return out


def _converter_of(reverse: list[tuple[Any, Any]], name: str) -> tuple[Any, int] | None:
    """The converter that saves the model's tensor `name` (the first whose reverse matches it,
    as revert_weight_conversion picks it) and the index of its target pattern that matched."""
    for conv, rev in reverse:
        _, pattern = rev.rename_source_key(name)
        if pattern is not None:
            return conv, rev.source_patterns.index(pattern)
    return None


def _reverted(model: Any, tensors: dict[str, Any]) -> dict[str, Any] | None:
    """The tensors as save_pretrained writes them; None where the conversion needs partners."""
    from transformers.core_model_loading import revert_weight_conversion

    try:
        return revert_weight_conversion(model, tensors)
    except Exception:  # a conversion that cannot save these tensors alone
        return None


def _joined(model: Any, conv: Any, names: list[str], state: dict[str, Any]) -> dict[str, Any]:
    """The model's tensors `names` (in the converter's target order) that save_pretrained
    joins into one: each one's slice of it, or unread."""
    whole = _reverted(model, {n: state[n] for n in names})
    if whole is None or len(whole) != 1:
        return dict.fromkeys(names, unread(conv))
    ((stored, t),) = whole.items()
    parts = [(n, tuple(state[n].shape)) for n in names]
    got = slices(conv, parts, stored, tuple(t.shape))
    return got if got is not None else dict.fromkeys(names, unread(conv))


def slices(
    conv: Any, parts: list[tuple[str, tuple[int, ...]]], stored: str, shape: tuple[int, ...]
) -> dict[str, dict[str, Any]] | None:
    """Each of the model's tensors `parts` (name, shape), in the order of the converter's target
    patterns, as its slice of the one tensor `stored` (of `shape`) a checkpoint keeps them in,
    which transformers' converter splits on loading: Split (each target as long as the model's
    tensor on the axis) or Chunk (equal parts). None for any other conversion, or parts that
    do not make the stored tensor."""
    kinds = _kinds(conv)
    if kinds not in SPLIT_ON_LOADING or len(getattr(conv, "source_patterns", [])) != 1:
        return None
    op = conv.operations[0]
    if getattr(op, "num_shards_attribute", None) is not None:  # as many parts as a config says
        return None
    if len(parts) != len(conv.target_patterns) or not shape:
        return None
    if any(len(p) != len(shape) for _, p in parts):
        return None
    axis = op.dim % len(shape)
    sizes = [p[axis] for _, p in parts]
    rest = {p[:axis] + p[axis + 1 :] for _, p in parts}
    if rest != {shape[:axis] + shape[axis + 1 :]} or sum(sizes) != shape[axis]:
        return None
    if kinds == ("Chunk",) and len(set(sizes)) != 1:  # torch.chunk makes equal parts here
        return None
    out, start = {}, 0
    for (name, _), size in zip(parts, sizes, strict=True):
        out[name] = {"slice_of": stored, "axis": axis, "start": start, "stop": start + size}
        out[name]["size"] = shape[axis]
        start += size
    return out


def transposed(conv: Any, shape: tuple[int, ...], saved: dict[str, Any]) -> dict[str, Any] | None:
    """A tensor a checkpoint stores transposed (Ergo's router and shared expert, stored
    (in, out)), which transformers' Transpose swaps back on loading: the stored tensor and the
    two axes. None for any other conversion, or a Transpose that swaps only where the shapes
    differ (`check_dims`)."""
    if _kinds(conv) != ("Transpose",) or len(saved) != 1:
        return None
    op = conv.operations[0]
    if getattr(op, "check_dims", False) or len(shape) < 2:
        return None
    ((stored, t),) = saved.items()
    axes = sorted((op.dim0 % len(shape), op.dim1 % len(shape)))
    swapped = list(shape)
    swapped[axes[0]], swapped[axes[1]] = shape[axes[1]], shape[axes[0]]
    if tuple(t.shape) != tuple(swapped):
        return None
    return {"transpose_of": stored, "axes": axes}


def pieces(
    converters: list[Any], name: str, shape: tuple[int, ...], saved: dict[str, Any]
) -> dict[str, Any] | None:
    """How a tensor saved split into `saved` is put back together, as the converter that
    merges it on loading does (transformers.core_model_loading): its source patterns' pieces,
    each in index order, stacked on MergeModulelist's axis, the patterns' stacks concatenated on
    Concatenate's; or, with Concatenate alone, each source pattern's one piece concatenated
    (`stack` None). None for any other conversion (not read from a checkpoint)."""
    for conv in converters:
        targets = getattr(conv, "target_patterns", None) or []
        if not any(name.endswith(p) for p in targets):
            continue
        ops = {type(op).__name__: op for op in getattr(conv, "operations", [])}
        if not ops or set(ops) - {"MergeModulelist", "Concatenate"}:
            return None
        if "MergeModulelist" not in ops:
            return _concatenated(conv, ops["Concatenate"], shape, saved)
        groups = [_in_order(p, saved) for p in conv.source_patterns]
        stack, concat = ops["MergeModulelist"].dim, getattr(ops.get("Concatenate"), "dim", None)
        widths = [tuple(saved[g[0]].shape) if g else () for g in groups]
        if not all(groups) or len(set(len(g) for g in groups)) != 1:
            return None
        rebuilt = list(widths[0])
        rebuilt.insert(stack, len(groups[0]))
        if concat is not None:
            rebuilt[concat] = sum(w[concat - (concat > stack)] for w in widths)
        if tuple(rebuilt) != shape or (concat is None and len(groups) != 1):
            return None
        return {"parts": groups, "stack": stack, "concat": concat}
    return None


def _concatenated(
    conv: Any, op: Any, shape: tuple[int, ...], saved: dict[str, Any]
) -> dict[str, Any] | None:
    """A tensor stored as one piece a source pattern (none of them a `*` list), joined on
    Concatenate's axis on loading."""
    if getattr(op, "num_shards_attribute", None) is not None:
        return None
    groups = [_in_order(p, saved) for p in conv.source_patterns]
    if any(len(g) != 1 for g in groups) or len(groups) != len(saved):
        return None
    widths = [tuple(saved[g[0]].shape) for g in groups]
    if not shape or any(len(w) != len(shape) for w in widths):
        return None
    axis = op.dim % len(shape)
    rest = {w[:axis] + w[axis + 1 :] for w in widths}
    if rest != {shape[:axis] + shape[axis + 1 :]} or sum(w[axis] for w in widths) != shape[axis]:
        return None
    return {"parts": groups, "stack": None, "concat": axis}


def _in_order(pattern: str, saved: dict[str, Any]) -> list[str]:
    """The saved names matching a source pattern (`mlp.experts.*.gate_proj.weight`), by the
    index `*` stands for. The pattern is a regex, `*.` any name part and a word's end a name's,
    as transformers' WeightTransform reads it (DeepSeek-V4's `\\.experts.*.w1.weight`); `*` is
    an index here."""
    core = pattern.replace("*.", r"(?P<index>\d+)\.")
    rx = re.compile(core + (r"(?!\w)" if re.search(r"[a-zA-Z0-9]$", pattern) else ""))
    found = [(int(m.groupdict().get("index") or 0), k) for k in saved if (m := rx.search(k))]
    return [k for _, k in sorted(found)]


def parallel_plans(model: Any) -> dict[str, dict[str, str]]:
    """The tensor- and expert-parallel plans a transformers model resolved for itself
    (module-name patterns to styles: the config's base_model plans under the base model's
    prefix, and the LM head's own entry)."""
    return {
        "tp_plan": dict(getattr(model, "_tp_plan", None) or {}),
        "ep_plan": dict(getattr(model, "_ep_plan", None) or {}),
    }
