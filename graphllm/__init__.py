"""graphllm: decoder-only LLMs as explicit op graphs, analysed like a compiler would."""

from graphllm.builder import build_graph
from graphllm.errors import ConfigError, GraphError, GraphllmError, PassError
from graphllm.ir import Dim, Graph, Node, Ref, TensorType
from graphllm.model_config import ModelConfig
from graphllm.workload import Workload

__version__ = "0.1.0"


def load_config(source):
    from graphllm.config import load_config as _load

    return _load(source)


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
    "build_graph",
    "load_config",
]
