"""One rank's greedy generation: its program for each step, its blocks of the weights, its KV
cache, its segments on a runner and its cut points on torch.distributed.

A step's program is the partition of the step's graph (prefill: T new tokens; decode: one token
after P), rebuilt each step since P is part of the graph. Decode cannot cut one token over ranks,
so it runs with context and sequence parallelism dropped: the cp ranks of a prefill hold the same
decode program (replicas), and the KV cache their prefill left cut on T is gathered once.
Everything a rank does not compute alone (the logits every rank needs for the next token, a KV
cache that changes hands) goes through the world group, outside the timed cut points.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from graphllm.build.builder import build_graph
from graphllm.build.weights import SafetensorsFolder, random_tensors
from graphllm.errors import ConfigError, GraphllmError, WeightsError
from graphllm.ir import Graph, Node
from graphllm.ir.opspec import position_origins
from graphllm.models.config import load_config
from graphllm.models.workload import Workload
from graphllm.passes.parallel.partition import Strategy, decode_strategy, partition
from graphllm.passes.parallel.sharding import Mesh, Sharding
from graphllm.passes.registry import meta_result
from graphllm.runtime.budget import require_interpreted
from graphllm.runtime.dist.comm import Comm, device_mesh, world_call
from graphllm.runtime.dist.records import RankRecord, SegmentTime, StepRecord
from graphllm.runtime.dist.segments import Segment, Step, cut, on_rank, require_runner, value_name
from graphllm.runtime.dist.tensors import to_numpy, to_torch
from graphllm.runtime.interpret import default_feeds
from graphllm.runtime.spmd import assemble, block_index, shard


@dataclass(frozen=True)
class Job:
    """What every rank runs (JSON: the launcher hands it to the workers as a file)."""

    source: str  # a config path (file or checkpoint folder) or a preset name
    strategy: dict[str, Any]
    batch: int = 1
    seq_len: int = 8
    new_tokens: int = 8
    seed: int = 0
    mla: str = "naive"
    weights: str | None = None  # a safetensors folder; None: seeded random weights
    runtime: str = "numpy"
    timeout: float = 60.0
    keep_logits: bool = False  # rank 0 returns every step's whole logits (tests)
    name: str = ""  # a label for the case

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Generation:
    """What one rank ends with."""

    tokens: np.ndarray  # (B, new_tokens)
    record: RankRecord
    logits: list[np.ndarray] = field(default_factory=list)
    prompt: np.ndarray | None = None


def prompt_ids(job: Job, vocab: int) -> np.ndarray:
    """The prompt every rank draws alike from the job's seed."""
    return np.random.default_rng(job.seed).integers(0, vocab, size=(job.batch, job.seq_len))


def step_graph(job: Job, config: Any, t: int, p: int) -> Graph:
    wl = Workload.with_dtype(batch=job.batch, seq_len=t, past_len=p, dtype="fp32")
    return build_graph(config, wl, mla=job.mla)


def vocab_of(graph: Graph) -> int:
    table = graph.type_of(next(graph.nodes("embedding")).inputs[1])
    return int(table.dims[0].size)  # type: ignore[arg-type]


