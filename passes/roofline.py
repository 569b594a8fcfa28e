"""The `roofline` pass: predicted time per op on a device, and what bounds it.

Each op takes max(FLOPs / rate, bytes / memory bandwidth). Under the ideal model (`--ideal`, or a
device without measured rates) the rate is the data sheet's peak for the activations' dtype and the
bandwidth the peak scaled by the hardware's fractions. Under the achievable model (the default for
a preset that has `achievable` rates) a matmul runs at the measured large-shape GEMM rate, core
attention's matmuls at the measured FlashAttention rate, the rest at the peak, and bytes move at
the measured streaming bandwidth; a small or skinny GEMM is then bandwidth-bound below the ridge,
which is how decode GEMMs measure. On a calibrated machine (`graphllm calibrate`'s tables, rate
model 'calibrated') a matmul runs at the rate measured for its shape, core attention's matmuls
under flash attention at the rate measured for the model's heads at the step, and every byte of
a step at the read bandwidth measured for the step's working set (models/calibration.py), each op
adding the runtime's measured dispatch. Under the achievable model the ops launch as the kernels
that engines fuse them into, read off the op table's categories (`kernel_key`): a flash
attention region is one kernel for all its ops; every other contraction (a GEMM per weight as
the checkpoint stores them: engines that concatenate Q, K and V, or gate and up, launch fewer;
the MoE combine; a scan or causal convolution) and every collective is a kernel of its own; and
a run of elementwise, reduction and movement ops between two of those in one layer is one
kernel (the residual add with the norm after it, SiLU with its gate, RoPE with the heads' split
and the cache write), as torch.compile, TensorRT and the engines' hand-fused kernels do; each op
of a kernel keeps its own bytes, as if it still round-tripped DRAM. Launched on its own a kernel
takes at least the host's enqueue time; inside a CUDA graph it costs the graph's per-kernel gap,
and the step one replay; a kernel streaming a weight or the cache from DRAM pays DRAM's fixed
cost instead; its ops share that cost by their times. Ops run one after another; the step's
time is their sum. With fused (flash) attention the masked (query, key) blocks are skipped, so
attention ops are timed on the FLOPs the mask allows. For a training step (cost pass with
training=True) the bytes are taken 3x (see cost.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from graphllm.build.kinds import LAYER, SCOPE_KINDS
from graphllm.errors import PassError
from graphllm.ir import Graph, Node
from graphllm.models.hardware import Achievable, Hardware
from graphllm.models.workload import GEMM_ONLY_ACTIVATIONS
from graphllm.ops import COMMUNICATION, CONTRACTION, OPS
from graphllm.passes.cost import scopes_of
from graphllm.passes.registry import meta_result, register

CORE_ATTENTION = "core_attention"  # the scope kind whose matmuls run at the attention rate


@dataclass(frozen=True)
class OpTime:
    seconds: float
    bound: str  # 'compute' | 'memory' | 'none'


@dataclass(frozen=True)
class RooflineReport:
    hardware: str
    seconds: float
    compute_bound_seconds: float
    memory_bound_seconds: float
    by_scope: dict[str, float]
    by_op: dict[str, float]
    phase: str
    tokens_per_step: int  # B x T new tokens each step produces
    peak_flops: float
    bandwidth: float

    new_tokens: int = 1  # T: tokens each sequence gains per step
    rate_model: str = "ideal"  # 'achievable' (measured rates) or 'ideal' (peaks, no overheads)
    kernels: int = 0  # kernel launches a step takes (achievable model; ops dispatched, calibrated)
    cuda_graphs: bool = False
    launch_seconds: float = 0.0  # of `seconds`: what the launches (dispatch) add over the kernels

    @property
    def ms_per_token(self) -> float:
        """Decode: milliseconds per new token of one sequence (the step's time over T)."""
        return 1e3 * self.seconds / self.new_tokens

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.seconds if self.seconds else float("inf")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self) | {"tokens_per_second": self.tokens_per_second}
        if self.phase == "decode":
            d["ms_per_token"] = self.ms_per_token
        else:
            d["prefill_ms"] = 1e3 * self.seconds
        return d


