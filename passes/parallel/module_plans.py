"""Seeds of a traced model's partition, from the parallel plans transformers declares for it.

A model traced from transformers' code keeps the plans of its classes (graph meta `tp_plan`,
`ep_plan`): module-name patterns (`model.layers.*.self_attn.q_proj`) mapped to styles, the
config's `base_model_tp_plan` / `base_model_ep_plan` under the base model's prefix and the
LM head's own entry. Each weight of a module a plan names is cut the way transformers' style cuts
it (transformers/distributed/tensor_parallel.py and expert_parallel.py):
- colwise, colwise_gather_output, colwise_rep, unit_colwise: the weight and its bias on the
  output axis (the heads of a projection viewed per head: tp divides them, as transformers
  requires of the key projections);
- rowwise, rowwise_split_input, rowwise_rep, unit_rowwise: the weight on its input axis; the bias
  stays whole and is added once, after the reduction;
- embedding_rowwise (embedding_colwise): the table on vocab (on the hidden axis);
- grouped_gemm (the expert plan): the stacked experts on the expert axis, over `--ep`;
- the replicated styles (replicated_with_grad_allreduce, mla_kv_a_proj, replicate, local,
  local_params, all_reduce, sequence_parallel, ep_dispatch_experts on a module): whole.
A style that cuts a fused weight into interleaved parts (packed_colwise, packed_rowwise,
moe_tp_experts) is left whole on every rank and said in a note; a style graphllm does not know
is refused by name. The propagation through the op table (sharding.py) does the rest: the
collectives each cut implies, and the gathers where a graph output is cut (the LM head's
logits, as colwise_gather_output gathers them).
"""

from __future__ import annotations

import re
from functools import cache

from graphllm.errors import ConfigError
from graphllm.ir import HEAD_ROLES, Graph, Node
from graphllm.passes.parallel.sharding import Sharding, Split

COLUMN = frozenset({"colwise", "colwise_gather_output", "colwise_rep", "unit_colwise"})
ROW = frozenset({"rowwise", "rowwise_split_input", "rowwise_rep", "unit_rowwise"})
WHOLE = frozenset(
    {
        "replicated_with_grad_allreduce",
        "mla_kv_a_proj",
        "replicate",
        "local",
        "local_params",
        "all_reduce",
        "sequence_parallel",
        "ep_dispatch_experts",
    }
)
INTERLEAVED = frozenset({"packed_colwise", "packed_rowwise", "moe_tp_experts"})
EXPERTS = frozenset({"grouped_gemm"})
EMBEDDING = {"embedding_rowwise": 0, "embedding_colwise": 1}
KNOWN = COLUMN | ROW | WHOLE | INTERLEAVED | EXPERTS | frozenset(EMBEDDING)


def heads_of(graph: Graph, p: Node) -> int | None:
    """Heads a projection's output is viewed as (the head axis of the view reading it)."""
    for lin in graph.users(p):
        for u in graph.users(lin):
            h = next((d for d in u.out.dims if d.role in HEAD_ROLES), None)
            if h is not None:
                return int(h.size)  # type: ignore[arg-type]
    return None


@cache
def _pattern(key: str) -> re.Pattern[str]:
    return re.compile(re.escape(key).replace(r"\*", r"\d+"))


def style_of(plan: dict[str, str], param: str) -> str | None:
    """The style `plan` gives weight `param`: its own entry, else its module's (as transformers
    matches them)."""
    module = param.rsplit(".", 1)[0]
    for name in (param, module):
        for key, style in plan.items():
            if _pattern(key).fullmatch(name):
                return style
    return None


def require_known(plans: dict[str, dict[str, str]], model: str) -> None:
    """One line naming every style of the plans that graphllm does not model."""
    unknown = sorted({s for plan in plans.values() for s in plan.values()} - KNOWN)
    if unknown:
        raise ConfigError(
            f"{model}'s parallel plan uses {', '.join(unknown)}, which graphllm does not model"
        )


def plan_seeds(
    graph: Graph, tp: int, ep: int, whole_vocab: bool = False
) -> tuple[dict[str, Sharding], list[str]]:
    """Seed shardings of the traced graph's weights for `--tp tp --ep ep`, and notes on what
    stays whole. `whole_vocab`: the embedding and LM head stay whole on every tp rank."""
    model = graph.meta["config"].name
    tp_plan, ep_plan = graph.meta.get("tp_plan") or {}, graph.meta.get("ep_plan") or {}
    if tp > 1 and not tp_plan:
        raise ConfigError(
            f"{model} declares no tensor-parallel plan (base_model_tp_plan): transformers "
            "gives no rule to cut its weights by, so graphllm has none: partition it with "
            "--pp, --dp" + (" or --ep" if ep_plan else "")
        )
    if ep > 1 and not ep_plan:
        raise ConfigError(
            f"{model} declares no expert-parallel plan (base_model_ep_plan): --ep has no "
            "experts to cut"
        )
    require_known({"tp": tp_plan, "ep": ep_plan}, model)
    out: dict[str, Sharding] = {}
    notes: set[str] = set()
    for p in graph.params():
        cuts: list[list[Split]] = [[] for _ in p.out.dims]
        if ep > 1 and style_of(ep_plan, p.name) in EXPERTS:
            _cut(cuts, p, 0, ("ep", ep), "experts")
        style = style_of(tp_plan, p.name) if tp > 1 else None
        if whole_vocab and p.attrs.get("kind") in ("embedding", "lm_head"):
            style = None
        if style is not None:
            _tp_cut(graph, p, style, tp, cuts, notes)
        if any(cuts):
            out[p.name] = Sharding(tuple(tuple(c) for c in cuts))
    return out, sorted(notes)


def _tp_cut(
    graph: Graph, p: Node, style: str, tp: int, cuts: list[list[Split]], notes: set[str]
) -> None:
    """Cut weight `p` for `style` over tp ranks (into `cuts`), or note why it stays whole."""
    rank = len(p.out.dims)
    if style in INTERLEAVED:
        notes.add(
            f"{style} weights (fused parts cut each in turn) stay whole on every tp rank: "
            "graphllm cuts an axis in contiguous blocks only"
        )
    elif style in EMBEDDING:
        _cut(cuts, p, EMBEDDING[style], ("tp", tp), "table")
    elif style in COLUMN:
        heads = heads_of(graph, p)
        if heads is not None and heads % tp:
            raise ConfigError(
                f"--tp {tp} does not divide the {heads} heads of {p.name}: transformers' plan "
                "cuts it by heads"
            )
        _cut(cuts, p, 0 if rank == 1 else rank - 2, ("tp", tp), "output rows")
    elif style in ROW and rank > 1:  # a bias is added whole, after the reduction
        _cut(cuts, p, rank - 1, ("tp", tp), "input columns")


def _cut(cuts: list[list[Split]], p: Node, axis: int, split: Split, what: str) -> None:
    size = p.out.dims[axis].size
    if isinstance(size, int) and size % split[1]:
        raise ConfigError(f"--{split[0]} {split[1]} does not divide the {size} {what} of {p.name}")
    cuts[axis].append(split)