def generate(
    job: Job,
    comm: Comm | None = None,
    clock: float | None = None,
    hook: Callable[[str], None] | None = None,
) -> Generation:
    """Prefill the job's prompt and decode greedily to `new_tokens` tokens on this rank (`comm`
    None: the only rank, running the unpartitioned program). `hook(step)` is called as each
    step starts (the worker's fault injection)."""
    clock = time.perf_counter() if clock is None else clock
    config = load_config(job.source)
    strategy = Strategy(**job.strategy)
    whole = step_graph(job, config, job.seq_len, 0)
    program = partition(whole, strategy)
    world = device_mesh(meta_result(program, "partition").mesh)
    coords = comm.coords if comm is not None else {}
    weights, record = _load(job, whole, program, coords, comm)
    factory = _runner_factory(job, comm)
    ids = prompt_ids(job, vocab_of(whole))
    out = Generation(np.zeros((job.batch, 0), np.int64), record, prompt=ids)
    stages = meta_result(program, "partition").stages
    held: dict[tuple, dict[str, Any]] = {}
    prev: Graph | None = None
    step_ids = ids
    g, prog = whole, program
    cuts: dict[tuple, list[Step]] = {}  # the step program's steps, per mesh coords
    runners: dict[tuple, Any] = {}
    for k in range(job.new_tokens):
        start = time.perf_counter()
        what = "prefill" if k == 0 else f"decode {k}"
        if hook is not None:
            hook(what)
        if k > 0:
            g, prog, cuts, runners = _decode_program(
                job, config, strategy, k, (g, prog), cuts, runners
            )
            if meta_result(prog, "partition").stages != stages:
                raise GraphllmError(
                    f"{what}: the pipeline balances the layers into other stages than the "
                    "prefill did, and the KV cache would have to move; give a --pp that "
                    "divides the layers evenly"
                )
        plan = meta_result(prog, "partition")
        rec = StepRecord(
            what, int(g.bindings["T"]), int(g.bindings.get("P", 0)), plan.strategy.describe()
        )
        past = _pasts(prog, prev, held, comm, world) if prev is not None else {}
        _start_together(comm, what)
        feeds = _feeds(g, step_ids)
        held = _run_step(
            prog, world, coords, feeds, past, weights, factory, comm, clock, rec, cuts, runners
        )
        logits = _whole_output(prog, "logits", held, comm, world)
        step_ids = _next_token(out, logits, job.keep_logits)
        prev = prog
        rec.seconds = time.perf_counter() - start
        rec.other_seconds = rec.seconds - rec.compute_seconds - rec.comm_seconds
        record.steps.append(rec)
    return out


def _load(
    job: Job, whole: Graph, program: Graph, coords: dict[str, int], comm: Comm | None
) -> tuple[dict[str, np.ndarray], RankRecord]:
    """This rank's blocks of the weights, and its record started with what loading them took."""
    t0 = time.perf_counter()
    weights = rank_weights(job, whole, program, coords)
    record = RankRecord(
        rank=comm.rank if comm is not None else 0,
        coords=dict(coords),
        backend=_backend(comm),
        runtime=job.runtime,
        weight_bytes=int(sum(w.nbytes for w in weights.values())),
        load_seconds=time.perf_counter() - t0,
    )
    return weights, record


def _runner_factory(job: Job, comm: Comm | None) -> Any:
    """What makes a segment's runner on this rank's runtime and device."""
    factory = require_runner(job.runtime)
    if comm is not None and comm.device != "cpu" and job.runtime == "onnxruntime":
        # dist-ort's runner on onnxruntime's CUDA provider (no GPU here: never run)
        factory = functools.partial(factory, device="cuda")
    return factory


def _decode_program(
    job: Job,
    config: Any,
    strategy: Strategy,
    k: int,
    last: tuple[Graph, Graph],
    cuts: dict[tuple, list[Step]],
    runners: dict[tuple, Any],
) -> tuple[Graph, Graph, dict[tuple, list[Step]], dict[tuple, Any]]:
    """Decode step `k`'s graph and program, with the cuts and runners that go with it: the
    previous step's (`last`: its graph and program) moved on one past position where only P
    and S changed, else the step partitioned anew with none cut or made yet."""
    g = step_graph(job, config, 1, job.seq_len + k - 1)
    prev_graph, prog = last
    if k > 1 and _rebinds(g, prev_graph, prog):
        _rebind(prog, cuts, g.bindings)  # the same program, one more past position
        return g, prog, cuts, runners
    return g, partition(g, decode_strategy(strategy)), {}, {}


def _start_together(comm: Comm | None, what: str) -> None:
    """The ranks start the step together, so that the first collective's time is the link's and
    not the others' program build (outside the timed compute and comm)."""
    if comm is not None:
        import torch.distributed as dist

        world_call(f"the barrier starting {what}", dist.barrier)


