"""Parallel plans: every legal TP x CP x PP x EP x DP layout of N devices, fitted and ranked.

Legality is the partition pass's own: `partition.validate` and the partition transform itself,
whose ConfigError becomes the recorded reason. Microbatches: a training step runs B/dp of one
sequence each (gradient accumulation; 1F1B keeps at most pp in flight); inference runs one
microbatch (pp = 1, or decode, where each microbatch would read the weights again) or B/dp of one
sequence (a pipelined prefill). Tensor parallel training adds sequence parallelism where it is
legal (it only removes replicated activations).

Speed: a candidate's per-rank program depends on (tp, sp, cp, ep, microbatch size) alone, and
layers of one kind (the per-layer fields of the config: attention type, MoE or dense) cost the
same, so each such key is partitioned once, on a model with one layer of each kind, and every
pp, dp and ZeRO choice is assembled from its per-layer figures: stages balanced by layer time as
`partition.pipeline` does, a send of the residual stream between stages, memory per stage
(training: passes/training.py), step = the stages' sum for the first microbatch + (M - 1) x the
slowest stage's + the gradient reduction (figures.step_seconds). `tests/passes/parallel/test_plan.py` checks candidates against the full partition report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from graphllm.echo import shown
from graphllm.errors import ConfigError, GraphllmError
from graphllm.forked import ordered_map, workers
from graphllm.frontends import is_traced, model_graph
from graphllm.ir import Graph, Node
from graphllm.limits import require_at_most
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.ops import OPS, SOURCE
from graphllm.passes.cost import layer_scopes, layer_slots
from graphllm.passes.memory import peak_activations
from graphllm.passes.parallel.engine import mla_form
from graphllm.passes.parallel.figures import (
    Figures,
    bubble,
    collective_seconds,
    gradient_seconds,
    step_seconds,
    tally,
)
from graphllm.passes.parallel.partition import (
    MAX_DEVICES,
    WHY_DEVICES,
    Strategy,
    balance,
    make_mesh,
    partition,
    validate,
)
from graphllm.passes.training import (
    DP_AXES,
    TrainingOptions,
    adam_state_bytes,
    gradient_collectives,
    layer_inputs,
    saved_activations,
    zero_shards,
)

AXES = ("tp", "cp", "pp", "ep", "dp")


# Layouts a plan enumerates at most: each is checked and the legal ones costed (some 50 µs each),
# so a plan stays within seconds; 720720 devices of a dense model are 89,600 of them.
MAX_LAYOUTS = 100_000


def divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, in O(sqrt(n)) steps."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def prime_exponents(n: int) -> list[int]:
    """The exponents of n's prime factors (trial division: n is at most MAX_DEVICES)."""
    out, p = [], 2
    while p * p <= n:
        e = 0
        while n % p == 0:
            n, e = n // p, e + 1
        if e:
            out.append(e)
        p += 1
    return out + ([1] if n > 1 else [])


def count_layouts(n: int, free_axes: int) -> int:
    """How many ordered ways `free_axes` sizes multiply to n: each prime's exponent spread over
    the axes, C(e + k - 1, k - 1) ways, independently."""
    if free_axes == 0:
        return 1
    return math.prod(math.comb(e + free_axes - 1, free_axes - 1) for e in prime_exponents(n))