@register("roofline", requires=("cost",), options=("hardware",), writes=("time",))
def roofline_pass(
    graph: Graph, results: dict[str, Any], hardware: Hardware | None = None
) -> RooflineReport | None:
    """Time every node (into node.meta['time']); None when no hardware is given."""
    if hardware is None:
        return None
    cost = results["cost"]
    return time_nodes(graph, hardware, cost.attention == "flash", cost.training)


def time_nodes(graph: Graph, hardware: Hardware, flash: bool, training: bool) -> RooflineReport:
    """Time every node already costed (node.meta['cost']) into node.meta['time']; the report of
    their sum. The roofline pass without the registry, for a caller that costed the nodes
    itself (plan)."""
    timer = Timer(graph, hardware, flash)

    def timed() -> Iterator[Timing]:
        for n in graph.nodes():
            oc = meta_result(n, "cost")
            scopes = scopes_of(graph, n.name)
            yield n.name, n.op, *timer.base(n, oc, scopes), _core(scopes), scopes

    def write(name: str, t: OpTime) -> None:
        graph[name].meta["time"] = t

    return time_all(timed(), timer, graph.meta["workload"], training, write)


def _core(scopes: list[tuple[str, str]]) -> str | None:
    return next((s for s, k in scopes if k == CORE_ATTENTION), None)


class Timer:
    """Each op's time on the device before its launch: the part one layer's op shares with the
    same op of every layer of its kind."""

    def __init__(self, graph: Graph, hardware: Hardware, flash: bool) -> None:
        dtype = graph.meta.get("act_dtype", "bf16")
        self.hardware, self.graph, self.flash = hardware, graph, flash
        self.peak, self.bw = hardware.peak(dtype), hardware.bandwidth()
        if self.peak <= 0 or self.bw <= 0:
            raise PassError(f"hardware {hardware.name}: peak and bandwidth must be positive")
        # W8A8: the linears take the quantized dtype, the attention the 16-bit stream's
        stream = graph.meta.get("stream_dtype") or dtype
        self.gemm, self.attn = hardware.gemm_rate(dtype), hardware.attention_rate(stream)
        cal, cfg, wl = hardware.calibration, graph.meta.get("config"), graph.meta.get("workload")
        if cal is not None and flash and cfg is not None and wl is not None:
            # the fused kernel timed at this model's heads and this step (calibrate's
            # GroupQueryAttention); a head shape it did not time keeps the rate above
            heads = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
            self.attn = cal.attention_rate(*heads, wl.seq_len, wl.past_len) or self.attn

    def base(self, n: Node, oc: Any, scopes: list[tuple[str, str]]) -> tuple[float, float, bool]:
        """(compute seconds, bytes moved, whether the kernel streams from DRAM: a matmul of a
        weight, or core attention over the keys and values)."""
        flops = oc.flops - (oc.matmul - oc.matmul_causal) if self.flash else oc.flops
        core = _core(scopes)
        rate = self.peak if not oc.matmul else (self.attn if core is not None else self.gemm)
        ach, cal = self.hardware.achievable, self.hardware.calibration
        if oc.matmul and core is None and ach is not None:
            rate *= ach.gemm_efficiency(*_output_mnk(self.graph, n, oc.matmul))
        elif oc.matmul and core is None and cal is not None:
            rate = cal.gemm_rate(*_output_mnk(self.graph, n, oc.matmul))
        streams = core is not None or (
            bool(oc.matmul) and any(self.graph[r.node].op == "param" for r in n.inputs)
        )
        return flops / rate, oc.bytes / self._dequant_share(n, oc), streams

    # a weight-only quantized matmul streams its weights through a dequantising kernel
    # that reaches a measured share of the bandwidth (the preset's `dequant_efficiency`, per
    # storage dtype); its bytes are priced at that share (the weights are nearly all of a decode
    # GEMM's bytes, and a prefill GEMM is compute-bound, where the bytes do not count)
    def _dequant_share(self, n: Node, oc: Any) -> float:
        ach = self.hardware.achievable
        if not oc.matmul or ach is None or not ach.dequant_efficiency:
            return 1.0
        dtypes = {self.graph.type_of(r).dtype for r in n.inputs}
        if len(dtypes) < 2:  # both operands in one dtype: a plain GEMM, no dequantising
            return 1.0
        act = self.graph.meta.get("act_dtype")
        if act in GEMM_ONLY_ACTIVATIONS and any(
            self._weight(r) and self.graph.type_of(r).dtype == act for r in n.inputs
        ):
            # W8A8: the 16-bit stream is quantized to the weights' dtype for a plain GEMM (W4A8
            # still dequantises its weights)
            return 1.0
        # the weight's storage: attention over a quantized KV cache is no dequantising GEMV
        shares = [
            ach.dequant_efficiency.get(self.graph.type_of(r).dtype)
            for r in n.inputs
            if self._weight(r)
        ]
        return min((s for s in shares if s is not None), default=1.0)

    def _weight(self, r: Any) -> bool:
        """`r` is a weight, or a view of one (its rows regrouped)."""
        src = self.graph[r.node]
        if OPS[src.op].view and len(src.inputs) == 1:
            src = self.graph[src.inputs[0].node]
        return src.op == "param"

    def bandwidth(self, step_bytes: float) -> float:
        """Bytes/s of every op of a step that moves `step_bytes` in all: a calibration's figure
        for that working set (models/calibration.py says why the step's, not the op's), else
        the device's one bandwidth."""
        cal = self.hardware.calibration
        return self.bw if cal is None else cal.bandwidth_at(step_bytes)