def _next_token(out: Generation, logits: np.ndarray, keep_logits: bool) -> np.ndarray:
    """The greedy next token of each sequence, appended to `out` (and the logits, if kept)."""
    nxt = np.argmax(logits[:, -1, :], axis=-1).astype(np.int64)[:, None]
    out.tokens = np.concatenate([out.tokens, nxt], axis=1)
    if keep_logits:
        out.logits.append(logits)
    return nxt


REBOUND = ("P", "S")  # what one more decode step changes: the past and whole lengths


def _rebinds(g: Graph, last: Graph, prog: Graph) -> bool:
    """Whether decode graph `g` is the previous step's graph `last` with P and S moved on, so
    that its program is the previous one with those bindings moved on (no window or chunk size
    that P passed, no rank axis cut on them): rebuilding and partitioning every step costs more
    than a small model's step."""
    if set(g.bindings) != set(last.bindings) or len(g) != len(last):
        return False
    if any(g.bindings[k] != last.bindings[k] for k in g.bindings if k not in REBOUND):
        return False
    return not any(k.split("/")[0] in REBOUND and "/" in k for k in prog.bindings)


def _rebind(prog: Graph, cuts: dict[tuple, list[Step]], bindings: dict[str, Any]) -> None:
    """Move the program's and its segments' P and S on, and the origins baked in them."""
    moved = {k: bindings[k] for k in REBOUND if k in bindings}
    prog.bindings.update(moved)
    for steps in cuts.values():
        for st in steps:
            if isinstance(st, Segment):
                st.graph.bindings.update(moved)
                for n in st.graph.nodes():
                    if "origin" in n.attrs:
                        n.attrs["origin"] = position_origins(prog, prog[n.name])


def _feeds(g: Graph, ids: np.ndarray) -> dict[str, np.ndarray]:
    """Token ids, positions after the graph's P past tokens, and the mask; the past K/V are the
    rank's own blocks (default_feeds would want the whole past to place the positions)."""
    feeds = default_feeds(g, ids)
    b, t = ids.shape
    p = int(g.bindings.get("P", 0))
    feeds["position_ids"] = np.broadcast_to(np.arange(p, p + t), (b, t)).copy()
    if "attention_mask" in feeds:
        feeds["attention_mask"] = np.ones((b, p + t), np.int64)
    return feeds


def _backend(comm: Comm | None) -> str:
    if comm is None:
        return "none"
    import torch.distributed as dist

    return str(dist.get_backend())


def _key(mesh: Mesh, c: dict[str, int]) -> tuple[int, ...]:
    return tuple(c[n] for n in mesh.names)


def _mesh_coords(mesh: Mesh, world: dict[str, int], mb: int) -> dict[str, int]:
    return {n: (mb if n == "mb" else world.get(n, 0)) for n in mesh.names}


def _run_step(
    prog: Graph,
    world: Mesh,
    coords: dict[str, int],
    feeds: dict[str, np.ndarray],
    past: dict[tuple, dict[str, Any]],
    weights: dict[str, np.ndarray],
    factory: Any,
    comm: Comm | None,
    clock: float,
    rec: StepRecord,
    cuts: dict[tuple, list[Step]],
    runners: dict[tuple, Any],
) -> dict[tuple, dict[str, Any]]:
    """Every microbatch of one step on this rank; the graph outputs it holds, per mesh coords
    (numpy arrays in a one-rank run, else torch tensors on the rank's device)."""
    mesh = meta_result(prog, "partition").mesh
    microbatches = mesh.size("mb")
    held: dict[tuple, dict[str, Any]] = {}
    for mb in range(microbatches):
        c = _mesh_coords(mesh, coords, mb)
        env = _inputs(prog, mesh, c, feeds, past, comm)
        key = _key(mesh, c)
        if key not in cuts:
            cuts[key] = cut(prog, c)
        for st in cuts[key]:
            if isinstance(st, Segment):
                runner = runners.get((key, st.index))
                if runner is None:
                    runner = factory(st, weights)
                    if getattr(runner, "rebindable", False):  # it reads the rebound graph
                        runners[(key, st.index)] = runner
                run = runner.run if comm is None else runner.run_device
                t = time.perf_counter()
                env.update(run({k: env[k] for k in st.inputs}))
                dt = time.perf_counter() - t
                rec.segments.append(SegmentTime(st.index, mb, t - clock, dt, len(st.nodes)))
                rec.compute_seconds += dt
            else:
                if comm is None:
                    raise GraphllmError(f"{st.node}: a cut point in a one-rank run")
                x = env.get(st.inputs[0])  # a recv's input is its send, on the peer
                y, crec = comm.run(prog, prog[st.node], x, mb, clock, st.kept)
                env[st.node] = y
                rec.collectives.append(crec)
                rec.comm_seconds += crec.seconds
        mine = {}
        for name, ref in prog.outputs.items():
            if on_rank(prog[ref.node], c):
                mine[name] = env[value_name(ref)]
        held[_key(mesh, c)] = mine
    return held