def factorisations(n: int, pinned: dict[str, int], moe: bool) -> list[dict[str, int]]:
    """Every assignment of sizes to AXES whose product is n; pinned sizes fixed; ep=1 if dense."""
    out = []

    def rec(i: int, left: int, acc: dict[str, int]) -> None:
        if i == len(AXES) - 1:
            ax = AXES[i]
            if pinned.get(ax, left) == left:
                out.append(acc | {ax: left})
            return
        ax = AXES[i]
        choices = [pinned[ax]] if ax in pinned else divisors(left)
        if ax == "ep" and not moe and ax not in pinned:
            choices = [1]
        for d in choices:
            if left % d == 0:
                rec(i + 1, left // d, acc | {ax: d})

    rec(0, n, {})
    return out


# -- per-layer figures of one partitioned program -------------------------------------------------
def layer_kinds(cfg: ModelConfig) -> list[tuple]:
    """Per layer, the values of the config's per-layer fields: layers of one kind cost the same."""
    n = cfg.num_hidden_layers
    per = [f.name for f in dataclasses.fields(cfg) if _per_layer(getattr(cfg, f.name), n)]
    return [tuple(getattr(cfg, k)[i] for k in per) for i in range(n)]


def _per_layer(v: Any, n: int) -> bool:
    return isinstance(v, tuple) and len(v) == n


def reduced_config(cfg: ModelConfig) -> tuple[ModelConfig, list[int]]:
    """A config with one layer of each kind, and for each real layer its reduced index."""
    kinds = layer_kinds(cfg)
    first: dict[tuple, int] = {}
    for i, k in enumerate(kinds):
        first.setdefault(k, i)
    keep = sorted(first.values())
    n = cfg.num_hidden_layers
    changes: dict[str, Any] = {"num_hidden_layers": len(keep)}
    for f in dataclasses.fields(cfg):
        v = getattr(cfg, f.name)
        if _per_layer(v, n):
            changes[f.name] = tuple(v[i] for i in keep)
    try:
        small = dataclasses.replace(cfg, **changes)
    except (GraphllmError, TypeError, ValueError):
        return cfg, list(range(n))
    where = {k: j for j, k in enumerate(kinds[i] for i in keep)}
    return small, [where[k] for k in kinds]


def planned_config(cfg: Any, wl: Workload) -> tuple[Any, list[int]]:
    """The config the layouts are partitioned on, and each real layer's index in it: a built
    family's reduced to one layer of each kind; a traced model whole, each layer its own (a
    traced layer's kind is known from its modules, not from config fields a smaller config
    could be made with)."""
    if not is_traced(cfg):
        return reduced_config(cfg)
    return cfg, list(range(len(layer_scopes(model_graph(cfg, wl)))))


@dataclass
class Part(Figures):
    """Figures of one layer (or of what comes before / after the layers), per microbatch."""

    comm: dict[tuple[str, str], float] = field(default_factory=dict)  # (kind, axis) -> seconds
    saved: float = 0.0  # activations kept for backward (training)
    full_saved: float = 0.0  # ... under no recomputation (the working set of full recompute)
    stream_bytes: float = 0.0  # the residual stream entering the layer (a pipeline send)


@dataclass
class Program:
    """The figures of one rank's program on the reduced config (one layer of each kind)."""

    layers: list[Part]  # per reduced layer
    pre: Part
    post: Part
    peak_activations: float  # inference


def analyse(
    graph: Graph, hw: Hardware, attention: str, training: TrainingOptions | None
) -> Program:
    """Per-layer figures of a partitioned graph (one rank's program)."""
    order = layer_scopes(graph)
    slots = [Part() for _ in range(len(order) + 2)]  # before the layers, each layer, after
    at = layer_slots(graph)

    def part_of(n: Node) -> tuple[Part, ...]:
        if OPS[n.op].category != SOURCE:
            return (slots[at[n.name]],)
        if n.op != "param":
            return ()
        users = graph.users(n)  # a weight goes with the first node that reads it
        return (slots[at[users[0].name]] if users else slots[0],)

    # partition verified the program it built, last: not again
    tally(graph, hw, attention, training is not None, part_of, verified=True)
    for p in slots:
        for c in p.collectives:
            p.comm[(c.kind, c.axis)] = p.comm.get((c.kind, c.axis), 0.0) + (c.seconds or 0.0)
    prog = Program(slots[1:-1], slots[0], slots[-1], 0.0)
    index = {lay: i for i, lay in enumerate(order)}
    if training is not None:
        _add_saved(graph, prog, index, training.recompute, attention)
    else:
        prog.peak_activations = peak_activations(graph, attention)[0]
    for lay, x in layer_inputs(graph, None).items():
        prog.layers[index[lay]].stream_bytes = x
    return prog


def _add_saved(
    graph: Graph, prog: Program, index: dict[str, int], recompute: str, attention: str
) -> None:
    """The activations each layer keeps for backward; and what it would keep without
    recomputation, the working set of a full recomputation."""
    act = saved_activations(graph, recompute, attention).per_layer
    none = saved_activations(graph, "none", attention).per_layer if recompute == "full" else act
    for lay, x in act.items():
        p = prog.layers[index[lay]] if lay else prog.post
        p.saved += x
    for lay, x in none.items():
        if lay:
            prog.layers[index[lay]].full_saved += x


# -- assembling a candidate -----------------------------------------------------------------------
@dataclass(frozen=True)
class Candidate:
    strategy: dict[str, Any]
    memory_bytes: float  # the fullest device
    fits: bool
    seconds: float  # a step: a decoded token, a prefill, or a training step
    compute_seconds: float  # of the slowest stage, a step, without the bubble
    comm_seconds: float  # of the slowest stage, a step (gradient reduction included)
    main_comm: dict[str, Any]  # the collective kind taking the most time a step
    stages: list[dict[str, Any]]
    bubble: float

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _fresh_dict(c: Candidate) -> dict[str, Any]:
    """`c.to_dict()` without its deep copy: `assemble` builds every dict and list a candidate
    holds afresh and drops the candidate, so nothing is shared (asdict copied 87,000 objects
    of a DeepSeek-V3 plan over 256 devices)."""
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}