FUSED = "fused"  # the kernel key of an elementwise, reduction or movement op
OWN = "own"  # the key of a kernel no other op joins


def kernel_key(op: str) -> str:
    """The kernel an op of kind `op` launches in, by its op table category: a contraction (a
    GEMM, one per weight as the checkpoint stores them) or a collective is a kernel of its own
    (OWN); an elementwise, reduction or movement op joins the run of such ops it stands in
    (FUSED). A flash attention region, whatever its ops' keys, is one kernel (`fused_kernels`)."""
    return OWN if OPS[op].category in (CONTRACTION, COMMUNICATION) else FUSED


Timing = tuple[str, str, float, float, bool, "str | None", list[tuple[str, str]]]


def fused_kernels(rows: list[Timing], seconds: list[float], flash: bool) -> list[list[int]]:
    """The kernels `rows` (taking `seconds` each) launch as, each its rows' indices in order: a
    flash attention region one (with `flash`), a run of FUSED ops one until an op of another
    kernel or another layer comes, every other op its own; an op that takes no time is in none
    and breaks no run. A kernel never spans two layers, so that one layer's tally stands for
    every layer of its kind (report/reuse.py)."""
    members: list[list[int]] = []
    regions: dict[str, int] = {}  # the flash attention regions' kernels
    layer: object = None
    fusing = False  # the kernel opened last is a run of FUSED ops
    for i, ((_, op, *_, core, scopes), t) in enumerate(zip(rows, seconds, strict=True)):
        if t == 0:
            continue
        key = kernel_key(op)
        here = next((s for s, k in scopes if k == LAYER), None)
        if flash and core is not None:
            k = regions.setdefault(core, len(members))
            fusing = False
        elif key == FUSED and here == layer and fusing:
            k = len(members) - 1
        else:
            k, fusing = len(members), key == FUSED
        layer = here
        if k == len(members):
            members.append([])
        members[k].append(i)
    return members


