"""graphllm's collective times beside published nccl-tests measurements
(benchmarks/published_collectives.yaml).

Each table is an `all_reduce_perf` run someone else published: its rows quoted, with the
device, the group, the NCCL version and how the test was launched. Beside each row: graphllm's
time for the same collective on the row's hardware preset (`collective_seconds`, the time
`partition`, `plan` and the trace use: on a link with an NCCL `tuning`, the cheapest algorithm and
protocol of NCCL's own tuner model, whose pick the row prints, or the link's measured NVLS
where that is cheaper ("nvls"); on another link, the fewest steps of the op's algorithms x the
link's step latency, plus the bytes one device sends over the link's bus bandwidth), and
measured / predicted (above 1: slower than predicted).

It prints, per table, the median ratio over three size bands (below 1 MiB: latency-bound;
1 MiB to below 256 MiB: the prefill all-reduces of tensor parallelism; 256 MiB and up:
bandwidth-bound), and the alpha and bus bandwidth that a least-squares fit of
time = alpha + wire bytes / busbw gives over the table's rows from 1 MiB up, beside the
preset's. The fit is printed to compare, not read by any preset. One table does feed one: the
h100-sxm and h200-sxm NVLS latency is an intercept over the vpbenchmarking table's rows of
32 MiB and up, and its 8-GPU NVLS bandwidth is that table's 8 GiB row. So that table is no
check of them; the dgxc-benchmarking table, a second 8-GPU node measured by others, is.

    python benchmarks/published_collectives.py [--table FILE] [--ideal] [--json]
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run standalone from a checkout
    sys.path.insert(0, str(ROOT))

from benchmarks.published_cli import published_main, read_tables  # noqa: E402
from graphllm.models.hardware import load_hardware  # noqa: E402
from graphllm.models.nccl_tuning import nccl_choice  # noqa: E402
from graphllm.ops import OPS  # noqa: E402
from graphllm.passes.parallel.figures import (  # noqa: E402
    collective_seconds,
    nccl_group,
    nvls_seconds,
)
from graphllm.passes.parallel.sharding import Mesh  # noqa: E402

IDEAL_HELP = "predict on the links' line rates"
TABLE = Path(__file__).with_name("published_collectives.yaml")
REQUIRED = ("id", "gpus", "hardware", "ranks", "processes", "collective", "nccl", "launch")
REQUIRED += ("header", "source", "lines")
MIB = 1 << 20
BANDS = (("below 1 MiB", 0, MIB), ("1-256 MiB", MIB, 256 * MIB), ("256 MiB up", 256 * MIB, None))
TYPE_BYTES = {"float": 4, "half": 2, "bfloat16": 2, "double": 8, "int8": 1, "uint8": 1}


def parse_line(line: str) -> tuple[int, float]:
    """(size in bytes, out-of-place time in seconds) of one quoted nccl-tests row: its 13
    columns, its size count x the type's bytes, and its algbw the size over its time (to the
    two decimals printed), so that a slip in copying it shows."""
    f = line.split()
    if len(f) != 13 or f[2] not in TYPE_BYTES:
        raise SystemExit(f"not an nccl-tests row of 13 columns: {line!r}")
    try:
        size, count, secs, algbw = int(f[0]), int(f[1]), float(f[5]) * 1e-6, float(f[6])
    except ValueError:
        raise SystemExit(f"not an nccl-tests row (a column is not a number): {line!r}") from None
    if size != count * TYPE_BYTES[f[2]]:
        raise SystemExit(f"size is not count x {f[2]}'s bytes: {line!r}")
    if secs <= 0 or abs(size / secs / 1e9 - algbw) > max(0.011, 0.01 * algbw):
        raise SystemExit(f"algbw is not size / time: {line!r}")
    return size, secs


def _header(header: str, keys: tuple[str, ...]) -> dict[str, str]:
    """The word after each of `keys` in an nccl-tests header line (`nGpus 4`, `graph: 0`);
    its other words (`warmup iters: 5`) do not pair up, so each key is looked up by name."""
    words = header.removeprefix("#").replace(":", " ").split()
    return {k: words[words.index(k) + 1] for k in keys if k in words[:-1]}


def _check(where: str, t: dict[str, Any]) -> None:
    for k in ("ranks", "processes"):
        if type(t[k]) is not int or t[k] < 1:
            raise SystemExit(f"{where}: {k} must be a positive whole number")
    if t["collective"] not in OPS or OPS[t["collective"]].wire is None:
        raise SystemExit(f"{where}: {t['collective']!r} is not a collective")
    h = _header(str(t["header"]), ("nThread", "nGpus", "maxBytes", "graph"))
    try:
        threads, gpus, max_bytes = int(h["nThread"]), int(h["nGpus"]), int(h["maxBytes"])
        graph = int(h["graph"])
    except (KeyError, ValueError):
        raise SystemExit(f"{where}: header lacks nThread, nGpus, maxBytes or graph") from None
    if threads * gpus * t["processes"] != t["ranks"]:
        raise SystemExit(
            f"{where}: its header's nThread {threads} x nGpus {gpus} x {t['processes']} "
            f"processes is not its {t['ranks']} ranks"
        )
    if bool(graph) != ("CUDA graph" in t["launch"]):
        raise SystemExit(f"{where}: its header's graph: {graph} and its launch disagree")
    rows = [parse_line(line) for line in str(t["lines"]).splitlines() if line.strip()]
    if sum(size >= MIB for size, _ in rows) < 2 or max(size for size, _ in rows) > max_bytes:
        raise SystemExit(f"{where}: needs two rows from 1 MiB up, none past maxBytes")
    t["rows"] = rows


def load_tables(path: Path = TABLE) -> list[dict[str, Any]]:
    """The tables, each checked: every field, a source URL, a preset, a header whose ranks and
    CUDA-graph flag agree with the table's, and its rows parsed."""
    return read_tables(path, REQUIRED, _check)