def assemble(
    prog: Program,
    kinds: list[int],
    s: Strategy,
    hw: Hardware,
    training: TrainingOptions | None,
) -> Candidate:
    """A candidate's stages, memory and step time from its program's per-layer figures."""
    mesh = make_mesh(s)
    m, pp = s.microbatches, s.pp
    passes = 2 if training is not None else 1
    full = [prog.layers[k] for k in kinds]
    weights = [p.compute_seconds + passes * p.comm_seconds for p in full]
    weights[0] += prog.pre.compute_seconds + passes * prog.pre.comm_seconds
    weights[-1] += prog.post.compute_seconds + passes * prog.post.comm_seconds
    groups = _balanced(tuple(weights), pp) if pp > 1 else [(0, len(full) - 1)]
    stages = []
    comm: dict[tuple[str, str], float] = defaultdict(float)  # a step of the average stage
    held: dict[tuple, tuple[dict[str, float], float]] = {}  # stages of the same layer kinds
    for st, (a, z) in enumerate(groups):
        parts = full[a : z + 1] + [prog.pre] * (st == 0) + [prog.post] * (st == pp - 1)
        per_mb = sum(weights[a : z + 1])
        for p in parts:
            for key, secs in p.comm.items():
                comm[key] += passes * m * secs / pp
        if st < pp - 1:  # send the residual stream to the next stage (and its gradient back)
            stream = full[z + 1].stream_bytes
            sent = collective_seconds("send", 2, stream, mesh, "pp", hw, pair=(st, st + 1))
            per_mb += passes * sent
            comm[("send/recv", "pp")] += passes * m * sent / pp
        entry: dict[str, Any] = {
            "stage": st,
            "layers": [a, z],
            "params": sum(p.params for p in parts),
            "seconds_per_microbatch": per_mb,
            "compute_seconds": m * sum(p.compute_seconds for p in parts),
        }
        if training is not None:
            key = (tuple(kinds[a : z + 1]), st == 0, st == pp - 1)
            if key not in held:
                held[key] = _training_state(parts, s, mesh, hw, training)
            entry |= _training_memory(parts, training, min(pp - st, m), *held[key])
            grads = comm[("gradients", "dp")]
            comm[("gradients", "dp")] = max(grads, entry["gradient_seconds"])
        else:
            entry |= _inference_memory(prog, parts, m)
        stages.append(entry)
    return _candidate(s, stages, comm, hw)


@functools.lru_cache(maxsize=4096)
def _balanced(weights: tuple[float, ...], pp: int) -> tuple[tuple[int, int], ...]:
    # the layouts that differ only in dp share their program and so their layers' weights
    return tuple(balance(list(weights), pp))


def _candidate(
    s: Strategy, stages: list[dict[str, Any]], comm: dict[tuple[str, str], float], hw: Hardware
) -> Candidate:
    """The candidate of strategy `s` from its stages; its main collective the costliest in
    `comm`."""
    m = s.microbatches
    slowest = max(e["seconds_per_microbatch"] for e in stages)
    grads = max(e["gradient_seconds"] for e in stages)
    mem = max(e["memory_bytes"] for e in stages)
    slow = max(stages, key=lambda e: e["seconds_per_microbatch"])
    compute = slow["compute_seconds"]  # of the slowest stage, its microbatches, no bubble
    kind, axis = max(comm, key=lambda k: comm[k]) if comm else ("none", "")
    main = {"kind": kind, "mesh_axis": axis, "seconds": comm.get((kind, axis), 0.0)}
    return Candidate(
        strategy=s.to_dict(),
        memory_bytes=mem,
        fits=mem <= hw.memory_bytes,
        seconds=step_seconds(stages, m),
        compute_seconds=compute,
        comm_seconds=m * slowest - compute + grads,
        main_comm=main,
        stages=stages,
        bubble=bubble(m, s.pp),
    )


