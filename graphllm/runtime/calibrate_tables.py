"""calibrate's tables: read bandwidth over a sweep of working sets, GEMM rates over shapes,
fused attention's rate by head shape and step, and the runtime's cost per node.

Both are measured with the runtime `bench` runs, onnxruntime's CPU provider, when it is installed
(numpy's BLAS otherwise, and the table says which):

- a working set of S bytes is a chain of fp32 MatMuls of one row (a decode step's GEMV) through
  S bytes of weights, 1024 x 1024 matrices (with a model, squares of its layers' mean linear
  weight, so that the chain has the step's number of kernels a byte; one smaller square one
  below a matrix's size),
  stored as initializers so that onnxruntime prepacks them as it does an export's, and moved onto
  huge pages as bench moves an export's: what a decode step reads, read the way it reads them,
  in the same cyclic order step after step;
- a GEMM of (M, K, N) is one MatMul of an M x K input by a K x N initializer;
- attention of a head shape at a step (S new tokens after P) is one com.microsoft
  GroupQueryAttention as the ort lowering emits it (rotary fused where its CPU kernel rotates
  the head width, a padding bias over the keys) on a cache of P + S positions bound as both its
  past and its present, as bench binds an export's (onnxruntime only: numpy has no such kernel,
  and the table is then left out).

The time of one run of a session that does nothing (an Identity of the same input) is taken off
each run's, so the table holds the kernels' time and not Python's call into onnxruntime, which
bench's one call per step spreads over every op of the step.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from graphllm.models.calibration import attention_flops
from graphllm.runtime import hugepages

CHUNK = 1024  # the sweep's matrices: 1024 x 1024 fp32, 4 MiB each
SWEEP_STEP = math.sqrt(2)  # two sizes per octave: enough to place the cache's edge
GEMM_MS = (1, 2, 4, 8, 128, 512, 2048)  # decode-like rows, then prefill-like ones
SAMPLE_BYTES = 256 << 20  # a timed sample reads at least this much: a tenth of a second or so,
# long enough that a load passing on a shared machine does not decide it
SAMPLE_SECONDS = 0.02  # a GEMM's timed sample lasts at least this long
# a kernel runs untimed this long after its session is built, as bench's warm-up generation
# runs its model: a thread pool just made may still be spinning or placed on one core with the
# caller's thread (a session's first 60-80 ms ran the small Llama's GEMV chain at half speed on
# 2 cores while the idle session's worker spun beside it; idle sessions are single-threaded now)
SETTLE_SECONDS = 0.1
# a GEMM of more FLOPs is not measured (M > 1): an LM head of 128k columns at M = 2048 is a
# TFLOP, seconds a run; one that large runs at the rate of the largest M measured below it
GEMM_MAX_FLOP = 64e9
# attention's steps (new tokens, past tokens) by default: decode at a short and a long cache, a
# prefill; a model's bench measures its own (benchmarks/bench_calibration.py)
ATTENTION_STEPS = ((1, 512), (1, 4096), (512, 0))
GQA_ROTARY_MULTIPLE = 16  # its CPU kernel rotates heads of a multiple of 16 (exporters fused.py)


def sweep_sizes(low: int, high: int, chunk: int = CHUNK) -> list[int]:
    """Working sets from `low` to `high` bytes, SWEEP_STEP apart, each as the chain of
    `chunk` x `chunk` matrices holds it."""
    sizes, s = [chain_bytes(high, chunk)], float(low)
    while s < high:
        sizes.append(chain_bytes(int(s), chunk))
        s *= SWEEP_STEP
    return sorted(set(sizes))


def _chain_shape(nbytes: int, chunk: int = CHUNK) -> tuple[int, int]:
    """(matrices, side) of the chain that holds about `nbytes` of fp32 weights."""
    if nbytes >= 4 * chunk * chunk:
        return nbytes // (4 * chunk * chunk), chunk
    return 1, max(16, int(math.sqrt(nbytes / 4)) // 16 * 16)


def chain_bytes(nbytes: int, chunk: int = CHUNK) -> int:
    """The bytes the chain for `nbytes` really holds."""
    count, side = _chain_shape(nbytes, chunk)
    return 4 * count * side * side


def runtime_name() -> str:
    """What runs the measurements: onnxruntime where installed, else numpy."""
    try:
        import onnxruntime as ort
    except ImportError:
        return f"numpy {np.__version__}"
    return f"onnxruntime {ort.__version__} (CPUExecutionProvider)"


class _Runner:
    """One measured program: `run()` once; `idle()` the same call doing nothing."""

    def __init__(self, mats: list[np.ndarray], rows: int, threads: int) -> None:
        self.x = np.ones((rows, mats[0].shape[0]), np.float32)
        self.mats = mats
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            self.run, self.idle = self._numpy(), lambda: None
            return
        self.run = self._session(mats, threads)
        # one thread: an Identity runs on the caller's, and a pool's worker spinning idle
        # beside the timed kernel's would be a third runnable thread on a 2-core machine
        self.idle = self._session([], 1)

    def _numpy(self) -> Callable[[], object]:
        outs = [np.empty((self.x.shape[0], m.shape[1]), np.float32) for m in self.mats]

        def run() -> None:
            y = self.x
            for m, out in zip(self.mats, outs):
                y = np.matmul(y, m, out=out)

        return run

    def _session(self, mats: list[np.ndarray], threads: int) -> Callable[[], object]:
        import onnxruntime as ort

        nodes, inits, prev = [], [], "x"
        for i, m in enumerate(mats):
            t = TensorProto(name=f"w{i}", data_type=TensorProto.FLOAT, dims=list(m.shape))
            t.data_location = TensorProto.EXTERNAL  # the array itself, handed over below
            t.external_data.add(key="location", value="calibrate")
            inits.append(t)
            nodes.append(helper.make_node("MatMul", [prev, t.name], [f"y{i}"]))
            prev = f"y{i}"
        if not mats:
            nodes.append(helper.make_node("Identity", ["x"], ["y"]))
            prev = "y"
        rows, cols = self.x.shape
        out_cols = mats[-1].shape[1] if mats else cols
        graph = helper.make_graph(
            nodes,
            "calibrate",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, cols])],
            [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [rows, out_cols])],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        so = ort.SessionOptions()
        if mats:
            values = [ort.OrtValue.ortvalue_from_numpy(m) for m in mats]
            so.add_external_initializers([t.name for t in inits], values)
        sess = _ort_session(model.SerializeToString(), threads, so)
        if mats:
            hugepages.collapse()  # the prepacked copy onto huge pages, as bench moves an export's
        feed = {"x": self.x}
        return lambda: sess.run(None, feed)


class _Attention:
    """One GroupQueryAttention of `heads` query and `kv_heads` key/value heads of `head_dim`
    over `seq` new tokens after `past`, run through an IO binding; `idle()` an Identity."""

    def __init__(
        self, heads: int, kv_heads: int, head_dim: int, seq: int, past: int, threads: int
    ) -> None:
        model, inputs = _gqa_model(heads, kv_heads, head_dim, seq, past)
        sess = _ort_session(model.SerializeToString(), threads)
        io = _gqa_binding(sess, inputs, [1, kv_heads, past + seq, head_dim], seq)
        self.run = lambda: sess.run_with_iobinding(io)
        # the same call doing nothing: an Identity of the query, bound as the kernel's inputs are
        self.idle = _identity([1, seq, heads * head_dim])


def _gqa_model(heads: int, kv_heads: int, head_dim: int, seq: int, past: int) -> tuple[Any, list]:
    """The one-node GroupQueryAttention model as the ort lowering emits it, and its inputs."""
    total, f = past + seq, TensorProto.FLOAT
    rotary = head_dim % GQA_ROTARY_MULTIPLE == 0
    cache = [1, kv_heads, total, head_dim]
    inputs = [
        helper.make_tensor_value_info("query", f, [1, seq, heads * head_dim]),
        helper.make_tensor_value_info("key", f, [1, seq, kv_heads * head_dim]),
        helper.make_tensor_value_info("value", f, [1, seq, kv_heads * head_dim]),
        helper.make_tensor_value_info("past_key", f, cache),
        helper.make_tensor_value_info("past_value", f, cache),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        helper.make_tensor_value_info("attention_bias", f, [1, 1, seq, total]),
    ]
    angles = np.arange(total, dtype=np.float32)[:, None] * np.geomspace(
        1.0, 1e-4, head_dim // 2, dtype=np.float32
    )
    tables = [
        numpy_helper.from_array(fn(angles), name)
        for name, fn in (("cos_cache", np.cos), ("sin_cache", np.sin))
    ]
    names = [i.name for i in inputs[:7]]
    names += ["cos_cache", "sin_cache"] if rotary else ["", ""]
    node = helper.make_node(
        "GroupQueryAttention",
        [*names, "", "attention_bias"],
        ["out", "present_key", "present_value"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=kv_heads,
        scale=head_dim**-0.5,
        do_rotary=int(rotary),
    )
    outputs = [
        helper.make_tensor_value_info("out", f, [1, seq, heads * head_dim]),
        helper.make_tensor_value_info("present_key", f, cache),
        helper.make_tensor_value_info("present_value", f, cache),
    ]
    graph = helper.make_graph([node], "attention", inputs, outputs, tables if rotary else [])
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    return model, inputs


def _gqa_binding(sess: Any, inputs: list, cache: list[int], seq: int) -> Any:
    """An IO binding of seeded random inputs, the cache one buffer bound as both past and
    present (as bench binds an export's), the output on the CPU."""
    import onnxruntime as ort

    total = cache[2]
    rng = np.random.default_rng(0)
    value = ort.OrtValue.ortvalue_from_numpy
    io = sess.io_binding()
    for i in inputs[:3]:
        dims = [d.dim_value for d in i.type.tensor_type.shape.dim]
        io.bind_ortvalue_input(i.name, value(rng.random(dims, dtype=np.float32)))
    for name in ("key", "value"):  # one buffer past and present: appended in place
        buf = value(rng.random(cache, dtype=np.float32))
        io.bind_ortvalue_input(f"past_{name}", buf)
        io.bind_ortvalue_output(f"present_{name}", buf)
    io.bind_ortvalue_input("seqlens_k", value(np.array([total - 1], np.int32)))
    io.bind_ortvalue_input("total_sequence_length", value(np.array(total, np.int32)))
    io.bind_ortvalue_input("attention_bias", value(np.zeros([1, 1, seq, total], np.float32)))
    io.bind_output("out", "cpu")
    return io


def _identity(shape: list[int]) -> Callable[[], object]:
    """An Identity of an fp32 `shape` through an IO binding, on one thread as _Runner's idle."""
    import onnxruntime as ort

    f = TensorProto.FLOAT
    x, y = (helper.make_tensor_value_info(n, f, shape) for n in ("x", "y"))
    idle = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "idle", [x], [y])
    nothing = _ort_session(helper.make_model(idle).SerializeToString(), 1)
    io_idle = nothing.io_binding()
    io_idle.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32)))
    io_idle.bind_output("y", "cpu")
    return lambda: nothing.run_with_iobinding(io_idle)


