"""The `params` pass: exact parameter counts, total and active per token, by kind."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from graphllm.ir import Graph
from graphllm.passes import register

KINDS = (
    "embedding",
    "attention",
    "mlp",
    "moe_experts",
    "shared_experts",
    "router",
    "norms",
    "lm_head",
)


@dataclass(frozen=True)
class ParamReport:
    """`total` counts every stored weight once (a tied head once). `active` counts what one token
    touches: every non-routed weight plus k of the E routed experts in each MoE layer."""

    total: int
    active: int
    by_kind: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@register("params")
def count_params(graph: Graph, results: dict[str, Any] | None = None, **_: Any) -> ParamReport:
    by_kind = dict.fromkeys(KINDS, 0)
    active = 0
    for n in graph.params():
        numel = math.prod(d.size for d in n.out.dims)  # type: ignore[misc]
        kind = n.attrs["kind"]
        by_kind[kind] += numel
        if kind == "moe_experts":
            n_exp = n.out.dims[0].size  # stacked: the expert axis comes first
            k = graph.meta["config"].num_experts_per_tok
            assert numel % n_exp == 0
            active += numel // n_exp * k
        else:
            active += numel
    return ParamReport(sum(by_kind.values()), active, by_kind)