def _inference_memory(prog: Program, parts: list[Part], m: int) -> dict[str, Any]:
    """A stage's weights, the K/V cache and the states of its `m` microbatches and the program's
    peak activations."""
    wb = sum(p.weight_bytes for p in parts)
    kv = m * sum(p.kv_cache_bytes for p in parts)
    state = m * sum(p.state_bytes for p in parts)
    return {
        "weight_bytes": wb,
        "kv_cache_bytes": kv,
        "state_bytes": state,
        "memory_bytes": wb + kv + state + prog.peak_activations,
        "gradient_seconds": 0.0,
    }


def _training_state(
    parts: list[Part], s: Strategy, mesh: Any, hw: Hardware, opts: TrainingOptions
) -> tuple[dict[str, float], float]:
    """A stage's weights, gradients and optimizer state (as passes/training.training_memory)
    and its gradient time: the same for every stage of the same layers, whatever it holds in
    flight."""
    wb = sum(p.weight_bytes for p in parts)
    ep_wb = sum(p.ep_weight_bytes for p in parts)
    master = any(p.master for p in parts)
    params = sum(p.params for p in parts)
    ep_params = params * ep_wb / wb if wb else 0.0
    n_all = s.dp * s.cp * s.ep  # replicas of a weight that ep does not cut
    n_ep = s.dp * s.cp
    axes_all = tuple(a for a in DP_AXES if getattr(s, a) > 1)
    axes_ep = tuple(a for a in DP_AXES if a != "ep" and getattr(s, a) > 1)
    z = opts.zero
    out = {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0}
    for byts, numel, n in ((wb - ep_wb, params - ep_params, n_all), (ep_wb, ep_params, n_ep)):
        on_weights, on_grads, on_optim = zero_shards(z, n)
        out["weights"] += byts / on_weights
        out["gradients"] += byts / on_grads
        out["optimizer"] += adam_state_bytes(master) * numel / on_optim
    groups = {}
    if n_all > 1 and wb - ep_wb:
        groups[axes_all] = (wb - ep_wb, wb - ep_wb, n_all)
    if n_ep > 1 and ep_wb:
        groups[axes_ep] = (ep_wb, ep_wb, n_ep)
    grad_seconds = 0.0
    for c in gradient_collectives(groups, z):
        grad_seconds += gradient_seconds(c, mesh, hw)
    return out, grad_seconds


def _training_memory(
    parts: list[Part],
    opts: TrainingOptions,
    in_flight: int,
    state: dict[str, float],
    grad_seconds: float,
) -> dict[str, Any]:
    """Training memory of a stage (as passes/training.training_memory) and its gradient time,
    from its `_training_state`."""
    out: dict[str, Any] = dict(state)
    saved = sum(p.saved for p in parts)
    working = max((p.full_saved for p in parts), default=0.0) if opts.recompute == "full" else 0.0
    out["activations"] = in_flight * saved
    out["activations_working"] = working
    out["microbatches_in_flight"] = in_flight
    out["memory_bytes"] = sum(out[k] for k in ("weights", "gradients", "optimizer")) + (
        in_flight * saved + working
    )
    out["gradient_seconds"] = grad_seconds
    return out


# -- the search ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlanReport:
    devices: int
    phase: str  # decode | prefill | training
    candidates: list[dict[str, Any]]  # fitting, fastest first
    too_big: list[dict[str, Any]]
    illegal: list[dict[str, Any]]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _microbatches(wl: Workload, s: dict[str, int], train: bool) -> int:
    local = wl.batch // s["dp"]
    if train:
        return local  # one sequence each: gradient accumulation
    return local if s["pp"] > 1 and wl.phase != "decode" else 1


