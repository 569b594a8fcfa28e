"""The IR: named dims with roles, tensor types, nodes, the Graph, axis signatures and op specs."""

from graphllm.ir.dims import HEAD_ROLES, ROLES, TOKEN_ROLES, Dim, TensorType
from graphllm.ir.graph import CACHE, OUTPUT_ROLES, STATE, Graph
from graphllm.ir.node import Node, Ref

__all__ = [
    "CACHE",
    "HEAD_ROLES",
    "OUTPUT_ROLES",
    "ROLES",
    "STATE",
    "TOKEN_ROLES",
    "Dim",
    "Graph",
    "Node",
    "Ref",
    "TensorType",
]