def _inputs(
    prog: Graph,
    mesh: Mesh,
    c: dict[str, int],
    feeds: dict[str, np.ndarray],
    past: dict[tuple, dict[str, Any]],
    comm: Comm | None,
) -> dict[str, Any]:
    """The graph inputs microbatch `c` reads on this rank: its blocks of the feeds, and the past
    its previous step left."""
    env: dict[str, Any] = {}
    for n in prog.nodes("input"):
        if not on_rank(n, c):
            continue
        if n.name in feeds:
            v = shard(feeds[n.name], n.meta["sharding"][0], mesh, c)
        else:
            v = past[_key(mesh, c)][n.name]
        # a rank of many holds torch tensors on its device from here to the step's end
        env[n.name] = v if comm is None else to_torch(v, comm.device)
    return env


def _holder(sh: Sharding, mesh: Mesh, world: Mesh, coords: dict[str, int]) -> bool:
    """Whether this rank sends its block of a tensor cut as `sh` when the ranks pool theirs:
    one rank for each block (the others hold copies of it)."""
    used = {m for splits in sh.axes for m, _ in splits}
    return all(coords[a] == 0 for a in world.names if a not in used and a != "pp")


def _gather(
    prog: Graph, names: list[str], held: dict, comm: Comm | None, world: Mesh
) -> dict[str, np.ndarray]:
    """The whole graph outputs `names` of a step, from every rank's blocks."""
    mesh = meta_result(prog, "partition").mesh
    sh = {k: prog[prog.outputs[k].node].meta["sharding"][prog.outputs[k].index] for k in names}
    mine = {}
    for key, outs in held.items():
        for k in names:
            if k in outs and (comm is None or _holder(sh[k], mesh, world, comm.coords)):
                mine[(k, key)] = to_numpy(outs[k])
    pooled = [mine]
    if comm is not None:
        import torch.distributed as dist

        pooled = [None] * dist.get_world_size()
        world_call("pooling the ranks' outputs", dist.all_gather_object, pooled, mine)
    parts: dict[str, dict[tuple, np.ndarray]] = {k: {} for k in names}
    for got in pooled:
        for (k, key), v in got.items():  # type: ignore[union-attr]
            parts[k][key] = v
    coords = {_key(mesh, c): c for c in mesh.coords()}
    out = {}
    for k in names:
        out[k] = assemble(parts[k], sh[k], mesh, coords)
    return out


def _whole_output(prog: Graph, name: str, held: dict, comm: Comm | None, world: Mesh) -> np.ndarray:
    return _gather(prog, [name], held, comm, world)[name]


