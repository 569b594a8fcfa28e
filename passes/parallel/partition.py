"""The `partition` pass: tensor, sequence, context, pipeline, expert and data parallelism.

A `Strategy` becomes a device mesh (`dp`, `pp`, `cp`, `ep`, `tp`, outermost first, and `mb` for
microbatches run one after another) and a few seed shardings on the graph's inputs and weights;
`graphllm.passes.sharding` propagates them through the op table and inserts the collectives. The
result is the program of one rank, itself a Graph (local dims such as `h/8`), that the cost,
memory and roofline passes and the numpy SPMD interpreter (graphllm/spmd.py) take as they are.

Seeds (nothing else is decided per layer):
- tp: each weight that reads the residual stream is cut on its output axis (column-parallel Q/K/V,
  gate/up, experts' gate/up, the LM head on vocab), each that writes it on its input axis
  (row-parallel o_proj, down; experts' down); the embedding table on vocab. K/V projections with
  fewer heads than ranks are cut per head and each head is held by tp/heads ranks. Routers stay
  whole, and so do fused projections that a split cuts apart (phi3's qkv and gate_up).
- sp: partial sums on the tp axis are reduce-scattered onto the tokens instead of all-reduced.
- cp: the token ids and positions are cut on T.
- ep: the stacked expert weights are cut on the expert axis, and the tokens on B (when ep divides
  the batch each rank sees) or else on T.
- dp, microbatches: the token ids, positions and past K/V are cut on B.
- pp: contiguous layers per stage, balanced by the predicted time of each layer; a send/recv pair
  carries each tensor a later stage reads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from graphllm.echo import shown
from graphllm.errors import ConfigError
from graphllm.ir import TOKEN_ROLES, Dim, Graph, Node, Ref
from graphllm.limits import require_at_most
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.ops import COMMUNICATION, MOVEMENT, OPS, SOURCE
from graphllm.passes.cost import layer_scopes, layer_slots
from graphllm.passes.memory import peak_activations
from graphllm.passes.parallel.figures import (
    Collective,
    Figures,
    bubble,
    comm_seconds,
    gradient_seconds,
    step_seconds,
    tally,
)
from graphllm.passes.parallel.module_plans import heads_of, plan_seeds
from graphllm.passes.parallel.sharding import Mesh, Sharding, Split, hoist_gathers, spmd
from graphllm.passes.registry import forget, meta_result, register, run
from graphllm.passes.training import TrainingOptions, training_memory

MESH_ORDER = ("dp", "mb", "pp", "cp", "ep", "tp")  # outermost first: tp ranks share a node
# Devices of one mesh: the largest published training clusters hold about 100,000 GPUs; the
# partition report lists every device (a second and some 100 bytes of JSON a thousand of them).
MAX_DEVICES = 1 << 17
WHY_DEVICES = "about the largest published training clusters, 100,000 GPUs"


@dataclass(frozen=True)
class Strategy:
    """Sizes of each kind of parallelism (1: none); `sp` adds sequence parallelism to tp.
    `whole_vocab`: tp leaves the embedding table and the LM head whole on every rank, as an
    engine that shards only the layers does (gpt-fast's tp.py); each rank then reads the whole
    LM head every step and the logits need no gather."""

    tp: int = 1
    sp: bool = False
    cp: int = 1
    pp: int = 1
    ep: int = 1
    dp: int = 1
    microbatches: int = 1
    whole_vocab: bool = False

    @property
    def devices(self) -> int:
        return self.tp * self.cp * self.pp * self.ep * self.dp

    def describe(self) -> str:
        parts = [f"{k}={getattr(self, k)}" for k in ("dp", "pp", "cp", "ep", "tp")]
        parts = [p for p in parts if not p.endswith("=1")]
        if self.sp:
            parts.append("sp")
        if self.microbatches > 1:
            parts.append(f"microbatches={self.microbatches}")
        if self.whole_vocab and self.tp > 1:
            parts.append("whole_vocab")
        return " ".join(parts) or "one device"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.whole_vocab:  # a report of the default reads as it did before the option
            del d["whole_vocab"]
        return d


def decode_strategy(s: Strategy) -> Strategy:
    """The strategy of a one-token step: cp and sp cut the tokens, and there is one."""
    return replace(s, cp=1, sp=False)


@dataclass(frozen=True)
class PartitionPlan:
    """What the partitioned graph's meta['partition'] holds."""

    strategy: Strategy
    mesh: Mesh
    stages: tuple[tuple[int, int], ...]  # first and last layer of each pipeline stage
    token_split: dict[str, str]  # mesh axis -> the role of the axis it cuts the tokens on
    notes: tuple[str, ...] = ()


def _check(ok: bool, msg: str) -> None:
    if not ok:
        raise ConfigError(msg)


def validate(cfg: ModelConfig, wl: Workload, s: Strategy) -> dict[str, str]:
    """One clear line for a strategy the model or workload cannot take; where tokens are cut.
    A traced model's widths are checked as its plans cut them (module_plans.py)."""
    _require_sizes(s)
    if getattr(cfg, "frontend", "built") != "traced":
        _require_tp(cfg, s)
    if s.ep > 1:
        _check(cfg.is_moe, f"--ep needs a mixture-of-experts model; {cfg.name} has no experts")
        e = cfg.num_experts
        _check(e % s.ep == 0, f"--ep {s.ep} does not divide the {e} experts")
    t = wl.seq_len
    _check(t % s.cp == 0, f"--cp {s.cp} does not divide the {t} new tokens (--seq-len)")
    n = cfg.num_hidden_layers
    _check(s.pp <= n, f"--pp {s.pp} is more than the {n} layers: a stage needs one at least")
    b = wl.batch
    _check(b % s.dp == 0, f"--dp {s.dp} does not divide the batch {b}")
    m = s.microbatches
    _check((b // s.dp) % m == 0, f"--microbatches {m} does not divide the batch {b // s.dp}")
    return _token_split(wl, s)


def _require_sizes(s: Strategy) -> None:
    """Each size a positive integer, the mesh within MAX_DEVICES, the flags booleans, and sp
    over a tensor-parallel group."""
    for k in ("tp", "cp", "pp", "ep", "dp", "microbatches"):
        v = getattr(s, k)
        ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
        _check(ok, f"--{k} must be a positive integer, got {shown(v)}")
    axes = [f"--{k} {shown(getattr(s, k))}" for k in ("tp", "cp", "pp", "ep", "dp")]
    mesh = " x ".join(a for a in axes if not a.endswith(" 1"))
    require_at_most(s.devices, MAX_DEVICES, f"the mesh size of {mesh}", WHY_DEVICES, ConfigError)
    _check(
        isinstance(s.whole_vocab, bool),
        f"whole_vocab must be true or false, got {shown(s.whole_vocab)}",
    )
    _check(not s.sp or s.tp > 1, "--sp shards the tensor-parallel group: give --tp N with N > 1")


def _require_tp(cfg: ModelConfig, s: Strategy) -> None:
    """tp divides every width it cuts: the heads, the FFN and expert widths, and the linear-
    attention and Mamba heads."""
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    _check(heads % s.tp == 0, f"--tp {s.tp} does not divide the {heads} attention heads")
    _check(
        kv % s.tp == 0 or s.tp % kv == 0,
        f"--tp {s.tp} and the {kv} KV heads: one must divide the other",
    )
    widths = {
        "ffn width (intermediate_size)": cfg.intermediate_size if not all(cfg.moe_layers) else 0,
        "expert ffn width (moe_intermediate_size)": cfg.moe_intermediate_size,
        "shared expert width": cfg.shared_expert_intermediate_size,
    }
    for what, w in widths.items():
        _check(not w or w % s.tp == 0, f"--tp {s.tp} does not divide the {what} {w}")
    # a linear-attention layer splits over its key-head groups
    groups = cfg.linear_num_key_heads
    _check(
        not groups or groups % s.tp == 0,
        f"--tp {s.tp} does not divide the {groups} linear-attention key heads",
    )
    # a Mamba2 layer splits over its heads (and its groups, where tp divides them)
    mamba = cfg.mamba_num_heads
    _check(not mamba or mamba % s.tp == 0, f"--tp {s.tp} does not divide the {mamba} Mamba heads")


def _token_split(wl: Workload, s: Strategy) -> dict[str, str]:
    """Where ep cuts the tokens ('batch' where the microbatch divides, else 'token'), once the
    rank's tokens are known to divide for ep and sp."""
    t, b, m = wl.seq_len, wl.batch, s.microbatches
    split: dict[str, str] = {}
    if s.ep > 1:
        if (b // s.dp // m) % s.ep == 0:
            split["ep"] = "batch"
        else:
            _check(
                (t // s.cp) % s.ep == 0,
                f"--ep {s.ep} divides neither the batch {b // s.dp // m} nor the {t // s.cp} tokens "
                "a rank holds: experts need the tokens cut over the ep ranks",
            )
            split["ep"] = "token"
    if s.sp:
        local = t // s.cp // (s.ep if split.get("ep") == "token" else 1)
        _check(
            local % s.tp == 0, f"--sp: --tp {s.tp} does not divide the {local} tokens a rank holds"
        )
    return split


def make_mesh(s: Strategy) -> Mesh:
    sizes = {"dp": s.dp, "mb": s.microbatches, "pp": s.pp, "cp": s.cp, "ep": s.ep, "tp": s.tp}
    return Mesh(tuple((k, sizes[k]) for k in MESH_ORDER if sizes[k] > 1))


# -- seeds ---------------------------------------------------------------------------------------
def _fused(graph: Graph, n: Node) -> bool:
    """A projection whose output a multi-output split cuts apart (phi3's fused qkv, gate_up)."""
    return any(
        len(OPS[u.op].signature.outputs) > 1 for lin in graph.users(n) for u in graph.users(lin)
    )


FUSED_NOTE = "fused projections that a split cuts apart stay whole on every tp rank"


def seeds(
    graph: Graph, s: Strategy, token_split: dict[str, str]
) -> tuple[dict[str, Sharding], list[str]]:
    """Seed shardings of the graph's inputs and weights, and notes on what was left whole."""
    out: dict[str, Sharding] = {}
    notes: list[str] = []
    table = next(p for p in graph.params() if p.attrs["kind"] == "embedding")
    width = table.out.dims[1]  # the residual stream's
    fused = False
    for p in graph.params():
        cuts: list[list[Split]] = [[] for _ in p.out.dims]
        if s.ep > 1 and p.attrs.get("stacked") == "expert":
            cuts[0].append(("ep", s.ep))
        how = _tp_role(p, width) if s.tp > 1 else None
        views = _row_views(graph, p) if how == "column" else []
        if views:  # a projection read through its rows regrouped per head group
            for v in views:
                if v.attrs["groups"] % s.tp == 0:
                    out[v.name] = Sharding(((("tp", s.tp),), ()))
                else:
                    notes.append(
                        f"{v.name}: --tp {s.tp} does not divide its {v.attrs['groups']} groups: "
                        "the layer runs whole on every tp rank up to its output projection"
                    )
            continue
        if how == "column" and _fused(graph, p):
            fused = True
        elif how is not None:
            axis, blocks = _tp_cut(graph, p, how, s.tp, notes, s.whole_vocab)
            if blocks:
                cuts[axis].append(("tp", blocks))
        if any(cuts):
            out[p.name] = Sharding(tuple(tuple(c) for c in cuts))
    if fused:
        notes.append(FUSED_NOTE)
    return out | _input_seeds(graph, s, token_split), notes


def _row_views(graph: Graph, p: Node) -> list[Node]:
    """The views that read weight `p`'s rows regrouped in blocks of `groups` (Mamba2's in_proj
    and its bias), when every reader of `p` is one: tp cuts those views, not `p`."""
    users = graph.users(p)
    ok = all(
        OPS[u.op].category == MOVEMENT and "groups" in u.attrs and "index" in u.attrs for u in users
    )
    return list(users) if users and ok else []


def _tp_role(p: Node, width: Dim) -> str | None:
    """How tp cuts weight `p`: `vocab` (embedding, LM head), `column` (it reads the residual
    stream of `width`), `row` (it writes it), or None (whole: routers, vectors)."""
    dims = p.out.dims
    if p.attrs["kind"] == "router" or len(dims) < 2:
        return None
    if p.attrs.get("stacked") == "expert" and len(dims) < 3:  # a vector per expert (a bias)
        return None
    d_out, d_in = dims[-2], dims[-1]
    if p.attrs.get("layout") == "in_out":  # gpt-oss's experts are (E, in, out)
        d_out, d_in = d_in, d_out
    if p.attrs["kind"] in ("embedding", "lm_head"):
        return "vocab"
    if d_in == width and d_out != width:
        return "column"
    if d_out == width and d_in != width:
        return "row"
    return None


def _tp_cut(
    graph: Graph, p: Node, how: str, tp: int, notes: list[str], whole_vocab: bool = False
) -> tuple[int, int]:
    """(axis, blocks) of weight `p` under tp (0 blocks: whole), noting what stays whole."""
    dims = p.out.dims
    in_axis, out_axis = len(dims) - 1, len(dims) - 2
    if p.attrs.get("layout") == "in_out":
        in_axis, out_axis = out_axis, in_axis
    if how == "row":
        return in_axis, tp
    if how == "vocab":
        if whole_vocab:
            return 0, 0
        if dims[0].size % tp == 0:  # type: ignore[operator]
            return 0, tp
        notes.append(f"vocab {dims[0].size} is not a multiple of tp: {p.name} is whole")
        return 0, 0
    heads = heads_of(graph, p) or tp
    blocks = min(heads, tp)  # fewer KV heads than ranks: a head per tp/heads ranks
    if blocks < tp and f"{heads} KV heads" not in " ".join(notes):
        notes.append(
            f"tp={tp} > {heads} KV heads: each KV head is replicated on {tp // heads} ranks"
        )
    return out_axis, blocks


def _input_seeds(graph: Graph, s: Strategy, token_split: dict[str, str]) -> dict[str, Sharding]:
    """The graph inputs' shardings: the mesh axes that cut them, by the role of the axis cut."""
    along = {"batch": [("dp", s.dp), ("mb", s.microbatches)], "token": [("cp", s.cp)]}
    if "ep" in token_split:  # the experts' ranks see different tokens too
        along[token_split["ep"]].append(("ep", s.ep))
    out = {}
    for n in graph.nodes("input"):
        cuts = tuple(tuple(c for c in along.get(d.role, ()) if c[1] > 1) for d in n.out.dims)
        if any(cuts):
            out[n.name] = Sharding(cuts)
    return out


# -- pipeline stages -----------------------------------------------------------------------------
def balance(weights: list[float], stages: int) -> list[tuple[int, int]]:
    """Contiguous groups of `weights` (first, last index) whose largest sum is smallest."""
    n = len(weights)
    pre = [0.0]
    for w in weights:
        pre.append(pre[-1] + w)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        prev, row, cuts = best[k - 1], best[k], cut[k]
        # the first k groups end at i <= n - (stages - k), leaving a layer for each later
        # group: the entries beyond are never read (a row's j stops below that bound too)
        for i in range(k, n - (stages - k) + 1):
            # the last group is j..i-1; walked from short to long, its sum pre[i] - pre[j] only
            # grows (exactly, in floats: pre is nondecreasing), so once it passes the best found
            # no longer group can be better and the walk stops. `<=` keeps the smallest j of a
            # tie, as the walk from j = k - 1 up with `<` did: the same groups, in O(n) a row
            # where that walk was O(n^2) (a plan balances hundreds of candidates)
            top, b, at = pre[i], inf, 0
            for j in range(i - 1, k - 2, -1):
                tail = top - pre[j]
                if tail > b:
                    break
                v = prev[j] if prev[j] > tail else tail
                if v <= b:
                    b, at = v, j
            row[i], cuts[i] = b, at
    out, i = [], n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        out.append((j, i - 1))
        i = j
    return out[::-1]


def _node_seconds(graph: Graph, hw: Hardware | None) -> dict[str, float]:
    """Predicted time of every node (roofline; collectives on the links), FLOPs without hardware."""
    res = run(graph, ["cost", "roofline"], hardware=hw)
    mesh = meta_result(graph, "partition").mesh
    out = {}
    for n in graph.nodes():
        if OPS[n.op].category == COMMUNICATION and hw is not None:
            out[n.name] = comm_seconds(graph, n, mesh, hw)
        elif hw is not None and res["roofline"] is not None:
            out[n.name] = meta_result(n, "time").seconds
        else:
            out[n.name] = meta_result(n, "cost").flops
    return out


def pipeline(graph: Graph, stages: int, hw: Hardware | None) -> tuple[Graph, list[tuple[int, int]]]:
    """Assign contiguous layers to stages by predicted time; send/recv what crosses a stage. In
    place, on the rank's program that `partition` built."""
    n_layers = len(layer_scopes(graph))
    secs = _node_seconds(graph, hw)
    # what runs before the first layer goes with it, what runs after the last with that one
    where = {name: min(max(slot - 1, 0), n_layers - 1) for name, slot in layer_slots(graph).items()}
    weights = [0.0] * n_layers
    for name, i in where.items():
        weights[i] += secs.get(name, 0.0)
    groups = balance(weights, stages)
    stage_of_layer = {i: s for s, (a, b) in enumerate(groups) for i in range(a, b + 1)}
    stage = {name: stage_of_layer[i] for name, i in where.items()}
    for n in graph.nodes():  # a source is held by every stage that reads it
        if OPS[n.op].category == SOURCE:
            held = {stage[u.name] for u in graph.users(n)}
            n.meta.update(stage=min(held, default=0), stages=held)
        else:
            n.meta.update(stage=stage[n.name], stages={stage[n.name]})
    _send_across_stages(graph, stage)
    forget(graph, ["cost", "roofline"])  # timed before the sends and recvs were there
    return graph, groups


def _send_across_stages(graph: Graph, stage: dict[str, int]) -> None:
    """A send/recv pair for each tensor a later stage reads, once per reading stage."""
    sent: dict[tuple[Ref, int], Ref] = {}
    for n in graph.topo():
        for r in dict.fromkeys(n.inputs):
            src = graph[r.node]
            if OPS[src.op].category == SOURCE or stage[r.node] >= stage[n.name]:
                continue
            key = (r, stage[n.name])
            if key not in sent:
                sent[key] = _send(graph, n, r, stage[r.node], stage[n.name])
            graph.replace_input(n, r, sent[key])


def _send(graph: Graph, before: Node, r: Ref, a: int, b: int) -> Ref:
    """Send `r` from stage `a` to stage `b` just before node `before`; the received tensor."""
    base = r.node if r.index == 0 else f"{r.node}.{r.index}"
    attrs = {"mesh": "pp", "group": 2, "src": a, "dst": b}  # point to point
    sh = graph[r.node].meta["sharding"][r.index]
    with graph.inserting_before(before):
        name = f"{base}.send" + (f".{b}" if b != a + 1 else "")
        snd = graph.add("send", name, [r], attrs)
        rcv = graph.add("recv", snd.name.replace(".send", ".recv"), [snd], attrs)
    snd.meta.update(sharding=(sh,), stage=a, stages={a})
    rcv.meta.update(sharding=(sh,), stage=b, stages={b})
    return Ref(rcv.name)


# -- the transform ------------------------------------------------------------------------------
def _no_sequence_ops_cut_on_t(graph: Graph, how: str, hint: str) -> None:
    """refuse, in one line, to cut the tokens over ranks of a graph with an op that
    reads along its token axis in order (a row with a `relation` and one position axis out: a
    causal conv's window, a recurrence's prefix): rank r would need rank r-1's conv inputs and
    final state first, a send/recv chain that is not modelled."""
    for n in graph.nodes():
        positions = [d for d in n.out.dims if d.role in TOKEN_ROLES]
        if OPS[n.op].relation is not None and len(positions) == 1:
            raise ConfigError(
                f"{how}: {n.name} ({n.op}) reads the tokens in order, so each rank would need "
                f"the state of the ranks before it (passed rank to rank), which is not "
                f"modelled; {hint}"
            )


def partition(
    graph: Graph, strategy: Strategy, hardware: Hardware | None = None, verified: bool = False
) -> Graph:
    """The program of one rank under `strategy`, a new graph: its meta['partition'] holds the
    plan, and each node's meta its `sharding` (per output), `stage` (the pipeline stage that runs
    it; a weight or input: the first that reads it) and `stages` (every stage that holds it).
    `verified`: the caller verified `graph` and has not changed it since (plan partitions one
    graph for every layout), so it is not verified again; the program built is, always."""
    cfg, wl = graph.meta["config"], graph.meta["workload"]
    split = validate(cfg, wl, strategy)
    if hardware is not None and strategy.devices > 1 and hardware.interconnect_bandwidth is None:
        raise ConfigError(
            f"hardware {hardware.name} has no interconnect: partition analyses need one device "
            "there, or a device preset such as h100"
        )
    if not verified:
        graph.verify()
    if strategy.cp > 1:
        _no_sequence_ops_cut_on_t(graph, "--cp", "partition it with --tp, --pp, --ep or --dp")
    elif split.get("ep") == "token":
        hint = f"give a batch that --ep {strategy.ep} divides (-b), so that ep cuts the batch"
        _no_sequence_ops_cut_on_t(graph, "--ep on the tokens", hint)
    mesh = make_mesh(strategy)
    if graph.meta.get("frontend") == "traced":  # cut as transformers' own plans say
        # the flatten carries a cut of the positions only where the batch is one sequence
        b = wl.batch // strategy.dp // strategy.microbatches
        _check(
            split.get("ep") != "token" or wl.batch == 1,
            f"--ep {strategy.ep}: a traced model flattens its tokens (B*T) before routing, so ep "
            f"cuts the batch (or a lone sequence's positions), and it does not divide the {b} "
            f"sequences a rank holds: give -b a multiple of {strategy.ep}",
        )
        seeded, notes = plan_seeds(graph, strategy.tp, strategy.ep, strategy.whole_vocab)
        seeded |= _input_seeds(graph, strategy, split)
    else:
        seeded, notes = seeds(graph, strategy, split)
    if split.get("ep") == "token":
        notes.append("ep cuts the tokens on T: core attention gathers K/V over the ep ranks")
    if strategy.cp > 1 and wl.past_len:
        notes.append("cp with a KV cache: each rank holds the whole past K/V")
    scatter = frozenset({"tp"}) if strategy.sp else frozenset()
    # verified whole below: the op table's types need not be inferred as each node is added
    local = hoist_gathers(spmd(graph, mesh, seeded, scatter, checked=False))
    n_layers = cfg.num_hidden_layers
    plan = PartitionPlan(strategy, mesh, ((0, n_layers - 1),), split, tuple(notes))
    local.meta["partition"] = plan
    if strategy.pp > 1:
        local, groups = pipeline(local, strategy.pp, hardware)
        plan = PartitionPlan(strategy, mesh, tuple(groups), split, tuple(notes))
        local.meta["partition"] = plan
    else:
        for n in local.nodes():
            n.meta.update(stage=0, stages={0})
    local.verify()
    return local


@register(
    "partition",
    requires=("verify",),
    transforms=True,
    options=("strategy", "hardware"),
    writes=("sharding", "stage", "stages"),
    graph_writes=("partition",),
)
def partition_pass(
    graph: Graph,
    results: dict[str, Any] | None = None,
    strategy: Strategy | None = None,
    hardware: Hardware | None = None,
) -> Graph:
    """Transform: the partitioned graph (the program of one rank) for `strategy`."""
    return partition(graph, strategy or Strategy(), hardware)


# -- the report -------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionReport:
    strategy: dict[str, Any]
    mesh: dict[str, int]
    devices: list[dict[str, Any]]
    stages: list[dict[str, Any]]
    collectives: list[dict[str, Any]]
    pipeline: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    hardware: str | None = None
    training: dict[str, Any] | None = None  # recompute and zero, for a training step

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def partition_report(
    graph: Graph,
    hardware: Hardware | None = None,
    attention: str = "flash",
    training: TrainingOptions | None = None,
) -> PartitionReport:
    """Per device: params, memory, FLOPs, bytes, communication and predicted time.

    With `training`, a step is forward and backward (cost pass with training=True); each
    collective runs again in the backward pass as its conjugate with the same volume (all-reduce
    for all-reduce in Megatron's f/g pair, reduce-scatter for all-gather, all-to-all for
    all-to-all, a send of the gradient for a send), so counts are 2 x microbatches; memory is the
    training memory (passes/training.py, 1F1B: stage s holds min(pp - s, microbatches)
    microbatches' activations), and the gradient reduction over the data-parallel group runs once
    a step, after the last microbatch, not overlapped.
    """
    plan: PartitionPlan = meta_result(graph, "partition")
    s, mesh, m = plan.strategy, plan.mesh, plan.strategy.microbatches
    passes = 2 if training is not None else 1  # forward (and backward) runs of a collective
    per_stage = [Figures() for _ in range(s.pp)]
    timed = tally(
        graph,
        hardware,
        attention,
        training is not None,
        lambda n: [per_stage[st] for st in meta_result(n, "stages")],
    )
    collectives = [_collective_entry(graph, c, passes * m) for c in timed]
    stages = []
    for st, f in enumerate(per_stage):
        e = _stage_entry(plan, st, f, passes)
        if training is not None:
            grads = _training_stage(graph, e, f.names, training, attention, hardware)
            collectives += grads
        else:
            grads = []
            e["activation_bytes"] = _stage_memory(graph, f.names, attention)
            e["memory_bytes"] = (
                e["weight_bytes"] + e["kv_cache_bytes"] + e["state_bytes"] + e["activation_bytes"]
            )
        _stage_seconds(e, m, sum((c["seconds"] or 0.0 for c in grads), 0.0), hardware)
        stages.append(e)
    pipe = {
        "stages": s.pp,
        "microbatches": m,
        "schedule": "1F1B" if training is not None else "GPipe (forward only)",
        "bubble": bubble(m, s.pp),
        "step_seconds": step_seconds(stages, m) if hardware else None,
    }
    return PartitionReport(
        strategy=s.to_dict(),
        mesh={k: mesh.size(k) for k in MESH_ORDER if k != "mb"},
        devices=_devices(mesh, stages),
        stages=[dict(e) for e in stages],
        collectives=collectives,
        pipeline=pipe,
        notes=list(plan.notes),
        hardware=hardware.name if hardware else None,
        training=asdict(training) if training is not None else None,
    )


def _collective_entry(graph: Graph, c: Collective, runs: int) -> dict[str, Any]:
    return {
        "name": c.name,
        "kind": c.kind,
        "bytes": c.payload,
        "group_size": c.group,
        "wire_bytes_per_device": c.wire,
        "mesh_axis": c.axis,
        "stage": meta_result(graph[c.name], "stage"),
        "count": runs,  # once per microbatch (and pass)
        "seconds": c.seconds,
    }


def _stage_entry(plan: PartitionPlan, st: int, f: Figures, passes: int) -> dict[str, Any]:
    """A stage's figures for a step; its time per microbatch (compute, `passes` x comm)."""
    m = plan.strategy.microbatches
    wire: dict[str, float] = defaultdict(float)
    for c in f.collectives:
        wire[c.kind] += passes * m * c.wire
    return {
        "stage": st,
        "layers": list(plan.stages[st]),
        "params": int(f.params),
        "weight_bytes": f.weight_bytes,
        # a stage keeps the cache and states of every microbatch it has run (plan counts them so)
        "kv_cache_bytes": m * f.kv_cache_bytes,
        "state_bytes": m * f.state_bytes,
        "flops": m * f.flops,
        "bytes": m * f.bytes,
        "comm_bytes": dict(wire),
        "compute_seconds": f.compute_seconds,
        "comm_seconds": passes * f.comm_seconds,
    }


def _stage_memory(graph: Graph, names: set[str], attention: str) -> float:
    """Peak activations of the stage holding the nodes `names` (inference)."""
    sub = graph.subgraph(names)
    for k, r in graph.outputs.items():
        if r.node in names:
            sub.set_output(k, r, graph.output_role(k))
    return peak_activations(graph, attention, sub)[0]


def _training_stage(
    graph: Graph,
    e: dict[str, Any],
    names: set[str],
    opts: TrainingOptions,
    attention: str,
    hw: Hardware | None,
) -> list[dict[str, Any]]:
    """A training step's memory of the stage `e` (holding the nodes `names`) into `e`, and its
    gradient collectives, their bytes into its communication."""
    plan: PartitionPlan = meta_result(graph, "partition")
    s, st = plan.strategy, e["stage"]
    tm = training_memory(graph, opts, attention, names, min(s.pp - st, s.microbatches))
    e["activation_bytes"] = tm.activations + tm.activations_working
    e["kv_cache_bytes"] = e["state_bytes"] = 0.0  # a training step keeps no cache
    e["training"] = {k: v for k, v in tm.to_dict().items() if k != "collectives"}
    e["memory_bytes"] = tm.total
    out = []
    for c in tm.collectives:
        secs = gradient_seconds(c, plan.mesh, hw) if hw else None
        e["comm_bytes"][c["kind"]] = (
            e["comm_bytes"].get(c["kind"], 0.0) + c["wire_bytes_per_device"]
        )
        out.append(c | {"stage": st, "seconds": secs, "gradient": True})
    return out


def _stage_seconds(e: dict[str, Any], m: int, grad_seconds: float, hw: Hardware | None) -> None:
    """Whether the stage `e` fits, and its times: per microbatch, and a step of `m` of them then
    the gradient reduction."""
    cap = hw.memory_bytes if hw else None
    e["fits"] = e["memory_bytes"] <= cap if cap else None
    e["seconds_per_microbatch"] = e["compute_seconds"] + e["comm_seconds"]
    e["gradient_seconds"] = grad_seconds
    e["compute_seconds"] *= m
    e["comm_seconds"] = m * e["comm_seconds"] + grad_seconds
    e["seconds"] = m * e["seconds_per_microbatch"] + grad_seconds


def _devices(mesh: Mesh, stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every device (microbatches are not devices), with its coordinates and its stage's figures."""
    out = []
    # the device axes alone: a walk of every (device, microbatch) pair would take M times longer
    devices = Mesh(tuple((n, size) for n, size in mesh.axes if n != "mb"))
    for rank, c in enumerate(devices.coords()):
        coords = {k: c.get(k, 0) for k in MESH_ORDER if k != "mb"}
        out.append({"rank": rank, "coords": coords, **stages[coords["pp"]]})
    return out
