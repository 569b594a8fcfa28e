"""The op table: one row per op kind, declared as data (graphllm.ir.opspec says what a row holds).

Importing this package registers every row; the rows live one module per family of ops.
"""

from graphllm.ir.opspec import (
    CATEGORIES,
    COMMUNICATION,
    CONTRACTION,
    ELEMENTWISE,
    MOVEMENT,
    OPS,
    REDUCTION,
    SOURCE,
    OpSpec,
    bind_node,
    infer,
    letter_sizes,
    linear_groups,
    node_flops,
)
from graphllm.ops import attention, collectives, core, mamba, mla, moe  # noqa: F401  (the rows)

__all__ = [
    "CATEGORIES",
    "COMMUNICATION",
    "CONTRACTION",
    "ELEMENTWISE",
    "MOVEMENT",
    "OPS",
    "REDUCTION",
    "SOURCE",
    "OpSpec",
    "bind_node",
    "infer",
    "letter_sizes",
    "linear_groups",
    "node_flops",
]