def plan(
    cfg: ModelConfig,
    wl: Workload,
    devices: int,
    hw: Hardware,
    training: TrainingOptions | None = None,
    attention: str = "flash",
    pinned: dict[str, int] | None = None,
    progress: Callable[[int, int], None] | None = None,
    mla: str = "auto",
) -> PlanReport:
    """Every legal layout of `devices`, those that fit ranked by predicted step time.
    `progress(done, total)` is told the layouts tried after each. `mla`: an MLA model's form,
    or 'auto': the step's as engines run it (engine.mla_form: absorbed for a decode step)."""
    pinned = _pinned(devices, hw, training, _traced_pins(cfg, pinned))
    _require_few_layouts(devices, pinned, cfg.is_moe)
    phase = "training" if training is not None else wl.phase
    form = mla_form(cfg, phase, mla)
    small, kinds = planned_config(cfg, wl)
    ok, big, bad = [], [], []
    layouts = factorisations(devices, pinned, cfg.is_moe)
    tried: list[Strategy | GraphllmError] = []
    for sizes in layouts:
        try:
            tried.append(_strategy(cfg, wl, sizes, training))
        except GraphllmError as e:
            tried.append(e)
    keys = list(dict.fromkeys(_key(wl, s) for s in tried if isinstance(s, Strategy)))
    with _programs(keys, (small, form), wl, hw, attention, training) as programs:
        for i, (sizes, s) in enumerate(zip(layouts, tried, strict=True)):
            if progress is not None:
                progress(i, len(layouts))
            prog = s if isinstance(s, GraphllmError) else programs(_key(wl, s))
            if isinstance(prog, GraphllmError):
                bad.append({"strategy": sizes, "reason": str(prog)})
                continue
            c = assemble(prog, kinds, s, hw, training)  # type: ignore[arg-type]
            (ok if c.fits else big).append(_fresh_dict(c))
    if progress is not None:
        progress(len(layouts), len(layouts))
    if not ok and not big:
        why = "; ".join(sorted({x["reason"] for x in bad})[:3])
        raise ConfigError(f"no layout of {devices} devices is legal for {cfg.name}: {why}")
    ok.sort(key=lambda c: c["seconds"])
    big.sort(key=lambda c: c["memory_bytes"])
    return PlanReport(devices, phase, ok, big, bad)


# why a traced model's plan has no pipeline stages
TRACED_NO_PP = (
    "a traced model's layers read tensors its stem computes once (RoPE tables), each sent to "
    "every later stage, which the plan's per-layer assembly does not price: its layouts have "
    "no pipeline stages (graphllm partition --pp prices them)"
)


def _traced_pins(cfg: Any, pinned: dict[str, int | None] | None) -> dict[str, int | None] | None:
    """A traced model's plan pins pp to 1 (TRACED_NO_PP); --pp above 1 is refused."""
    if not is_traced(cfg):
        return pinned
    if (pinned or {}).get("pp") not in (None, 1):
        raise ConfigError(f"--pp with plan: {TRACED_NO_PP}")
    return {**(pinned or {}), "pp": 1}


def _pinned(
    devices: int, hw: Hardware, training: TrainingOptions | None, pinned: dict[str, int] | None
) -> dict[str, int]:
    """The sizes the caller fixed, once the request is one a layout can meet."""
    if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
        raise ConfigError(f"--devices must be a positive integer, got {shown(devices)}")
    require_at_most(devices, MAX_DEVICES, "--devices", WHY_DEVICES, ConfigError)
    if devices > 1 and hw.interconnect_bandwidth is None:
        raise ConfigError(f"hardware {hw.name} has no interconnect: plans need a device preset")
    pinned = {k: v for k, v in (pinned or {}).items() if v is not None}
    fixed = math.prod(pinned.values())
    if devices % fixed:
        sizes = " x ".join(f"--{k} {shown(v)}" for k, v in pinned.items())
        raise ConfigError(f"{sizes} = {shown(fixed)} devices does not divide --devices {devices:,}")
    if training is not None and training.zero and pinned.get("dp") == 1:
        raise ConfigError("--zero shards over the data parallel group: --dp 1 leaves none")
    return pinned


