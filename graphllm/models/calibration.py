"""This machine's measured rate tables (`graphllm calibrate`): read bandwidth by working set, GEMM
rate by shape, fused attention's rate by head shape and step, and how the roofline picks from
them.

The rule for bandwidth: an op's bytes move at the bandwidth the sweep measured for a working set
of the whole step's bytes (`bandwidth_at(step bytes)`), not of the op's own. A step runs again
and again (bench's decode loop; a server's steps), and each weight and cache byte an op reads was
last read one step earlier: its reuse distance is everything the step touches. When that fits in
the cache, the weights stream from the cache; when it does not, an LRU cache has evicted them
before they come round again, however small each op's matrix is. The sweep reads its buffer in
the same cyclic way, so its figure at the step's size is what the step sees. The activations a
step writes and reads back are counted in the step's bytes too, which overstates its working set
a little (they are reused at once); a step whose weights dominate, as every decode step's do, is
priced right.

The rule for GEMMs: an op's compute ceiling is the rate measured for its shape, alone and repeated
(its own matrix hot): log-log interpolation over M at the measured (K, N) nearest to the op's,
clamped at the ends of the measured M. A skinny (decode) GEMM's measured rate is its kernel's
read of its own matrix; the roofline takes the larger of that time and the bytes over the step's
bandwidth, so a step that does not fit the cache is bound by the streaming read.

The rule for fused attention: onnxruntime's GroupQueryAttention, the ort lowering's core
attention (its rotary, cache append, scores, softmax and values in one kernel), is timed at the
model's heads for each step, prefill and decode. Its rate is the FLOPs the cost pass counts for
that step's core-attention matmuls under flash attention (`attention_flops`: the causal pairs
only) over the kernel's time, so the roofline, dividing the same FLOPs by it, gives back the
time measured. A prefill's batched 128 x 64 matmuls per head, and a decode step's one-row ones,
run far below the GEMM table's rates; an op of the measured head shape takes the rate at the
measured query length nearest its own (in log), interpolated over the key length (log-log,
clamped at the ends). A head shape not measured has no table rate: the matmul peak, as before.

The rule for dispatch: every op of the graph with time to take (a flash attention region one for
all its ops, as a launch under the achievable model) adds the runtime's measured cost per node,
onnxruntime's scheduling of a node beyond its kernel (about 0.5 us on the project's 2-core VM).
The graph's ops are not the export's nodes one for one (the ort lowering fuses Q, K and V, gate
and up, norms with residual adds, and adds Splits), so this prices their number roughly; it is
what a cache-sized model's decode step, tens of kernels of microseconds, misses without it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

from graphllm.echo import shown
from graphllm.errors import ConfigError

READ_FIELDS = ("bytes", "bandwidth")
GEMM_FIELDS = ("m", "k", "n", "flops")
ATTENTION_FIELDS = ("heads", "kv_heads", "head_dim", "seq", "past", "flops")
CALIBRATION_FIELDS = ("runtime", "read_bandwidth", "gemm", "attention", "dispatch")
DISPATCH_RANGE = (1e-9, 0.1)  # seconds a node, as a kernel launch
BANDWIDTH_RANGE = (1e6, 1e15)  # bytes/s, as a device's memory_bandwidth
FLOPS_RANGE = (1e6, 1e18)
SIZE_RANGE = (1, 1 << 50)  # a working set or a GEMM dimension
MAX_POINTS = 4096  # a sweep has tens of points; a table of millions is not a measurement


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Rates measured on one machine, each table sorted by its key."""

    runtime: str  # what ran the measurements: 'onnxruntime <version>' or 'numpy <version>'
    read_bandwidth: tuple[tuple[int, float], ...]  # (working-set bytes, bytes/s), by size
    gemm: tuple[tuple[int, int, int, float], ...]  # (M, K, N, FLOP/s), by (K, N, M)
    # (heads, kv heads, head_dim, query tokens, past tokens, FLOP/s), sorted; () in a file
    # written before the table (core attention then at the matmul peak, as it was)
    attention: tuple[tuple[int, int, int, int, int, float], ...] = ()
    # seconds the runtime spends on each op beyond its kernel's work (a chain of tiny nodes,
    # less one); None in a file written before it (ops then cost their kernels' time alone)
    dispatch: float | None = None

    def bandwidth_at(self, working_set: float) -> float:
        """Read bandwidth for a working set of `working_set` bytes: log-log interpolation between
        the two measured sizes around it, the end's figure beyond the measured range."""
        sizes = [s for s, _ in self.read_bandwidth]
        rates = [r for _, r in self.read_bandwidth]
        return _interpolate(sizes, rates, working_set)

    def gemm_rate(self, m: float, n: float, k: float) -> float:
        """FLOP/s of an (m x k) @ (k x n) GEMM: over M at the measured (K, N) nearest the op's in
        log distance (the first such on a tie)."""
        shapes = sorted({(kk, nn) for _, kk, nn, _ in self.gemm})
        near = min(shapes, key=lambda s: abs(math.log(s[0] / k)) + abs(math.log(s[1] / n)))
        points = sorted((mm, r) for mm, kk, nn, r in self.gemm if (kk, nn) == near)
        return _interpolate([p for p, _ in points], [r for _, r in points], m)

    def attention_rate(
        self, heads: int, kv_heads: int, head_dim: int, seq: int, past: int
    ) -> float | None:
        """FLOP/s (as `attention_flops` counts them) of fused attention of this head shape over
        `seq` new tokens after `past`: at the measured query length nearest `seq` (in log; the
        shorter on a tie), interpolated over the key length; None where the head shape was not
        measured."""
        points = [p[3:] for p in self.attention if p[:3] == (heads, kv_heads, head_dim)]
        if not points:
            return None
        near = min(sorted({s for s, _, _ in points}), key=lambda s: abs(math.log(s / seq)))
        row = sorted((s + p, r) for s, p, r in points if s == near)
        return _interpolate([k for k, _ in row], [r for _, r in row], seq + past)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists of mappings (YAML has no tuples), loadable by `calibration_from_dict`."""
        d: dict[str, Any] = {
            "runtime": self.runtime,
            "read_bandwidth": [dict(zip(READ_FIELDS, p)) for p in self.read_bandwidth],
            "gemm": [dict(zip(GEMM_FIELDS, p)) for p in self.gemm],
        }
        if self.attention:  # a file without the table reads as before it
            d["attention"] = [dict(zip(ATTENTION_FIELDS, p)) for p in self.attention]
        if self.dispatch is not None:
            d["dispatch"] = self.dispatch
        return d


def attention_flops(heads: int, head_dim: int, seq: int, past: int) -> int:
    """The FLOPs of causal attention's two matmuls (Q K^T and P V) over `seq` new tokens after
    `past`, each query with the keys up to its own position only: what the cost pass counts for
    a step's core attention under flash attention (its matmul FLOPs times the allowed share)."""
    pairs = seq * past + seq * (seq + 1) // 2
    return 2 * 2 * heads * head_dim * pairs


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """y at x, linear in (log x, log y) between the points around x; the end's y outside."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:  # a measured point: its own figure, not one rounded through the logs
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    w = math.log(x / x0) / math.log(x1 / x0)
    return math.exp((1 - w) * math.log(y0) + w * math.log(y1))


def calibration_from_dict(value: Any, where: str) -> Calibration:
    """Validate a `calibration` mapping: each figure positive and in range, each table non-empty,
    no size measured twice."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {shown(value)}")
    unknown = [k for k in value if k not in CALIBRATION_FIELDS]
    if unknown:
        raise ConfigError(
            f"{where}: unknown field {shown(unknown[0])}; known: {', '.join(CALIBRATION_FIELDS)}"
        )
    runtime = value.get("runtime")
    if not isinstance(runtime, str) or not runtime.isprintable() or len(runtime) > 200:
        raise ConfigError(f"{where}.runtime must be a line of text, got {shown(runtime, 40)}")
    read = _table(value.get("read_bandwidth"), f"{where}.read_bandwidth", READ_FIELDS)
    gemm = _table(value.get("gemm"), f"{where}.gemm", GEMM_FIELDS)
    read_points = sorted(
        (int(_num(p["bytes"], f"{where}.read_bandwidth.bytes", SIZE_RANGE, True)),
         _num(p["bandwidth"], f"{where}.read_bandwidth.bandwidth", BANDWIDTH_RANGE))
        for p in read
    )  # fmt: skip
    gemm_points = sorted(
        (tuple(int(_num(p[f], f"{where}.gemm.{f}", SIZE_RANGE, True)) for f in "mkn"),
         _num(p["flops"], f"{where}.gemm.flops", FLOPS_RANGE))
        for p in gemm
    )  # fmt: skip
    if len({s for s, _ in read_points}) < len(read_points):
        raise ConfigError(f"{where}.read_bandwidth: a working-set size is measured twice")
    if len({s for s, _ in gemm_points}) < len(gemm_points):
        raise ConfigError(f"{where}.gemm: a shape (m, k, n) is measured twice")
    attention = []
    if "attention" in value:
        for p in _table(value["attention"], f"{where}.attention", ATTENTION_FIELDS):
            low = {"past": 0}  # a prefill has no past; every other count is at least 1
            sizes = tuple(
                int(_num(p[f], f"{where}.attention.{f}", (low.get(f, 1), SIZE_RANGE[1]), True))
                for f in ATTENTION_FIELDS[:5]
            )
            attention.append((*sizes, _num(p["flops"], f"{where}.attention.flops", FLOPS_RANGE)))
        attention.sort()
        if len({p[:5] for p in attention}) < len(attention):
            raise ConfigError(f"{where}.attention: a head shape and step is measured twice")
    dispatch = value.get("dispatch")
    if dispatch is not None:
        dispatch = _num(dispatch, f"{where}.dispatch", DISPATCH_RANGE)
    return Calibration(
        dispatch=dispatch,
        runtime=runtime,
        read_bandwidth=tuple(read_points),
        gemm=tuple((m, k, n, r) for (m, k, n), r in gemm_points),
        attention=tuple(attention),  # type: ignore[arg-type]
    )


def _table(value: Any, where: str, fields: tuple[str, ...]) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of mappings, got {shown(value, 40)}")
    if len(value) > MAX_POINTS:
        raise ConfigError(f"{where} has {len(value)} points; at most {MAX_POINTS}")
    for p in value:
        if not isinstance(p, dict) or set(p) != set(fields):
            raise ConfigError(
                f"{where}: each point must be a mapping of {', '.join(fields)}, got {shown(p, 40)}"
            )
    return value


def _num(value: Any, label: str, bounds: tuple[float, float], integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not bounds[0] <= value <= bounds[1]:
        kind = "an integer" if integer else "a number"
        raise ConfigError(
            f"{label} must be {kind} in [{bounds[0]:g}, {bounds[1]:g}], got {shown(value, 40)}"
        )
    return value if integer else float(value)