def _pasts(
    prog: Graph, prev: Graph, held: dict, comm: Comm | None, world: Mesh
) -> dict[tuple, dict[str, np.ndarray]]:
    """Each microbatch's past K/V (and states) for step program `prog`, from the presents the
    previous step `prev` left on this rank: kept where both cut them alike, else pooled whole
    from every rank and cut anew (the prefill's cp blocks for a decode without cp)."""
    mesh, old = meta_result(prog, "partition").mesh, meta_result(prev, "partition").mesh
    names = {n.name: n for n in prog.nodes("input") if n.name.startswith("past_key_values.")}
    present = {k: k.replace("past_key_values.", "present.", 1) for k in names}
    same = mesh == old and all(
        prev[prev.outputs[present[k]].node].meta["sharding"][prev.outputs[present[k]].index]
        == n.meta["sharding"][0]
        for k, n in names.items()
    )
    out: dict[tuple, dict[str, np.ndarray]] = {}
    if same:
        for key, outs in held.items():
            out[key] = {
                k: _window(prog, names[k], outs[present[k]]) for k in names if present[k] in outs
            }
        return out
    whole = _gather(prev, list(present.values()), held, comm, world)
    coords = comm.coords if comm is not None else {}
    for mb in range(mesh.size("mb")):
        c = _mesh_coords(mesh, coords, mb)
        out[_key(mesh, c)] = {
            k: shard(_window(prog, n, whole[present[k]]), n.meta["sharding"][0], mesh, c)
            for k, n in names.items()
            if on_rank(n, c)
        }
    return out


def _window(prog: Graph, node: Node, v: Any) -> Any:
    """The past positions a layer's cache holds (a window layer's last W-1), as default_feeds
    cuts them; a carried state whole."""
    if prog.output_role(node.name.replace("past_key_values.", "present.", 1)) == "state":
        return v
    held = node.out.dims[2]
    n = int(prog.bindings.get(held.name, v.shape[2]))
    return v[:, :, v.shape[2] - n :]


# -- weights ------------------------------------------------------------------------------------
def rank_weights(
    job: Job, whole: Graph, program: Graph, coords: dict[str, int]
) -> dict[str, np.ndarray]:
    """This rank's block of every weight its stage reads: cut from the seeded random weights of
    the whole graph (those `verify partition` draws), or read as slices of the checkpoint."""
    mesh = meta_result(program, "partition").mesh
    c = _mesh_coords(mesh, coords, 0)
    mine = [p for p in program.params() if on_rank(p, c)]
    if job.weights is None:
        # drawn in the whole graph's order (each tensor's values depend on those before it),
        # one tensor at a time: a rank holds its blocks and one whole tensor at most
        want = {p.name: p for p in mine}
        return {
            n.name: _block(_rows(want[n.name], arr), want[n.name], mesh, c)
            for n, arr in random_tensors(whole, job.seed, "fp32")
            if n.name in want
        }
    return _checkpoint_blocks(job.weights, whole, mine, mesh, c)


def _rows(p: Node, value: np.ndarray) -> np.ndarray:
    """A weight loaded with its rows regrouped (a seeded view), as the SPMD interpreter does."""
    return value[np.asarray(p.attrs["rows"])] if "rows" in p.attrs else value


def _block(value: np.ndarray, p: Node, mesh: Mesh, c: dict[str, int]) -> np.ndarray:
    return np.ascontiguousarray(shard(value, p.meta["sharding"][0], mesh, c), dtype=np.float32)


def _slices(shape: tuple[int, ...], sh: Sharding, mesh: Mesh, c: dict[str, int]) -> tuple:
    out = []
    for i, splits in enumerate(sh.axes):
        blocks = sh.blocks(i)
        size = shape[i] // blocks
        k = block_index(splits, mesh, c)
        out.append(slice(k * size, (k + 1) * size))
    return tuple(out)


