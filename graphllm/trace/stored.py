"""How a traced model's checkpoint stores its weights: its `quantization_config`, read with the
built families' rules (graphllm.models.quantization), applied to the traced param nodes.

transformers' quantizers convert modules by what they are, not by their names: FP8 and
compressed-tensors every `nn.Linear` (its class exactly) and every fused `.experts` module,
MXFP4 the experts alone, GPTQ and AWQ the decoder layers' linear modules; each adds the model's
`_keep_in_fp32_modules` to its skip list (GPTQ excepted), and where the config gives none the
default skips (the output embedding). The trace reads those from the model it ran
(`quantized_modules`) and the builder kind each weight counts under from its scope
(graphllm.trace.scopes.param_kind); `Quantization.format_of` then says its stored format, as for
a built graph's param of that kind. Any other tensor (an embedding, a norm, a router that is no
nn.Linear, a bias) is stored at the checkpoint's dtype. A fused stack that the checkpoint keeps
as pieces joined on a matrix axis (`gate_up_proj`: a gate and an up projection an expert) is
stored as those pieces, each with its own scales: `stored_parts` says how many equal parts, on
which axis.
"""

from __future__ import annotations

from typing import Any

from graphllm.errors import ConfigError
from graphllm.ir import TensorType
from graphllm.models.config import quantization_of
from graphllm.models.quantization import (
    LINEAR_KINDS,
    MIXER_KINDS,
    QuantFormat,
    Quantization,
    should_convert_module,
)

LINEAR = "linear"  # the weight of an nn.Linear module (its class exactly)
EXPERTS = "experts"  # a tensor of a fused `.experts` module


def traced_quantization(raw: dict[str, Any]) -> Quantization | None:
    """The quantization a config.json's fields declare (a multimodal wrapper's text_config's
    where the top level has none); None for a checkpoint at its dtype. A method or field the
    built families do not model is refused as they refuse it, every one at once."""
    q = quantization_of(raw)
    text = raw.get("text_config")
    if isinstance(text, dict) and text.get("quantization_config") is not None:
        own = quantization_of({"dtype": raw.get("dtype", raw.get("torch_dtype")), **text})
        if q is not None and own != q:
            raise ConfigError("quantization_config: the top level's and text_config's differ")
        q = q or own
    return q


def quantized_modules(model: Any) -> dict[str, Any]:
    """What a quantizer reads of the model: `modules`, param name -> LINEAR or EXPERTS for the
    tensors of the modules it converts; `fp32`, the patterns of the modules the model keeps in
    float32 (`_keep_in_fp32_modules`: DeepSeek-V3.2's indexer.weights_proj), which every method
    but GPTQ leaves unconverted; `default`, what it skips where the config gives no list (the
    output embedding and tied weights: transformers' get_keys_to_not_convert)."""
    from torch import nn
    from transformers.quantizers.base import get_keys_to_not_convert

    modules: dict[str, str] = {}
    for path, module in model.named_modules():
        if path.endswith(".experts") or path == "experts":
            for name, _ in module.named_parameters(recurse=False):
                modules[f"{path}.{name}"] = EXPERTS
        elif type(module) is nn.Linear:
            modules[f"{path}.weight" if path else "weight"] = LINEAR
    fp32 = sorted(getattr(model, "_keep_in_fp32_modules", None) or ())
    return {"modules": modules, "fp32": fp32, "default": list(get_keys_to_not_convert(model))}


def stored_form(
    q: Quantization, name: str, kind: str, model: dict[str, Any], t: TensorType, stored_as: Any
) -> tuple[TensorType, dict[str, Any]]:
    """The type of param `name` (builder kind `kind`; `model`: quantized_modules of the model)
    as the checkpoint stores it, and the attributes that say so."""
    fmt, parts = checkpoint_form(q, name, kind, model, t, stored_as)
    if fmt is None:
        return TensorType(t.dims, q.dtype), {}
    attrs: dict[str, Any] = {"stored": fmt}
    if parts is not None:
        attrs["stored_parts"] = parts
    return TensorType(t.dims, fmt.dtype), attrs


def checkpoint_form(
    q: Quantization, name: str, kind: str, model: dict[str, Any], t: TensorType, stored_as: Any
) -> tuple[QuantFormat | None, tuple[int, int] | None]:
    """How the checkpoint stores param `name`: its format (None: at the checkpoint's dtype)
    and, for a stack kept as equal pieces joined on a matrix axis, (axis, count)."""
    what = model.get("modules", {}).get(name)
    if what is None or t.rank < 2 or not should_convert_module(_module(name), _skips(q, model)):
        return None, None
    fmt = q.format_of(name, _quantizer_kind(q, kind, what))
    return fmt, (_parts(name, t, stored_as) if fmt is not None else None)


def _module(name: str) -> str:
    return name.removesuffix(".weight") if name.endswith(".weight") else name.rsplit(".", 1)[0]


def _skips(q: Quantization, model: dict[str, Any]) -> list[str]:
    """The model's own skips that transformers adds to the config's for this method."""
    out = list(model.get("default", ())) if q.default_skips and q.converts != "layers" else []
    return out + (list(model.get("fp32", ())) if q.method != "gptq" else [])


def _quantizer_kind(q: Quantization, kind: str, what: str) -> str:
    """The builder kind `format_of` reads a converted module's weight as: the experts' stacks
    are routed experts; an nn.Linear is its scope's kind where that names a matrix, else an
    MLP's. A router that is an nn.Linear (AFMoE's) is converted where every linear module is
    (FP8, compressed-tensors), and stays a router for GPTQ and AWQ, whose kernels leave
    routers unquantized."""
    if what == EXPERTS:
        return "moe_experts"
    if kind == "router":
        return "router" if q.converts == "layers" else "mlp"
    return kind if kind in LINEAR_KINDS | MIXER_KINDS else "mlp"


def _parts(name: str, t: TensorType, stored_as: Any) -> tuple[int, int] | None:
    """(axis, count): a stack the checkpoint keeps as `count` equal pieces joined on a matrix
    axis (transformers' Concatenate of MergeModulelists); None where it keeps it whole or
    stacks the pieces on a leading axis only."""
    if not isinstance(stored_as, dict) or stored_as.get("concat") is None:
        return None
    axis, count = stored_as["concat"] % t.rank, len(stored_as["parts"])
    size = t.dims[axis].size
    if axis < t.rank - 2 or count < 2:
        return None
    if size is None or size % count:
        raise ConfigError(
            f"{name}: its checkpoint joins {count} quantized pieces on axis {axis} of "
            f"{size}, not equal parts: their scales are not modelled"
        )
    return axis, count
