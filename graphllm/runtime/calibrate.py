"""Measure this machine, for roofline analysis against `--hardware local`.

Three tables (calibrate_tables.py, on onnxruntime as bench runs): read bandwidth over a sweep of
working sets, so that the cache levels show, fp32 GEMM rates over shapes, decode-like and
prefill-like, and fused attention's rate at a model's heads, decode and prefill; the roofline
picks from them by each step's working set, each GEMM's shape and each step's attention
(models/calibration.py). Two single figures beside them, with numpy, for the peak model
(`--ideal`): fp32 matmul throughput (numpy's BLAS, its default thread count) and memory read
bandwidth (Python threads each summing their own slice of a buffer far larger than the last-level
cache; numpy's reductions release the GIL, so the threads read in parallel). The result is a
`Hardware` named `local`, saved by `save_local` where `load_hardware("local")` finds it.
"""

from __future__ import annotations

import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from datetime import date
from pathlib import Path

import numpy as np
import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from graphllm.errors import GraphllmError
from graphllm.files import check_target, folder_problem, make_folder, write_text_atomic
from graphllm.limits import human_bytes, memory_available, require_memory
from graphllm.models.calibration import ATTENTION_FIELDS
from graphllm.models.hardware import Hardware, hardware_from_dict, local_path
from graphllm.models.model_config import ModelConfig
from graphllm.runtime import calibrate_tables as tables
from graphllm.runtime.budget import require_threads

GiB = 1 << 30
SWEEP_LOW, SWEEP_HIGH = 1 << 20, 4 * GiB
DEFAULT_GEMM_SHAPES = ((1024, 4096), (4096, 1024))  # a 1B-class model's FFN, in and out
DEFAULT_ATTENTION_HEADS = ((32, 8, 64),)  # Llama-3.2-1B's heads, kv heads and head_dim
MIN_BUFFER = 64 << 20  # a read this small on a machine with a tiny cache still leaves it


def _meminfo(key: str) -> float | None:
    """A /proc/meminfo figure in bytes (None off Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1]) * 1024  # the file says kB, meaning KiB
    except OSError:
        pass
    return None


def _memory_total() -> float:
    total = _meminfo("MemTotal")
    if total is None:
        total = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return total


def _llc_bytes() -> int:
    """Size of cpu0's largest cache, from sysfs (0 when unknown)."""
    sizes = [0]
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": GiB}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * unit)
        except ValueError:
            continue
    return max(sizes)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _median_rate(run: Callable[[], object], work: float, repeats: int, step: Callable) -> float:
    """Median of work / seconds over `repeats` timed calls, after one untimed warm-up."""
    run()
    step()
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        rates.append(work / (time.perf_counter() - t0))
        step()
    return statistics.median(rates)


def _matmul_flops(n: int, repeats: int, step: Callable) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.empty((n, n), dtype=np.float32)
    return _median_rate(lambda: np.matmul(a, b, out=out), 2.0 * n**3, repeats, step)