def _checkpoint_blocks(
    folder: str, whole: Graph, mine: list[Node], mesh: Mesh, c: dict[str, int]
) -> dict[str, np.ndarray]:
    """Slices of the checkpoint's tensors, read through its validated memory map: only the
    pages of this rank's block are read (a stacked expert tensor: only this rank's experts)."""
    cfg = whole.meta.get("config")
    if cfg is not None and (cfg.quantization is not None or cfg.text_decoder_of):
        raise ConfigError(
            "graphllm run reads plain float checkpoints of text models; this one is quantized "
            "or multimodal"
        )
    ckpt = SafetensorsFolder(folder)
    out = {}
    for p in mine:
        shape = tuple(int(s) for s in whole[p.name].out.shape(whole.bindings))
        sh: Sharding = p.meta["sharding"][0]
        if "rows" in p.attrs:  # regrouped rows: read whole, then cut
            out[p.name] = _block(_rows(p, _read(ckpt, p.name, shape)), p, mesh, c)
            continue
        idx = _slices(shape, sh, mesh, c)
        if p.attrs.get("stacked") == "expert" and "*" in p.name:
            experts = range(*idx[0].indices(shape[0]))
            arr = np.stack(
                [_read(ckpt, p.name.replace("*", str(e)), shape[1:], idx[1:]) for e in experts]
            )
        else:
            arr = _read(ckpt, p.name, shape, idx)
        out[p.name] = np.ascontiguousarray(arr, dtype=np.float32)
    return out


def _read(
    ckpt: SafetensorsFolder, name: str, shape: tuple[int, ...], idx: tuple = ()
) -> np.ndarray:
    if name not in ckpt:
        raise WeightsError(f"checkpoint {ckpt.folder} has no tensor {name}")
    dtype, stored = ckpt.dtype_shape(name)
    if tuple(stored) != tuple(shape):
        raise WeightsError(f"{name}: checkpoint shape {tuple(stored)}, graph expects {shape}")
    if dtype not in ("F32", "F16", "BF16", "F64"):
        return ckpt.read(name)[idx]  # its refusal names a quantized dtype
    return np.asarray(ckpt.stored(name)[idx], dtype=np.float32)


def preflight(job: Job, nproc: int, local: bool = True) -> Strategy:
    """What the ranks would refuse, refused here in one line before any starts: a strategy the
    model or workload cannot take (prefill or decode), a rank count that is not the mesh's, a
    checkpoint that does not open; and (`local`: every rank on this machine) ranks that would
    not fit in its memory together."""
    strategy = Strategy(**job.strategy)
    if strategy.devices != nproc:
        raise ConfigError(
            f"--nproc {nproc}: {strategy.describe()} runs on {strategy.devices} ranks"
            + (" (give --tp, --pp ... whose product is --nproc)" if nproc > 1 else "")
        )
    if job.new_tokens < 1:
        raise ConfigError("--new-tokens must be at least 1")
    require_runner(job.runtime)
    config = load_config(job.source)
    whole = step_graph(job, config, job.seq_len, 0)
    program = partition(whole, strategy)
    if job.new_tokens > 1:
        try:
            decode = partition(step_graph(job, config, 1, job.seq_len), decode_strategy(strategy))
        except ConfigError as e:
            raise ConfigError(f"the decode steps (one new token): {e}") from None
        if meta_result(decode, "partition").stages != meta_result(program, "partition").stages:
            raise ConfigError(
                f"--pp {strategy.pp}: the decode steps balance the layers into other stages "
                "than the prefill, and the KV cache would have to move between them"
            )
    if job.weights is not None:
        rank_weights_check(job, whole)
    if local and job.runtime == "numpy":
        # each rank holds its program's values (its blocks of the weights among them)
        held = program
        what = f"graphllm run of {config.name} on {nproc} numpy rank(s)"
        require_interpreted(held, what, runs=nproc)
    return strategy


def rank_weights_check(job: Job, whole: Graph) -> None:
    """The checkpoint opens and holds every weight at the graph's shape (nothing is read)."""
    ckpt = SafetensorsFolder(job.weights)  # type: ignore[arg-type]
    for p in whole.params():
        shape = tuple(int(s) for s in p.out.shape(whole.bindings))
        if "*" in p.name and p.attrs.get("stacked") == "expert":
            names = [(p.name.replace("*", str(e)), shape[1:]) for e in range(shape[0])]
        else:
            names = [(p.name, shape)]
        for name, want in names:
            if name not in ckpt:
                raise WeightsError(f"checkpoint {ckpt.folder} has no tensor {name}")
            got = tuple(ckpt.dtype_shape(name)[1])
            if got != want:
                raise WeightsError(f"{name}: checkpoint shape {got}, graph expects {want}")