def predict(table: dict[str, Any], size: int) -> tuple[float, str | None]:
    """graphllm's time for the table's collective of `size` bytes over its group inside a node,
    and NCCL's tuner's pick ("ring LL128") where the preset's link prices it so."""
    n, kind = table["ranks"], table["collective"]
    hw = load_hardware(table["hardware"])
    mesh = Mesh((("tp", n),))
    wire = OPS[kind].wire(n) * size
    tuned = nccl_group(kind, n, mesh, "tp", hw)
    pick = None if tuned is None else nccl_choice(tuned, size)
    label = None if pick is None else f"{pick.algorithm} {pick.protocol}"
    seconds = collective_seconds(kind, n, wire, mesh, "tp", hw)
    if nvls_seconds(kind, n, wire, mesh, "tp", hw) == seconds:
        label = "nvls"
    return seconds, label


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(alpha seconds, bytes/s) of the least-squares line time = alpha + wire / busbw."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, 1 / slope


def compare(tables: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each table with its rows' predictions and ratios, its band medians and its fit."""
    out = []
    for t in tables:
        n, kind = t["ranks"], t["collective"]
        rows = []
        for size, measured in t["rows"]:
            predicted, pick = predict(t, size)
            rows.append(
                {
                    "bytes": size,
                    "measured_us": measured * 1e6,
                    "predicted_us": predicted * 1e6,
                    "ratio": measured / predicted,
                    "nccl_pick": pick,
                }
            )
        bands = {}
        for name, lo, hi in BANDS:
            r = [x["ratio"] for x in rows if x["bytes"] >= lo and (hi is None or x["bytes"] < hi)]
            if r:
                bands[name] = statistics.median(r)
        wire = OPS[kind].wire(n)
        alpha, busbw = fit([(wire * s, m) for s, m in t["rows"] if s >= MIB])
        ach = load_hardware(t["hardware"]).achievable
        link = None if ach is None else ach.interconnect
        out.append(
            {k: v for k, v in t.items() if k not in ("lines", "rows")}
            | {
                "rows": rows,
                "median_ratio_by_band": bands,
                "fit_from_1MiB": {"alpha_us": alpha * 1e6, "bus_bandwidth_GBps": busbw / 1e9},
                "preset_link": None
                if link is None
                else {
                    "step_latency_us": link.step_latency * 1e6,
                    "bus_bandwidth_GBps": link.bus_bandwidth / 1e9,
                    "tuning": link.tuning,
                    "nvls": _nvls(link, n),
                },
            }
        )
    return out


def _size(b: int) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if b >= k:
            return f"{b / k:g} {unit}"
    return f"{b} B"


def _nvls(link: Any, ranks: int) -> dict[str, float] | None:
    """The link's NVLS at `ranks` (latency, and algbw of the whole tensor), where it has one."""
    nvls = link.nvls
    if nvls is None or nvls.seconds(ranks, 0.0) is None:
        return None
    algbw = 1 / (nvls.seconds(ranks, 1.0) - nvls.latency)
    return {"latency_us": nvls.latency * 1e6, "algbw_GBps": algbw / 1e9}


def print_tables(results: list[dict[str, Any]], model: str) -> None:
    print(f"nccl-tests against graphllm's {model} collective times; ratio = measured / predicted")
    for t in results:
        print(f"\n[{t['id']}] {t['gpus']}: {t['collective']} over {t['ranks']} ranks, {t['nccl']}")
        print(f"  launch: {t['launch']}; preset {t['hardware']}")
        print(f"  {'size':>9} {'measured us':>12} {'predicted us':>13} {'ratio':>6}  algorithm")
        for r in t["rows"]:
            print(
                f"  {_size(r['bytes']):>9} {r['measured_us']:>12.2f} "
                f"{r['predicted_us']:>13.2f} {r['ratio']:>6.2f}  {r['nccl_pick'] or '-'}"
            )
        bands = ", ".join(f"{k}: {v:.2f}" for k, v in t["median_ratio_by_band"].items())
        print(f"  median ratio by size: {bands}")
        f, link = t["fit_from_1MiB"], t["preset_link"]
        preset = (
            "no link figures"
            if link is None
            else f"{link['tuning'] or ''}{', ' if link['tuning'] else ''}"
            f"{link['step_latency_us']:.3g} us a step, {link['bus_bandwidth_GBps']:.4g} GB/s"
            + (
                f"; NVLS {link['nvls']['latency_us']:.3g} us + bytes / "
                f"{link['nvls']['algbw_GBps']:.4g} GB/s algbw"
                if link["nvls"]
                else ""
            )
        )
        print(
            f"  fit from 1 MiB up: alpha {f['alpha_us']:.1f} us, busbw "
            f"{f['bus_bandwidth_GBps']:.4g} GB/s (the preset: {preset})"
        )
        print(f"  source: {t['source']}")


def document(results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"tables": results}


load, show = load_tables, print_tables


def main(argv: list[str] | None = None) -> int:
    return published_main(argv, sys.modules[__name__])


if __name__ == "__main__":
    sys.exit(main())