def time_all(
    timings: Iterable[Timing],
    timer: Timer,
    wl: Any,
    training: bool,
    write: Callable[[str, OpTime], None] | None,
) -> RooflineReport:
    """The roofline report of (name, op, compute s, bytes, streams from DRAM, flash attention
    region, scopes) in graph order, each op's OpTime handed to `write` (None: not wanted)."""
    rows = list(timings)  # held to the end: the ids the tally keys on stay those of live lists
    bw = step_bandwidth(timer, training, [r[3] for r in rows])
    tally = TimeTally()
    tally.add(rows, timer, wl, training, bw, write)
    return tally.report(timer, wl, training, bw)


def step_bandwidth(timer: Timer, training: bool, moved: list[float]) -> float:
    """The bandwidth every op of a step moving `moved` bytes runs at (Timer.bandwidth)."""
    if timer.hardware.calibration is None:
        return timer.bw
    return timer.bandwidth((3.0 if training else 1.0) * math.fsum(moved))


@dataclass
class TimeTally:
    """The sums a roofline report is made of, over a run of ops. Each float sum is kept as its
    addends and added by math.fsum, correctly rounded, so that it does not depend on their
    order: one layer's tally stands for every layer of its kind (report/reuse.py) and its
    report is the full graph's to the last bit."""

    total: list[float] = field(default_factory=list)
    comp: list[float] = field(default_factory=list)
    mem: list[float] = field(default_factory=list)
    overhead: list[float] = field(default_factory=list)
    kernels: int = 0
    by_scope: dict[str, list[float]] = field(default_factory=dict)
    by_op: dict[str, list[float]] = field(default_factory=dict)

    def add(
        self,
        rows: list[Timing],
        timer: Timer,
        wl: Any,
        training: bool,
        bw: float,
        write: Callable[[str, OpTime], None] | None,
    ) -> None:
        """Time `rows` (their flash attention regions their own) at bandwidth `bw`."""
        hardware = timer.hardware
        byte_factor = 3.0 if training else 1.0
        ach = hardware.achievable
        times: list[tuple[float, str]] = []
        for _, _, tc, moved, *_ in rows:
            tm = byte_factor * moved / bw
            t = max(tc, tm)
            times.append((t, "none" if t == 0 else ("compute" if tc >= tm else "memory")))
        if ach is not None:
            extras = self._launches(rows, times, timer.flash, hardware.graphs_for(wl.phase), ach)
        else:
            extras = self._dispatches(rows, times, timer.flash, hardware)
        kinds_of: dict[int, tuple[str, ...]] = {}
        for (name, op, *_, scopes), (t, bound), extra in zip(rows, times, extras, strict=True):
            if extra is not None:
                self.overhead.append(extra)
                t += extra
            if write is not None:
                write(name, OpTime(t, bound))
            if t == 0:
                continue
            self.total.append(t)
            (self.comp if bound == "compute" else self.mem).append(t)
            self.by_op.setdefault(op, []).append(t)
            key = id(scopes)  # the ops of one module share their scopes' list: its kinds once
            kinds = kinds_of.get(key)
            if kinds is None:
                kinds = kinds_of[key] = tuple({k for _, k in scopes if k != LAYER})
            for kind in kinds:
                self.by_scope.setdefault(kind, []).append(t)

    def _launches(
        self,
        rows: list[Timing],
        times: list[tuple[float, str]],
        flash: bool,
        graphs: bool,
        ach: Achievable,
    ) -> list[float | None]:
        """Each row's share of its kernel's launch cost (`fused_kernels`), in proportion to its
        time (None for an op that takes no time), counting the kernels."""
        members = fused_kernels(rows, [t for t, _ in times], flash)
        extras: list[float | None] = [None] * len(rows)
        for ops in members:
            seconds = math.fsum(times[i][0] for i in ops)
            extra = _launch(seconds, graphs, any(rows[i][4] for i in ops), ach)
            for i in ops:  # each op its share, so that no op's time falls as its own grows
                extras[i] = extra * times[i][0] / seconds
        self.kernels += len(members)
        return extras

    def _dispatches(
        self, rows: list[Timing], times: list[tuple[float, str]], flash: bool, hardware: Hardware
    ) -> list[float | None]:
        """Each row's dispatch on a calibrated machine, whose runtime dispatches every op (a
        flash attention region once; models/calibration.py); None under the ideal model."""
        cal = hardware.calibration
        if cal is None or not cal.dispatch:
            return [None] * len(rows)
        seen: set[str] = set()
        out: list[float | None] = []
        for (*_, core, _), (t, _) in zip(rows, times, strict=True):
            if t == 0:
                out.append(None)
                continue
            launches = not (flash and core is not None and core in seen)
            if flash and core is not None:
                seen.add(core)
            self.kernels += launches
            out.append(cal.dispatch if launches else 0.0)
        return out

    def extend(self, other: TimeTally) -> None:
        """Add `other`'s ops after this tally's."""
        for mine, theirs in (
            (self.total, other.total),
            (self.comp, other.comp),
            (self.mem, other.mem),
            (self.overhead, other.overhead),
        ):
            mine.extend(theirs)
        self.kernels += other.kernels
        for d, od in ((self.by_scope, other.by_scope), (self.by_op, other.by_op)):
            for k, x in od.items():
                d.setdefault(k, []).extend(x)

    def report(self, timer: Timer, wl: Any, training: bool, bw: float) -> RooflineReport:
        hardware = timer.hardware
        ach = hardware.achievable
        graphs = ach is not None and hardware.graphs_for(wl.phase)
        replay = [ach.graph_replay_seconds or 0.0] if graphs and ach is not None else []
        by_op = {k: math.fsum(v) for k, v in self.by_op.items()}
        return RooflineReport(
            hardware=hardware.name,
            seconds=math.fsum(self.total + replay),
            compute_bound_seconds=math.fsum(self.comp),
            memory_bound_seconds=math.fsum(self.mem),
            by_scope={k: math.fsum(self.by_scope[k]) for k in SCOPE_KINDS if k in self.by_scope},
            by_op=dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
            phase=wl.phase,
            tokens_per_step=wl.batch * wl.seq_len,
            new_tokens=wl.seq_len,
            peak_flops=timer.peak,
            bandwidth=bw,
            rate_model=hardware.rate_model,
            kernels=self.kernels,
            cuda_graphs=graphs,
            launch_seconds=math.fsum(self.overhead + replay),
        )


def _output_mnk(graph: Graph, n: Node, flops: float) -> tuple[float, float, float]:
    """A GEMM's (M, N, K): N its output's last axis, M every other output axis folded into rows,
    K what its FLOPs (2 M N K) leave."""
    cols = float(n.out.shape(graph.bindings)[-1])
    rows = n.out.numel(graph.bindings) / cols
    return rows, cols, flops / (2 * rows * cols)


def _launch(t: float, graphs: bool, streams: bool, ach: Achievable) -> float:
    """Seconds a kernel of `t` seconds takes beyond `t` for its launch (an unmeasured figure
    costs nothing). Inside a CUDA graph: the gap between the graph's kernels, or a streaming
    kernel's larger fixed cost. Launched on its own: the host enqueues a kernel every
    `launch_seconds`, so a shorter kernel waits for the next launch (a longer one hides it),
    and a streaming kernel pays its fixed cost outside a graph whatever its length."""
    if graphs:
        fixed = ach.graph_stream_launch_seconds if streams else None
        return fixed if fixed is not None else ach.graph_launch_seconds or 0.0
    host = max(0.0, (ach.launch_seconds or 0.0) - t)
    return max(host, ach.stream_launch_seconds or 0.0) if streams else host
