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

# register the rows (recurrent, the hybrid layers' shared rows; delta, Qwen3-Next's;
# mamba, Nemotron-H's; mamba1, Mamba-1's; lightning, MiniMax-01's; lru, RecurrentGemma's
# RG-LRU; sparse, selected-keys attention's; wkv, RWKV's)
from graphllm.ops import (  # noqa: F401
    attention,
    collectives,
    core,
    delta,
    lightning,
    lru,
    mamba,
    mamba1,
    mla,
    moe,
    recurrent,
    sparse,
    wkv,
)

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
