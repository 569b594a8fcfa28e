"""Time gloo collectives between local ranks, as nccl-tests does, for `--hardware local`'s links.

`graphllm calibrate --link` starts one process per core (never more: an oversubscribed rank's
collective would time the other ranks' scheduling too), joins them in a gloo process group on
127.0.0.1, and times all_reduce, all_gather and a send/recv ping-pong over a size sweep (a
warm-up, then repetitions; the median of each size's slowest rank). Sizes and bandwidths are
nccl-tests' (doc/PERFORMANCE.md): S is the whole array (all_gather: every rank's block), algbw =
S / t, busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather, x 1 for send/recv, the
op table's `wire` factors. Each kind's time is then fitted as t = alpha + wire(S) / busbw and stored
as a `Link` (bus bandwidth, step latency = alpha over the kind's fewest algorithm steps) in
`Hardware.links`, which the alpha-beta collective model (passes/parallel/figures.py) reads.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from graphllm.errors import ConfigError, GraphllmError
from graphllm.models.hardware import Hardware, Link, hardware_from_dict
from graphllm.ops import OPS

KINDS = ("all_reduce", "all_gather", "send")  # op-table rows, timed as their torch calls
FP32 = 4
# 4 B .. 64 MiB, every factor of 4: 13 sizes
SIZES = tuple(FP32 * 4**k for k in range(13))
START_SECONDS = 120.0  # the ranks' rendezvous and torch import, on a loaded machine


def sizes_up_to(largest: int) -> tuple[int, ...]:
    """The sweep's sizes (4 B, then every factor of 4) up to `largest` bytes."""
    return tuple(FP32 * 4**k for k in range(16) if FP32 * 4**k <= largest)


@dataclass(frozen=True)
class Sample:
    """One size of one kind: S (bytes, nccl-tests' size) and its median seconds."""

    kind: str
    size: int
    seconds: float
    ranks: int

    @property
    def algbw(self) -> float:
        """nccl-tests' algorithm bandwidth S / t, bytes/s."""
        return self.size / self.seconds

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth: algbw x the kind's factor (2(n-1)/n, (n-1)/n, 1)."""
        return bus_bandwidth(self.kind, self.size, self.seconds, self.ranks)


def bus_bandwidth(kind: str, size: float, seconds: float, ranks: int) -> float:
    """Bus bandwidth of a collective of op `kind` moving S = `size` bytes in `seconds`."""
    return size / seconds * OPS[kind].wire(ranks)


def fit(samples: Sequence[Sample]) -> Link:
    """The alpha-beta line t = alpha + wire(S) / busbw through one kind's samples, fitted in
    relative error (weights 1/t^2) so the small sizes set alpha and the large ones busbw; alpha is
    stored per algorithm step (the kind's fewest, as `collective_seconds` multiplies it back)."""
    if len(samples) < 2 or len({s.size for s in samples}) < 2:
        raise GraphllmError("calibrate --link: a fit needs samples of two sizes or more")
    kind, ranks = samples[0].kind, samples[0].ranks
    xs = [s.size * OPS[kind].wire(ranks) for s in samples]
    ts = [s.seconds for s in samples]
    ws = [1 / t**2 for t in ts]
    sw = sum(ws)
    mx = sum(w * x for w, x in zip(ws, xs)) / sw
    mt = sum(w * t for w, t in zip(ws, ts)) / sw
    sxx = sum(w * (x - mx) ** 2 for w, x in zip(ws, xs))
    slope = sum(w * (x - mx) * (t - mt) for w, x, t in zip(ws, xs, ts)) / sxx
    alpha = mt - slope * mx
    if slope <= 0:  # noise flatter than the link: the best bandwidth seen
        slope = 1 / max(s.busbw for s in samples)
    if alpha <= 0:  # the line through the origin undershoots: the smallest time is the latency
        alpha = min(ts)
    steps = min(OPS[kind].latency_steps(ranks).values())
    return Link(bus_bandwidth=1 / slope, step_latency=alpha / steps)


def cores() -> int:
    """The cores this process may run on: the most ranks a link calibration starts."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, ranks: int, port: int, sizes: Sequence[int], repeats: int, out) -> None:
    """One rank: join the group, time every kind and size, put {(kind, S): [seconds, ...]}."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one core a rank: a rank's reduction must not steal its peer's
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks
    )
    try:
        times: dict[tuple[str, int], list[float]] = {}
        for size in sizes:
            for kind, (s, call) in _calls(torch, dist, size, rank, ranks).items():
                call()  # warm-up: connections and buffers
                got = []
                for _ in range(repeats):
                    dist.barrier()  # every repetition starts together
                    t0 = time.perf_counter()
                    call()
                    got.append(time.perf_counter() - t0)
                times[(kind, s)] = got
        out.put((rank, times))
    finally:
        dist.destroy_process_group()