def _require_few_layouts(devices: int, pinned: dict[str, int], moe: bool) -> None:
    """Refuse, before enumerating, a plan of more than MAX_LAYOUTS layouts."""
    free = [ax for ax in AXES if ax not in pinned and (moe or ax != "ep")]
    n = count_layouts(devices // math.prod(pinned.values()), len(free))
    if n > MAX_LAYOUTS:
        raise ConfigError(
            f"--devices {devices:,} has {n:,} layouts over {', '.join(free)}; graphllm plans at "
            f"most {MAX_LAYOUTS:,} at once: pin some sizes (--tp, --pp, ...)"
        )


def _strategy(
    cfg: ModelConfig, wl: Workload, sizes: dict[str, int], training: TrainingOptions | None
) -> Strategy:
    """The strategy tried for `sizes`: its microbatches, and sequence parallelism where a
    training step can take it. ConfigError (the reason) when the model or workload cannot."""
    train = training is not None
    if train and training.zero and sizes["dp"] == 1:  # type: ignore[union-attr]
        raise ConfigError("--zero needs dp > 1")
    m = _microbatches(wl, sizes, train) if wl.batch % sizes["dp"] == 0 else 1
    s = Strategy(**sizes, microbatches=max(m, 1))
    validate(cfg, wl, s)
    if not train or s.tp == 1:
        return s
    try:
        validate(cfg, wl, dataclasses.replace(s, sp=True))
    except ConfigError:
        return s
    return dataclasses.replace(s, sp=True)


ProgramKey = tuple[int, bool, int, int, int]  # (tp, sp, cp, ep, microbatch size)
FORK_LEAST = 64  # programs below which forking workers costs more than it saves (28: even)


def _key(wl: Workload, s: Strategy) -> ProgramKey:
    """What `s`'s rank program depends on: (tp, sp, cp, ep, microbatch size)."""
    return (s.tp, s.sp, s.cp, s.ep, wl.batch // s.dp // s.microbatches)


@contextlib.contextmanager
def _programs(
    keys: list[ProgramKey],
    model: tuple[ModelConfig, str],
    wl: Workload,
    hw: Hardware,
    attention: str,
    training: TrainingOptions | None,
) -> Iterator[Callable[[ProgramKey], Program | GraphllmError]]:
    """Each key's program (or the error that refuses it), partitioned once on the reduced
    config of `model` (in its MLA form); side by side in forked workers where there are many
    (graphllm/forked.py). The lookup it gives waits for the program asked for."""
    global _FORKED
    jobs = workers(len(keys), FORK_LEAST)
    context: _Context = (model, wl, hw, attention, training, {})
    before = _FORKED
    if jobs > 1:
        for b_mb in dict.fromkeys(k[-1] for k in keys):  # shared with the workers, not rebuilt
            with contextlib.suppress(GraphllmError):  # its keys' programs give the error
                _graph(context, b_mb)
        _FORKED = context
        made = ordered_map(_program_forked, keys, jobs)
    else:
        made = ordered_map(functools.partial(_program_in, context), keys, 1)
    got: dict[ProgramKey, Program | GraphllmError] = {}
    order = iter(keys)

    def program(key: ProgramKey) -> Program | GraphllmError:
        while key not in got:  # the results come in the keys' order
            got[next(order)] = next(made)
        return got[key]

    try:
        yield program
    finally:
        made.close()  # the workers, if any, stop
        _FORKED = before


# ((reduced config, MLA form), workload, hardware, attention, training, graph per microbatch size)
_Context = tuple[tuple[ModelConfig, str], Workload, Hardware, str, "TrainingOptions | None", dict]
# what the workers of the plan being made compute from: they fork with it (a worker is sent
# only a key), so it is set while its plan's workers run
_FORKED: _Context | None = None


def _program_forked(key: ProgramKey) -> Program | GraphllmError:
    assert _FORKED is not None
    return _program_in(_FORKED, key)


def _graph(context: _Context, b_mb: int) -> Graph:
    """The unpartitioned reduced graph of microbatch size `b_mb`, built and verified once:
    partition leaves its input as it was."""
    (small, form), wl, graphs = context[0], context[1], context[5]
    if b_mb not in graphs:
        built = model_graph(small, dataclasses.replace(wl, batch=b_mb), mla=form)
        built.verify()
        graphs[b_mb] = built
    return graphs[b_mb]


def _program_in(context: _Context, key: ProgramKey) -> Program | GraphllmError:
    """The per-layer figures of key's rank program; the error of one that fails."""
    _, _, hw, attention, training, _ = context
    tp, sp, cp, ep, b_mb = key
    try:
        g = partition(
            _graph(context, b_mb), Strategy(tp=tp, sp=sp, cp=cp, ep=ep), hw, verified=True
        )
        return analyse(g, hw, attention, training)
    except GraphllmError as e:
        return e