def _read_bandwidth(nbytes: int, threads: int, repeats: int, step: Callable) -> float:
    buf = np.ones(max(nbytes // 8, threads), dtype=np.float64)  # np.ones touches every page
    slices = np.array_split(buf, threads)
    with ThreadPoolExecutor(threads) as pool:
        return _median_rate(lambda: list(pool.map(np.sum, slices)), buf.nbytes, repeats, step)


def calibrate(
    weights_bytes: float | None = None,
    repeats: int = 5,
    threads: int = 2,
    progress: bool = True,
    *,
    matmul_size: int = 2048,
    buffer_bytes: int | None = None,
    sweep: tuple[int, int] | None = None,
    gemm_shapes: Sequence[tuple[int, int]] | None = None,
    gemm_ms: Sequence[int] = tables.GEMM_MS,
    attention_heads: Sequence[tuple[int, int, int]] | None = None,
    attention_steps: Sequence[tuple[int, int]] = tables.ATTENTION_STEPS,
    budget: float = 60.0,
    settle: float = tables.SETTLE_SECONDS,
    sweep_side: int = tables.CHUNK,
) -> Hardware:
    """Measure matmul FLOP/s and memory read bandwidth of this machine.

    Args:
        weights_bytes: also read a buffer of this size (a model's weights; capped as the
            bandwidth buffer is) and store the result as `extra["memory_bandwidth_model"]`.
        repeats: timed runs per figure; the median is kept.
        threads: Python threads reading memory in parallel.
        progress: show rich progress bars on stderr.
        matmul_size: n of the n x n fp32 matmuls.
        buffer_bytes: bandwidth buffer; default max(1 GiB, 8 x last-level cache), capped at half
            the memory this process may use (graphllm.limits.memory_available).
        sweep: (smallest, largest) working set of the read-bandwidth sweep; default 1 MiB to
            max(1 GiB, 16 x last-level cache), at most 4 GiB and a quarter of the memory this
            process may use (the weights and onnxruntime's prepacked copy of them).
        gemm_shapes: (K, N) of the GEMM table; default DEFAULT_GEMM_SHAPES (a model's own from
            `gemm_shapes_of`).
        gemm_ms: the Ms measured at each shape.
        attention_heads: (heads, kv heads, head_dim) of the attention table; default
            DEFAULT_ATTENTION_HEADS (a model's own from `attention_heads_of`).
        attention_steps: the (new tokens, past tokens) measured at each head shape.
        budget: seconds each table may take; past it the sweep, the GEMM table and the
            attention table stop (the sweep's largest size, each shape's smallest and largest M
            and each head shape's first step measured first).
        settle: seconds each table's kernel runs untimed after its session is built.
        sweep_side: the side of the sweep's square fp32 matrices (a model's from
            `sweep_side_of`).
    """
    require_threads(threads, "calibrate")
    require_memory(3 * 4 * matmul_size**2, f"calibrate's fp32 {matmul_size}^3 matmul")
    llc = _llc_bytes()
    (flops, bandwidth, extra), source = _peak(
        llc, matmul_size, buffer_bytes, weights_bytes, threads, repeats, progress
    )
    sizes = _sweep_sizes(sweep, llc, sweep_side)
    shapes = tuple(gemm_shapes or DEFAULT_GEMM_SHAPES)
    heads = tuple(DEFAULT_ATTENTION_HEADS if attention_heads is None else attention_heads)
    attention = (heads, tuple(attention_steps))
    cal = _tables(
        sizes, shapes, gemm_ms, attention, threads, repeats, budget, progress, settle, sweep_side
    )
    source += _tables_source(cal, settle, sweep_side)
    return _local_hardware(flops, bandwidth, extra, cal, source)


def _peak(
    llc: int,
    matmul_size: int,
    buffer_bytes: int | None,
    weights_bytes: float | None,
    threads: int,
    repeats: int,
    progress: bool,
) -> tuple[tuple[float, float, dict[str, float]], str]:
    """The peak model's figures (matmul FLOP/s, read bandwidth, the extra ones) and how they
    were measured; the buffers are sized, and refused when too small, before any is read."""
    cap = _buffer_cap(llc)
    if buffer_bytes is None:
        buffer_bytes = max(GiB, 8 * llc)
    buffer_bytes = min(int(buffer_bytes), cap)
    model_bytes = min(int(weights_bytes), cap) if weights_bytes else 0
    figures = _measure(matmul_size, buffer_bytes, model_bytes, threads, repeats, progress)
    return figures, _source(repeats, matmul_size, buffer_bytes, model_bytes, threads, llc)


def _sweep_sizes(sweep: tuple[int, int] | None, llc: int, side: int) -> list[int]:
    """The read sweep's working sets: `sweep`, or 1 MiB to max(1 GiB, 16 x LLC), capped by what
    this process may use once the peak model's buffers are gone."""
    low, high = sweep or (SWEEP_LOW, max(GiB, 16 * llc))
    high = min(high, SWEEP_HIGH, memory_available() // 4)
    return tables.sweep_sizes(low, max(low, high), side)


def _local_hardware(
    flops: float, bandwidth: float, extra: dict[str, float], cal: dict, source: str
) -> Hardware:
    """The `local` Hardware of the measured figures: one CPU device, no links."""
    d = {
        "name": "local",
        "peak_flops": {"fp32": flops, "bf16": flops, "fp16": flops},
        "memory_bandwidth": bandwidth,
        "memory_bytes": _memory_total(),
        "interconnect_bandwidth": None,
        "network_bandwidth": None,
        "devices_per_node": 1,
        "source": source,
        "extra": extra,
        "calibration": cal,
    }
    return hardware_from_dict(d, "local", "calibrate")


# `calibrate --quick`: sizes that measure in a second, for tests of the command
QUICK: dict = {
    "matmul_size": 64,
    "buffer_bytes": 1 << 20,
    "sweep": (1 << 20, 4 << 20),
    "gemm_shapes": ((64, 64),),
    "gemm_ms": (1, 128),
    "attention_heads": ((2, 1, 16),),
    "attention_steps": ((1, 8), (8, 0)),
    "settle": 0.0,
}


def tables_line(hw: Hardware) -> str:
    """One line of a calibration's tables: the read bandwidth at its ends, the GEMM's range."""
    cal = hw.calibration
    if cal is None:
        return "no calibration tables (the peak model alone)"
    (s0, r0), (s1, r1) = cal.read_bandwidth[0], cal.read_bandwidth[-1]
    rates = [r for *_, r in cal.gemm]
    att = [r for *_, r in cal.attention]
    attention = (
        f"; attention {min(att) / 1e9:.1f}-{max(att) / 1e9:.1f} GFLOP/s over {len(att)} steps"
        if att
        else ""
    )
    return (
        f"read {r0 / 1e9:.1f} GB/s at {human_bytes(s0)} to {r1 / 1e9:.1f} GB/s at "
        f"{human_bytes(s1)} ({len(cal.read_bandwidth)} working sets); GEMM {min(rates) / 1e9:.1f}"
        f"-{max(rates) / 1e9:.1f} GFLOP/s over {len(rates)} shapes{attention} ({cal.runtime})"
    )


def gemm_shapes_of(config: ModelConfig) -> tuple[tuple[int, int], ...]:
    """The (K, N) of a model's GEMMs that the table measures: into and out of its FFN (the
    expert's width where it has no dense one), and its LM head."""
    d = config.hidden_size
    ffn = config.intermediate_size or config.moe_intermediate_size or 4 * d
    return tuple(dict.fromkeys(((d, ffn), (ffn, d), (d, config.vocab_size))))


def sweep_side_of(config: ModelConfig) -> int:
    """The side of the square fp32 matrix that holds a layer's mean linear weight (Q, K, V, O
    and the FFN's three, an expert's width where there is no dense one): a read sweep in such
    matrices runs as many kernels a byte as the model's step (a multiple of 16, 64 to 4096)."""
    d, hd = config.hidden_size, config.head_dim
    h, kv = config.num_attention_heads or 1, config.num_key_value_heads or 1
    ffn = config.intermediate_size or config.moe_intermediate_size or 4 * d
    mean = (2 * d * h * hd + 2 * d * kv * hd + 3 * d * ffn) / 7
    return min(4096, max(64, int(math.sqrt(mean)) // 16 * 16))


def attention_heads_of(config: ModelConfig) -> tuple[tuple[int, int, int], ...]:
    """The (heads, kv heads, head_dim) the attention table measures for a model: its own (none
    where its export has no GroupQueryAttention: latent attention, which only the decomposed
    lowering has, or kv heads that do not divide the heads)."""
    h, kv = config.num_attention_heads, config.num_key_value_heads
    gqa = h and kv and h % kv == 0 and not config.is_mla
    return ((h, kv, config.head_dim),) if gqa else ()


def _tables(
    sizes: list[int],
    shapes: tuple[tuple[int, int], ...],
    ms: Sequence[int],
    attention: tuple[tuple[tuple[int, int, int], ...], tuple[tuple[int, int], ...]],
    threads: int,
    repeats: int,
    budget: float,
    progress: bool,
    settle: float,
    sweep_side: int,
) -> dict:
    """The `calibration` mapping of a Hardware: the read sweep, the GEMM table and the
    attention table ((head shapes, steps))."""
    bars = _progress() if progress else None
    with bars or nullcontext():
        step = _counter(bars, f"read sweep, {len(sizes)} working sets", len(sizes))
        read = tables.read_sweep(sizes, threads, repeats, budget, step, settle, sweep_side)
        step = _counter(bars, f"GEMM table, {len(shapes)} shapes", len(shapes) * len(ms))
        gemm = tables.gemm_table(
            shapes, ms, threads, repeats, budget, step, memory_available() // 4, settle
        )
        heads, steps = attention
        step = _counter(bars, f"attention, {len(heads)} head shapes", len(heads) * len(steps))
        att = tables.attention_table(
            heads, steps, threads, repeats, budget, step, memory_available() // 4, settle
        )
    out = {
        "runtime": tables.runtime_name(),
        "read_bandwidth": [{"bytes": b, "bandwidth": r} for b, r in read],
        "gemm": [{"m": m, "k": k, "n": n, "flops": r} for m, k, n, r in gemm],
    }
    if att:
        out["attention"] = [dict(zip(ATTENTION_FIELDS, p)) for p in att]
    dispatch = tables.dispatch_seconds(threads, repeats, settle)
    if dispatch is not None:
        out["dispatch"] = dispatch
    return out


def _tables_source(cal: dict, settle: float, side: int) -> str:
    read, gemm = cal["read_bandwidth"], cal["gemm"]
    return (
        f"; calibration = {cal['runtime']}: read bandwidth of {len(read)} working sets "
        f"({human_bytes(read[0]['bytes'])} to {human_bytes(read[-1]['bytes'])}, chained "
        f"one-row fp32 MatMuls over {side}^2 weights), {len(gemm)} fp32 MatMul shapes (M x K x N), "
        f"{len(cal.get('attention', []))} GroupQueryAttention steps, medians less an idle run, "
        f"each timed after {settle:g} s of untimed runs"
        + (
            f"; {cal['dispatch'] * 1e6:.2f} us a node (a chain of {tables.DISPATCH_NODES} Adds)"
            if "dispatch" in cal
            else ""
        )
    )


def _counter(bars, label: str, total: int) -> Callable[[], None]:
    if bars is None:
        return lambda: None
    task = bars.add_task(label, total=total)
    return lambda: bars.advance(task)


def _buffer_cap(llc: int) -> int:
    """The largest read buffer: half of what this process may still allocate (RLIMIT_AS and the
    cgroup included, not only the machine's free memory), one buffer alive at a time; refused
    when that is too small to read past the last-level cache, which would measure the cache."""
    have = memory_available()
    least = max(MIN_BUFFER, 4 * llc)
    if have // 2 < least:
        raise GraphllmError(
            f"calibrate needs a read buffer of at least {human_bytes(least)} (past the "
            f"{human_bytes(llc)} last-level cache, twice that free); this process has "
            f"{human_bytes(have)} available"
        )
    return have // 2


def _measure(
    matmul_size: int,
    buffer_bytes: int,
    model_bytes: int,
    threads: int,
    repeats: int,
    progress: bool,
) -> tuple[float, float, dict[str, float]]:
    """Matmul FLOP/s, read bandwidth, and the extra figures (the model-sized read among them)."""
    bars = _progress() if progress else None
    with bars or nullcontext():
        step = _stepper(bars, f"fp32 matmul {matmul_size}x{matmul_size}", repeats)
        flops = _matmul_flops(matmul_size, repeats, step)
        step = _stepper(bars, f"read {buffer_bytes / GiB:.3g} GiB, {threads} threads", repeats)
        bandwidth = _read_bandwidth(buffer_bytes, threads, repeats, step)
        extra = {
            "matmul_size": float(matmul_size),
            "buffer_bytes": float(buffer_bytes),
            "threads": float(threads),
        }
        if model_bytes:
            label = f"read model-sized {model_bytes / GiB:.3g} GiB"
            step = _stepper(bars, label, repeats)
            extra["memory_bandwidth_model"] = _read_bandwidth(model_bytes, threads, repeats, step)
            extra["model_buffer_bytes"] = float(model_bytes)
    return flops, bandwidth, extra


def _source(
    repeats: int, matmul_size: int, buffer_bytes: int, model_bytes: int, threads: int, llc: int
) -> str:
    """How the figures were measured, for the hardware spec's `source`."""
    model = (
        f"; model-sized read of {model_bytes / GiB:.3g} GiB in extra.memory_bandwidth_model"
        if model_bytes
        else ""
    )
    return (
        f"graphllm calibrate {date.today().isoformat()} on {_cpu_model()} ({os.cpu_count()} CPUs), "
        f"numpy {np.__version__}: peak_flops = median of {repeats} fp32 {matmul_size}^3 matmuls "
        f"(BLAS default threads); bf16/fp16 are the same figure because numpy computes in fp32 on "
        f"CPU; memory_bandwidth = median of {repeats} reads of {buffer_bytes / GiB:.3g} GiB by "
        f"{threads} threads (LLC {llc / 2**20:g} MiB){model}; memory_bytes = MemTotal; no device "
        f"links (one device per node)"
    )


def _progress():

    cols = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn())
    return Progress(*cols, console=Console(stderr=True))


def _stepper(bars, label: str, repeats: int) -> Callable[[], None]:
    """A callback advancing a new bar of repeats + 1 steps (the warm-up counts)."""
    if bars is None:
        return lambda: None
    task = bars.add_task(label, total=repeats + 1)
    return lambda: bars.advance(task)


def check_local_writable(path: Path | None = None) -> None:
    """Refuse before measuring when `save_local` could not write: a cache that is a file, or a
    folder, FIFO or device where the figures go."""
    path = path or local_path()
    problem = folder_problem(path.parent)
    if problem is not None:
        raise GraphllmError(f"cannot write this machine's figures to {path}: {problem}")
    if path.parent.is_dir():
        check_target(path)


def save_local(hw: Hardware, path: Path | None = None) -> Path:
    """Write `hw` where `load_hardware("local")` reads it, atomically; return the path."""
    path = path or local_path()
    make_folder(path.parent, "this machine's figures")
    text = yaml.safe_dump(hw.to_dict(), sort_keys=False, width=100)
    return write_text_atomic(path, text)
