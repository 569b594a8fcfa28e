"""ONNX export: op sets (decomposed, standard, ort), their lowerings, and the file writer.

Importing this package registers every lowering.
"""

# register the lowerings (recurrent, the hybrid layers' shared rows; delta, Qwen3-Next's;
# mamba, Nemotron-H's; mamba1, Mamba-1's; lightning, MiniMax-01's; lru, the RG-LRU's; sparse,
# selected-keys attention's; wkv, RWKV's; traced, the generic rows of a traced model)
from graphllm.exporters.onnx import (  # noqa: F401
    decomposed,
    delta,
    fused,
    lightning,
    lru,
    mamba,
    mamba1,
    mla,
    recurrent,
    sparse,
    traced,
    wkv,
)
from graphllm.exporters.onnx.export import (
    ExportedModel,
    ExportResult,
    export_onnx,
    metadata_from_props,
    read_metadata,
)
from graphllm.exporters.onnx.fused import DEFAULT_LOWERINGS, default_lowering
from graphllm.exporters.onnx.lowering import EXPORT_DTYPES, LOWERINGS, LoweringError, lower

__all__ = [
    "DEFAULT_LOWERINGS",
    "EXPORT_DTYPES",
    "LOWERINGS",
    "ExportResult",
    "ExportedModel",
    "LoweringError",
    "default_lowering",
    "export_onnx",
    "lower",
    "metadata_from_props",
    "read_metadata",
]