DISPATCH_NODES = 64  # the chain whose per-node time is the runtime's dispatch cost


class _Dispatch:
    """A chain of DISPATCH_NODES + 1 Adds of one short row (`run`) and of one Add (`idle`),
    graph optimisations off so that none is folded or fused: their difference over
    DISPATCH_NODES is what onnxruntime spends on a node beyond its kernel's work."""

    def __init__(self, threads: int) -> None:
        self.run = self._chain(DISPATCH_NODES + 1, threads)
        self.idle = self._chain(1, threads)

    @staticmethod
    def _chain(count: int, threads: int) -> Callable[[], object]:
        import onnxruntime as ort

        width, f = 512, TensorProto.FLOAT
        nodes, inits, prev = [], [], "x"
        for i in range(count):
            c = np.full((1, width), 1e-3 * (i + 1), np.float32)
            inits.append(numpy_helper.from_array(c, f"c{i}"))
            nodes.append(helper.make_node("Add", [prev, f"c{i}"], [f"y{i}"]))
            prev = f"y{i}"
        graph = helper.make_graph(
            nodes,
            "dispatch",
            [helper.make_tensor_value_info("x", f, [1, width])],
            [helper.make_tensor_value_info(prev, f, [1, width])],
            inits,
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = _ort_session(model.SerializeToString(), threads, so)
        feed = {"x": np.ones((1, width), np.float32)}
        return lambda: sess.run(None, feed)


def dispatch_seconds(threads: int, repeats: int, settle: float = SETTLE_SECONDS) -> float | None:
    """Seconds onnxruntime spends on each node of a step beyond its kernel's work (None without
    onnxruntime: numpy's calls are not what bench runs)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return None
    runner = _Dispatch(threads)
    inner, once = _sized(runner)
    busy, idle = _busy_idle(runner, inner, repeats, settle - once)
    return max(busy - idle, 0.0) / DISPATCH_NODES or None  # 0: below the clock's reach


def _ort_session(model: bytes, threads: int, so: Any = None) -> Any:
    """An onnxruntime CPU session on `model` with `threads` intra-op threads and one inter-op."""
    import onnxruntime as ort

    so = so or ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def attention_table(
    heads: Sequence[tuple[int, int, int]],
    steps: Sequence[tuple[int, int]],
    threads: int,
    repeats: int,
    budget: float,
    step: Callable[[], None] = lambda: None,
    max_bytes: int | None = None,
    settle: float = SETTLE_SECONDS,
) -> list[tuple[int, int, int, int, int, float]]:
    """(heads, kv heads, head_dim, seq, past, FLOP/s) of GroupQueryAttention for each head shape
    and each (seq, past) of `steps`, the rate over `attention_flops`; empty without
    onnxruntime. Past `budget` seconds the steps not reached yet are left out (the first step
    of each head shape always measured); so is a step whose cache, inputs and bias do not fit
    COPIES times in `max_bytes` (the roofline then reads its nearest measured step)."""
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return []
    start, out = time.perf_counter(), []
    for h, kv, d in heads:
        for i, (seq, past) in enumerate(steps):
            if i and time.perf_counter() - start > budget:
                break
            total = past + seq
            need = 4 * COPIES * (2 * kv * total * d + seq * (2 * h + 2 * kv) * d + seq * total)
            if max_bytes is not None and need > max_bytes:
                continue
            runner = _Attention(h, kv, d, seq, past, threads)
            flops = attention_flops(h, d, seq, past)
            out.append((h, kv, d, seq, past, flops / _timed(runner, repeats, settle)))
            step()
    return sorted(out)


def _timed(runner: _Runner | _Attention, repeats: int, settle: float) -> float:
    """`_seconds` of a kernel in samples of enough runs to last SAMPLE_SECONDS each (one untimed
    run sizes them)."""
    inner, once = _sized(runner)
    return _seconds(runner, inner, repeats, settle - once)


def _sized(runner: _Runner | _Attention | _Dispatch) -> tuple[int, float]:
    """(runs a sample of SAMPLE_SECONDS holds, seconds of the one untimed run that says so)."""
    t0 = time.perf_counter()
    runner.run()
    once = max(time.perf_counter() - t0, 1e-6)
    return max(1, math.ceil(SAMPLE_SECONDS / once)), once


def _seconds(runner: _Runner | _Attention, inner: int, repeats: int, settle: float) -> float:
    """Median seconds of one run over `repeats` samples of `inner` runs each, less an idle run's,
    after `settle` seconds of untimed runs (one at least)."""
    busy, idle = _busy_idle(runner, inner, repeats, settle)
    # a load spike in the idle samples must not make a run free
    return max(busy - idle, 0.5 * busy)


def _busy_idle(
    runner: _Runner | _Attention | _Dispatch, inner: int, repeats: int, settle: float
) -> tuple[float, float]:
    """(run, idle): median seconds of one call over `repeats` samples of `inner` calls each,
    after `settle` seconds of untimed runs (one at least)."""

    def sample(f: Callable[[], object]) -> float:
        t0 = time.perf_counter()
        for _ in range(inner):
            f()
        return (time.perf_counter() - t0) / inner

    start = time.perf_counter()
    runner.run()
    while time.perf_counter() - start < settle:
        runner.run()
    runner.idle()
    busy = statistics.median(sample(runner.run) for _ in range(repeats))
    idle = statistics.median(sample(runner.idle) for _ in range(repeats))
    return busy, idle


def read_sweep(
    sizes: Sequence[int],
    threads: int,
    repeats: int,
    budget: float,
    step: Callable[[], None] = lambda: None,
    settle: float = SETTLE_SECONDS,
    chunk: int = CHUNK,
) -> list[tuple[int, float]]:
    """(bytes, bytes/s) per working set: the largest first (the figure past every cache, which
    a model larger than the cache needs), then the rest from the smallest up while `budget`
    seconds last."""
    order = [sizes[-1], *sizes[:-1]]
    start, out = time.perf_counter(), []
    for s in order:
        if out and time.perf_counter() - start > budget:
            break
        count, side = _chain_shape(s, chunk)
        # each matrix filled with its own value (onnxruntime stores equal initializers once,
        # which would shrink the working set), each about 1/side so that the products stay
        # near 1; a fill is quick where a random draw of gigabytes is not
        mats = [
            np.full((side, side), (1 + (-1) ** i * (i + 1) * 2.0**-20) / side, np.float32)
            for i in range(count)
        ]
        runner = _Runner(mats, 1, threads)
        inner = max(1, math.ceil(SAMPLE_BYTES / s))
        out.append((s, s / _seconds(runner, inner, repeats, settle)))
        del runner, mats
        step()
    return sorted(out)


# copies of a GEMM's weight (and of its activations) alive at once while onnxruntime builds and
# runs its session: the array, the serialized model, the parsed initializer, the prepacked
# matrix, with headroom for its arena and the address space its thread pools reserve
COPIES = 8


def gemm_table(
    shapes: Sequence[tuple[int, int]],
    ms: Sequence[int],
    threads: int,
    repeats: int,
    budget: float,
    step: Callable[[], None] = lambda: None,
    max_bytes: int | None = None,
    settle: float = SETTLE_SECONDS,
) -> list[tuple[int, int, int, float]]:
    """(M, K, N, FLOP/s) for each (K, N) of `shapes` and each M of `ms` up to GEMM_MAX_FLOP;
    once `budget` seconds are spent, the Ms not reached yet at each shape are left out (its
    smallest M and largest, the two ends of the interpolation, always measured).

    Within `max_bytes`, N is cut so that COPIES fp32 weights fit (a 405B's 16384 x 53248 FFN is
    3.25 GiB a copy) and an M whose input and output do not fit COPIES times is left out; the
    table records the (K, N) it timed, so the roofline reads a shape that was measured."""
    start, out = time.perf_counter(), []
    if max_bytes is not None:
        shapes = list(
            dict.fromkeys((k, max(1, min(n, max_bytes // (4 * COPIES * k)))) for k, n in shapes)
        )
    for k, n in shapes:
        w = np.random.default_rng(0).random((k, n), dtype=np.float32)
        fits = [
            m
            for m in ms
            if m == ms[0]
            or (
                2.0 * m * k * n <= GEMM_MAX_FLOP
                and (max_bytes is None or 4 * COPIES * m * (k + n) <= max_bytes)
            )
        ]
        order = [fits[0], fits[-1], *fits[1:-1]] if len(fits) > 1 else fits
        for i, m in enumerate(order):
            if i >= 2 and time.perf_counter() - start > budget:
                break
            runner = _Runner([w], m, threads)
            out.append((m, k, n, 2.0 * m * k * n / _timed(runner, repeats, settle)))
            step()
    return sorted(out, key=lambda p: (p[1], p[2], p[0]))
