"""The `params` pass: exact parameter counts, total and active per token, by kind."""

from __future__ import annotations

import math
from collections.abc import Container, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from graphllm.build.kinds import WEIGHT_KINDS
from graphllm.ir import Graph, Node
from graphllm.passes.cost import scopes_of
from graphllm.passes.registry import register

KINDS = WEIGHT_KINDS  # the keys of `by_kind`, in order


@dataclass(frozen=True)
class ParamReport:
    """`total` counts every stored weight once (a tied head once). `active` counts what one token
    touches: every non-routed weight plus k of the E routed experts in each MoE layer. `mtp`
    counts the weights of the multi-token-prediction modules (scopes of kind `mtp`, DeepSeek-V3
    built with mtp=True), which `total` and `active` include; the main model is total - mtp.

    Vendors publish active counts under other conventions (OpenAI's gpt-oss figures
    leave the input embedding out, GLM's the embedding and the output head), so beside `active`
    stand `active_without_embedding` (less every input embedding table that is not also the
    head) and `active_without_embedding_and_head` (less the output heads too)."""

    total: int
    active: int
    by_kind: dict[str, int]
    mtp: int = 0
    active_without_embedding: int = 0
    active_without_embedding_and_head: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@register("params")
def count_params(graph: Graph, results: dict[str, Any] | None = None) -> ParamReport:
    in_mtp = {
        n.name for n in graph.params() if any(k == "mtp" for _, k in scopes_of(graph, n.name))
    }
    return tally(graph.params(), graph.meta["config"], in_mtp)


def tally(params: Iterable[Node], config: Any, in_mtp: Container[str] = ()) -> ParamReport:
    """The parameter report of these weight nodes (`in_mtp`: the names in an MTP module)."""
    by_kind = dict.fromkeys(KINDS, 0)
    active = mtp = 0
    for n in params:
        numel = math.prod(d.size for d in n.out.dims)  # type: ignore[misc]
        kind = n.attrs["kind"]
        by_kind[kind] += numel
        if n.name in in_mtp:
            mtp += numel
        if kind == "moe_experts":
            # stacked: the expert axis comes first, or a flat stack's rows hold them (DBRX's)
            n_exp = n.attrs.get("experts") or n.out.dims[0].size
            k = config.num_experts_per_tok
            assert numel % n_exp == 0
            active += numel // n_exp * k
        else:
            active += numel
    # a tied table is also the head every token reads: it stays in the count without embedding
    tied = config.tie_word_embeddings
    no_embed = active - (0 if tied else by_kind["embedding"])
    no_embed_head = active - by_kind["embedding"] - by_kind["lm_head"]
    return ParamReport(sum(by_kind.values()), active, by_kind, mtp, no_embed, no_embed_head)
