"""Nodes (op applications) and refs (the tensors on edges), and the view of a graph that the op
table's rules read: below both graphllm.ir.graph (which infers each node's types from the table
as it is added) and graphllm.ir.opspec (whose rules read a node's inputs' types)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from graphllm.ir.dims import TensorType


class Ref(NamedTuple):
    """One output of a node: the tensor on an edge."""

    node: str
    index: int = 0


@dataclass(slots=True, eq=False)
class Node:
    """An op application. `meta` is where passes leave typed results."""

    name: str
    op: str
    inputs: tuple[Ref, ...]
    attrs: dict[str, Any]
    outputs: tuple[TensorType, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def out(self) -> TensorType:
        return self.outputs[0]

    def __str__(self) -> str:
        return self.name


class GraphView(Protocol):
    """What the op table's rules read of a graph (graphllm.ir.graph.Graph is one): the symbolic
    dims' bindings, its meta (the activation dtypes) and the types on a node's inputs."""

    bindings: dict[str, float]
    meta: dict[str, Any]

    def input_types(self, node: Node) -> list[TensorType]: ...
