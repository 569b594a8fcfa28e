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
from graphllm.trace.capture import ATTENTION, register_attention

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
    q = raw.get("quantization_config")
    if q:
        method = q.get("quant_method", "?") if isinstance(q, dict) else "?"
        raise ConfigError(
            f"quantization_config ({shown(method)}): a traced model's stored weights are not "
            "modelled yet; give the config without it to trace the model at its dtype"
        )
    fields = {k: _floats(v) for k, v in raw.items() if not k.startswith("_")}
    try:
        cfg = CONFIG_MAPPING[model_type](**fields)
    except Exception as e:  # transformers' and huggingface_hub's validation: one line
        first = str(e).strip().splitlines()
        said = " ".join(line.strip() for line in first[:2])[:300] if first else type(e).__name__
        raise ConfigError(f"transformers refuses this {model_type} config: {said}") from None
    if getattr(cfg, "is_decoder", None) is False and hasattr(cfg, "add_cross_attention"):
        raise ConfigError(
            f"model_type {model_type!r} is an encoder (bidirectional unless is_decoder is set): "
            "graphllm models decoder-only causal language models"
        )
    _refuse_drafter(cfg)
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
    # (the own-attention case), and its masks still come from graphllm's mask function
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
        model.config._attn_implementation = ATTENTION
    return model.eval()


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
    `model.*` is `backbone.*` on the Hub); or, where it splits it (routed experts held as one
    `experts.gate_up_proj`, stored one tensor an expert and a projection), the pieces and how
    they stack (`pieces`). A tensor stored some other way keeps its name, and is not found in a
    checkpoint: refused where it is read."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import revert_weight_conversion

    converters = get_model_conversion_mapping(model, add_legacy=False)
    if not converters:
        return {}
    out: dict[str, Any] = {}
    for name, t in model.state_dict().items():
        try:
            saved = revert_weight_conversion(model, {name: t})
        except Exception:  # a conversion that needs its partners: not a rename
            continue
        if len(saved) > 1:
            how = pieces(converters, name, tuple(t.shape), saved)
            if how is not None:
                out[name] = how
        elif len(saved) == 1:
            ((new, kept),) = saved.items()
            if new != name and tuple(kept.shape) == tuple(t.shape):
                out[name] = new
    # a name two tensors are saved under, or another tensor's own, is a merge (q, k and v into
    # one query_key_value), not a rename
    targets = Counter(v for v in out.values() if isinstance(v, str))
    names = set(model.state_dict())
    return {
        k: v
        for k, v in out.items()
        if not isinstance(v, str) or (targets[v] == 1 and v not in names)
    }


def pieces(
    converters: list[Any], name: str, shape: tuple[int, ...], saved: dict[str, Any]
) -> dict[str, Any] | None:
    """How a tensor saved split into `saved` is put back together, as the converter that
    merges it on loading does (transformers.core_model_loading): its source patterns' pieces,
    each in index order, stacked on MergeModulelist's axis, the patterns' stacks concatenated on
    Concatenate's. None for any other conversion (not read from a checkpoint)."""
    for conv in converters:
        targets = getattr(conv, "target_patterns", None) or []
        if not any(name.endswith(p) for p in targets):
            continue
        ops = {type(op).__name__: op for op in getattr(conv, "operations", [])}
        if set(ops) - {"MergeModulelist", "Concatenate"} or "MergeModulelist" not in ops:
            return None
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


def _in_order(pattern: str, saved: dict[str, Any]) -> list[str]:
    """The saved names matching a source pattern (`mlp.experts.*.gate_proj.weight`), by the
    index `*` stands for."""
    core = re.escape(pattern.lstrip(".")).replace(r"\*", r"(\d+)")
    rx = re.compile(r"(?:^|\.)" + core + "$")
    found = [(int(m.group(1)), k) for k in saved if (m := rx.search(k))]
    return [k for _, k in sorted(found)]


def parallel_plans(model: Any) -> dict[str, dict[str, str]]:
    """The tensor- and expert-parallel plans a transformers model resolved for itself
    (module-name patterns to styles: the config's base_model plans under the base model's
    prefix, and the LM head's own entry)."""
    return {
        "tp_plan": dict(getattr(model, "_tp_plan", None) or {}),
        "ep_plan": dict(getattr(model, "_ep_plan", None) or {}),
    }
