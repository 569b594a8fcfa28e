"""Passes over the Graph: analyses (Graph -> Report) and transforms (Graph -> Graph).

Importing this package registers every built-in pass (graphllm.passes.registry holds the table).
"""

from graphllm.passes import cost, memory, params, roofline, tokens, verify  # noqa: F401
from graphllm.passes.parallel import partition  # noqa: F401
from graphllm.passes.registry import (
    PASSES,
    PassInfo,
    Results,
    forget,
    meta_result,
    register,
    run,
)

__all__ = ["PASSES", "PassInfo", "Results", "forget", "meta_result", "register", "run"]