def _calls(torch: Any, dist: Any, size: int, rank: int, ranks: int) -> dict[str, tuple[int, Any]]:
    """Per kind, nccl-tests' S of a `size`-byte sweep point and the call that moves it."""
    count = max(1, size // FP32 // ranks)  # all_gather: each rank's block of the whole
    block, whole = torch.ones(count), torch.empty(count * ranks)
    buf = torch.ones(max(1, size // FP32))
    # torch 2.13 renamed all_gather_into_tensor (deprecated since) to all_gather_single
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor

    def ping() -> None:
        # ranks 0 and 1 send and receive back (the others idle): a one-way time is half of it
        if rank == 0:
            dist.send(buf, 1)
            dist.recv(buf, 1)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    return {
        "all_reduce": (buf.numel() * FP32, lambda: dist.all_reduce(buf)),
        "all_gather": (whole.numel() * FP32, lambda: gather(whole, block)),
        "send": (buf.numel() * FP32, ping),
    }


def require_ranks(ranks: int | None = None) -> int:
    """The ranks a sweep starts (default: one a core), refused in one line before anything is
    measured: more than the cores, fewer than two, or no torch."""
    have = cores()
    ranks = ranks or have
    if ranks > have:
        raise GraphllmError(
            f"calibrate --link: {ranks} ranks on {have} cores would time the ranks waiting for "
            f"each other's turn on a core; give at most {have}"
        )
    if ranks < 2:
        raise GraphllmError(
            f"calibrate --link needs two ranks, one a core; this process has {have}"
        )
    if importlib.util.find_spec("torch") is None:
        raise GraphllmError(
            "calibrate --link times torch.distributed collectives: install the dist extra "
            "(pip install 'graphllm[dist]')"
        )
    return ranks


def sweep(ranks: int | None = None, sizes: Sequence[int] = SIZES, repeats: int = 5) -> list[Sample]:
    """Time every kind at every size over `ranks` local gloo ranks (default: one per core)."""
    ranks = require_ranks(ranks)
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    args = (ranks, _free_port(), tuple(sizes), repeats, out)
    try:
        procs = mp.start_processes(_rank, args, nprocs=ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + START_SECONDS + 10 * len(sizes) * repeats
        while not procs.join(timeout=1.0):
            if time.monotonic() > deadline:
                for p in procs.processes:
                    p.kill()
                raise GraphllmError(f"calibrate --link: the {ranks} ranks did not finish in time")
    except mp.ProcessException as e:  # a rank raised, or died: its last line says why
        cause = str(e).strip().splitlines()[-1]
        raise GraphllmError(f"calibrate --link: rank {e.error_index} failed: {cause}") from e
    per_rank = dict(out.get() for _ in range(ranks))
    samples = []
    for kind, size in per_rank[0]:
        reps = zip(*(per_rank[r][(kind, size)] for r in range(ranks)))
        slowest = [max(r) for r in reps]  # a collective ends when its last rank has it
        seconds = statistics.median(slowest) / (2 if kind == "send" else 1)
        samples.append(Sample(kind, size, seconds, ranks))
    return samples


def links(samples: Sequence[Sample]) -> dict[str, Link]:
    """One fitted link per kind among `samples`."""
    kinds = dict.fromkeys(s.kind for s in samples)
    return {k: fit([s for s in samples if s.kind == k]) for k in kinds}


def with_links(hw: Hardware, samples: Sequence[Sample]) -> Hardware:
    """`hw` (calibrate's spec of this machine) with the links fitted from `samples`: its devices
    are the ranks timed, and its interconnect the best bus bandwidth among them, which prices
    the kinds not timed (without a latency, as a preset's line rate)."""
    fitted = links(samples)
    ranks = samples[0].ranks
    best = max(link.bus_bandwidth for link in fitted.values())
    lines = ", ".join(
        f"{k} {v.bus_bandwidth / 1e9:.3g} GB/s busbw + {v.step_latency * 1e6:.3g} us/step"
        for k, v in fitted.items()
    )
    sizes = sorted({s.size for s in samples})
    source = (
        f"{hw.source}; links: gloo on 127.0.0.1, {ranks} ranks (one a core), sizes "
        f"{sizes[0]} B..{sizes[-1]} B (x4), median of each size's slowest rank, fitted "
        f"t = alpha + wire/busbw (nccl-tests PERFORMANCE.md bus bandwidth): {lines}"
    )
    out = replace(
        hw,
        interconnect_bandwidth=best,
        devices_per_node=ranks,
        links=fitted,
        source=source,
        extra={**hw.extra, "link_ranks": float(ranks)},
    )
    try:  # what is saved must load again: a fit from latency-bound sizes alone may not
        return hardware_from_dict(out.to_dict(), "local", "calibrate --link")
    except ConfigError as e:
        raise GraphllmError(
            f"{e}; the sweep's messages were all latency-bound: time larger ones (--link-max)"
        ) from e


def table(samples: Sequence[Sample]) -> list[str]:
    """nccl-tests' columns, one line a sample."""
    lines = [f"{'kind':10s} {'size (B)':>10s} {'time (us)':>10s} {'algbw GB/s':>10s} {'busbw':>8s}"]
    for s in samples:
        lines.append(
            f"{s.kind:10s} {s.size:>10d} {s.seconds * 1e6:>10.1f} {s.algbw / 1e9:>10.3f} "
            f"{s.busbw / 1e9:>8.3f}"
        )
    return lines


__all__ = ["KINDS", "SIZES", "Sample", "bus_bandwidth", "fit", "links", "sweep", "with_links"]
