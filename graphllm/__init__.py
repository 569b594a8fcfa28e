"""graphllm: decoder-only LLMs as explicit op graphs, analysed like a compiler would."""

import os

# onnxruntime's telemetry writes a device id and an event store (~/.cache/Microsoft/...,
# $TMPDIR/.ses) when it is imported, so it is turned off here, before any graphllm module can
# import it; child processes inherit the setting through the environment
os.environ["ORT_DISABLE_TELEMETRY"] = "1"

# isort: split

# the op rows register themselves on import: whatever a program imports first, the table is full
import graphllm.ops  # noqa: F401
from graphllm.build.builder import build_graph
from graphllm.errors import ConfigError, GraphError, GraphllmError, PassError
from graphllm.ir import Dim, Graph, Node, Ref, TensorType
from graphllm.models.config import load_config
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.report.analyse import analyse

__version__ = "0.1.0"


__all__ = [
    "ConfigError",
    "Dim",
    "Graph",
    "GraphError",
    "GraphllmError",
    "ModelConfig",
    "Node",
    "PassError",
    "Ref",
    "TensorType",
    "Workload",
    "analyse",
    "build_graph",
    "load_config",
]
