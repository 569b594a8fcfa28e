"""The IR: named dims with roles, tensor types, nodes, the Graph, axis signatures and op specs."""

from graphllm.ir.dims import ROLES, TOKEN_ROLES, Dim, TensorType
from graphllm.ir.graph import Graph, Node, Ref

__all__ = ["ROLES", "TOKEN_ROLES", "Dim", "Graph", "Node", "Ref", "TensorType"]
