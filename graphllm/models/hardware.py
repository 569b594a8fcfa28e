"""Device specs for roofline analysis: packaged presets, YAML/JSON files, and `local`.

A `Hardware` holds peak dense FLOP/s per compute dtype, memory bandwidth and size, and the
bandwidths between devices. `local` is this machine as measured by `graphllm calibrate`
(graphllm/calibrate.py); a CPU has no device interconnect, so its `interconnect_bandwidth` and
`network_bandwidth` are None, and partition analyses refuse to put more than one device on it.
"""

from __future__ import annotations

import difflib
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from graphllm.echo import cut, shown, shown_path
from graphllm.errors import ConfigError
from graphllm.files import folder_problem
from graphllm.models.calibration import Calibration, calibration_from_dict
from graphllm.models.nccl_tuning import TUNINGS
from graphllm.models.parse import file_mode, read_mapping
from graphllm.models.workload import DTYPE_ALIASES, WEIGHT_ONLY

PRESETS_PATH = Path(__file__).with_name("hardware_presets.yaml")
PEAK_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
# storage dtype of the activations -> peak_flops keys to try, best first. fp32 never falls back to
# tf32: TF32 is a lower-precision mode that has to be asked for.
COMPUTE_WITH = {
    "fp32": ("fp32",),
    "bf16": ("bf16", "fp16"),
    "fp16": ("fp16", "bf16"),
    "fp8": ("fp8", "bf16", "fp16"),
    "int8": ("int8", "bf16", "fp16"),
    "int4": ("fp16", "bf16"),  # weight-only: dequantised to 16-bit for the matmul
    "int4g32": ("bf16", "fp16"),  # torch's tinygemm: bf16 activations
}
REQUIRED = (
    "peak_flops",
    "memory_bandwidth",
    "memory_bytes",
    "interconnect_bandwidth",
    "network_bandwidth",
    "devices_per_node",
)
NULLABLE = ("interconnect_bandwidth", "network_bandwidth")
PRESET_ONLY = ("aliases", "description", "_note")  # _note: what a preset lacks, and why
RATE_MODELS = ("achievable", "ideal", "calibrated")
# The sane range of each figure: far outside what any device has, so that a typo (a subnormal
# 5e-324 for 5e14, which printed "inf s, nan%") is refused rather than divided by. A CPU core's
# scalar FP32 is ~1e9 FLOP/s and the fastest accelerators' dense FP8 ~5e15.
RANGES: dict[str, tuple[float, float]] = {
    "peak_flops": (1e6, 1e18),  # FLOP/s
    "memory_bandwidth": (1e6, 1e15),  # bytes/s: HBM3e is ~8e12
    "memory_bytes": (1e6, 1e15),  # bytes: a 1 PB device is far beyond any
    "interconnect_bandwidth": (1e6, 1e14),  # bytes/s per direction: NVLink 5 is 9e11
    "network_bandwidth": (1e6, 1e14),
    "extra": (1e-6, 1e18),  # calibrate's further figures (bandwidths, buffer sizes)
}
MAX_DEVICES_PER_NODE = 4096  # a node has 8 to 72 (NVL72)
MIN_EFFICIENCY = 1e-3  # of the peaks: below it, the figure is a typo, not a measurement


@dataclass(frozen=True, kw_only=True)
class Nvls:
    """NCCL's NVLS all-reduce (NVLink SHARP: the NVSwitch reduces) inside an NVSwitch node, as
    nccl-tests measures it: time = latency + the tensor's bytes / the algorithm bandwidth at the
    group's size. Each GPU sends its tensor to the switch once and reads the sum once, so
    nccl-tests' busbw (algbw x 2(n-1)/n, a ring's traffic) does not describe it: the figures are
    algbw, by group size, and a size between two measured ones takes the line between them."""

    latency: float  # seconds: the intercept over the sizes NVLS runs at
    bandwidth: dict[int, float]  # ranks -> bytes/s of the whole tensor (algbw)

    def seconds(self, ranks: int, nbytes: float) -> float | None:
        """One all-reduce of an `nbytes` tensor over `ranks` GPUs of the node; None outside the
        measured group sizes (NVLS is not priced there)."""
        sizes = sorted(self.bandwidth)
        if not sizes[0] <= ranks <= sizes[-1]:
            return None
        hi = next(n for n in sizes if n >= ranks)
        lo = max(n for n in sizes if n <= ranks)
        share = 0.0 if hi == lo else (ranks - lo) / (hi - lo)
        bw = self.bandwidth[lo] + share * (self.bandwidth[hi] - self.bandwidth[lo])
        return self.latency + nbytes / bw


@dataclass(frozen=True, kw_only=True)
class Link:
    """A link's collectives as nccl-tests measures them: time = steps x step_latency + the bytes
    one device sends / bus_bandwidth (busbw is defined so that this holds for every collective)."""

    bus_bandwidth: float  # bytes/s
    step_latency: float  # seconds per algorithm step (one hop)
    # a key of nccl_tuning.TUNINGS: the all-reduce, all-gather and reduce-scatter are priced by
    # NCCL's own tuner model over it (per algorithm and protocol) instead of steps x step_latency
    tuning: str | None = None
    # an NVSwitch node's NVLS all-reduce, measured: it runs where it beats the ring and the tree
    nvls: Nvls | None = None


@dataclass(frozen=True, kw_only=True)
class Achievable:
    """Measured rates of a device (each preset's `source` names where each came from): what the
    roofline divides by unless `--ideal` asks for the data sheet's peaks."""

    gemm_flops: dict[str, float]  # large-shape dense GEMM FLOP/s per compute dtype
    attention_flops: dict[str, float]  # fused (flash) attention kernel FLOP/s per compute dtype
    memory_bandwidth: float  # bytes/s, a streaming kernel's
    interconnect: Link | None  # inside a node
    network: Link | None  # across nodes
    # each of these five None where no measurement was found (the preset's _note says which):
    # then no launch cost, and no tile or wave quantisation, as under the ideal model
    launch_seconds: float | None  # a kernel launched on its own: the host's enqueue time
    graph_launch_seconds: float | None  # a kernel inside a replayed CUDA graph
    graph_replay_seconds: float | None  # once per replayed graph (a step)
    sm_count: int | None  # streaming multiprocessors: the tiles a wave of a GEMM runs at once
    gemm_tile: tuple[int, int] | None  # the GEMM's output tile (M, N) each SM computes
    source: str
    # weight-only storage dtype -> the share of `memory_bandwidth` that the kernel
    # dequantising it streams its weights at in a batch-1 GEMV (absent: the full bandwidth)
    dequant_efficiency: dict[str, float] = field(default_factory=dict)
    # a kernel that streams a weight or the KV cache from DRAM pays DRAM's latency and ramp on
    # top of a launch: its fixed cost, launched on its own and inside a graph, as the intercept
    # of time = fixed + bytes / bandwidth over working sets past the L2 (None: the two launch
    # figures above, as for a kernel whose data the L2 holds)
    stream_launch_seconds: float | None = None
    graph_stream_launch_seconds: float | None = None

    def gemm_efficiency(self, m: float, n: float, k: float) -> float:
        """The share of the large-shape GEMM rate an (m x n)-output GEMM over k reaches, from tile
        and wave quantisation (NVIDIA, Matrix Multiplication Background User's Guide, 3.1-3.2):
        the output is cut into tiles (rows rounded up to the tensor cores' 16, at most the tile's
        M) that run `sm_count` at a time; when there are fewer tiles than SMs, K is split
        across the idle SMs (split-K, as cuBLAS does for skinny GEMMs); the last wave and each
        edge tile run part-empty. 1 where the device's SM count or tile is not known."""
        if self.sm_count is None or self.gemm_tile is None:
            return 1.0
        tm, tn = min(self.gemm_tile[0], 16 * math.ceil(m / 16)), self.gemm_tile[1]
        tiles = math.ceil(m / tm) * math.ceil(n / tn)
        split = max(1, min(self.sm_count // tiles, math.ceil(k / tn)))
        waves = math.ceil(tiles * split / self.sm_count)
        return (m * n * split) / (waves * self.sm_count * tm * tn)


# (ideal, cuda_graphs) that `load_hardware` applies: the CLI's --ideal and --cuda-graphs set it
# for one command (`rate_model`), so that every command that loads a device honours them alike
_RATE_MODEL: ContextVar[tuple[bool, bool | None]] = ContextVar("rate_model", default=(False, None))


@contextmanager
def rate_model(*, ideal: bool, cuda_graphs: bool | None) -> Iterator[None]:
    """Within the block, `load_hardware` gives the peak model when `ideal`, and kernels launched
    through CUDA graphs when `cuda_graphs` (None: for decode steps only)."""
    token = _RATE_MODEL.set((ideal, cuda_graphs))
    try:
        yield
    finally:
        _RATE_MODEL.reset(token)


@dataclass(frozen=True, kw_only=True)
class Hardware:
    """One device of a node: peaks, memory, and the links to its peers (bytes/s, one direction)."""

    name: str
    peak_flops: dict[str, float]  # dense FLOP/s per compute dtype (keys among PEAK_KEYS)
    memory_bandwidth: float  # bytes/s
    memory_bytes: float
    interconnect_bandwidth: float | None  # within a node (NVLink, Infinity Fabric, PCIe)
    network_bandwidth: float | None  # across nodes, per device
    devices_per_node: int
    source: str
    compute_efficiency: float = 1.0  # achievable fraction of peak_flops
    memory_efficiency: float = 1.0  # achievable fraction of memory_bandwidth
    extra: dict[str, float] = field(default_factory=dict)  # further measurements (calibrate)
    achievable: Achievable | None = None  # None: the ideal roofline on the peaks above
    cuda_graphs: bool | None = None  # kernels launched through CUDA graphs; None: decode only
    # collectives measured inside a node, per op kind (`graphllm calibrate --link`):
    # they price their kind under either rate model, since they are measurements, not peaks
    links: dict[str, Link] = field(default_factory=dict)
    # calibrate's tables: bandwidth by working set, GEMM rate by shape (None: one of each)
    calibration: Calibration | None = None

    @property
    def rate_model(self) -> str:
        """Which rates produce the times: 'achievable' (measured), 'calibrated' (this machine's
        tables by working set and shape) or 'ideal' (peaks)."""
        if self.achievable is not None:
            return "achievable"
        return "calibrated" if self.calibration is not None else "ideal"

    def ideal(self) -> Hardware:
        """This device on its data-sheet peaks, with no latencies or launch costs."""
        return replace(self, achievable=None, calibration=None)

    def graphs_for(self, phase: str) -> bool:
        """Whether a step of `phase` launches its kernels through a CUDA graph."""
        return self.cuda_graphs if self.cuda_graphs is not None else phase == "decode"

    def gemm_rate(self, dtype: str) -> float:
        """Achievable dense GEMM FLOP/s for activations in `dtype` (the peak when unmeasured)."""
        return self._measured("gemm_flops", dtype)

    def attention_rate(self, dtype: str) -> float:
        """Achievable fused-attention FLOP/s for activations in `dtype` (the peak if unmeasured)."""
        return self._measured("attention_flops", dtype)

    def _measured(self, which: str, dtype: str) -> float:
        if self.achievable is None:
            return self.peak(dtype)
        rates = getattr(self.achievable, which)
        for k in COMPUTE_WITH[DTYPE_ALIASES.get(dtype, dtype)]:
            if k in rates:
                return rates[k]
            if k in self.peak_flops:  # no measurement of the dtype the peaks would use
                break
        return self.peak(dtype)

    def peak(self, dtype: str) -> float:
        """Achievable FLOP/s computing with activations stored in `dtype`."""
        key = DTYPE_ALIASES.get(dtype, dtype)
        if key not in COMPUTE_WITH:
            raise ConfigError(f"unknown compute dtype {dtype!r}; known: {', '.join(COMPUTE_WITH)}")
        for k in COMPUTE_WITH[key]:
            if k in self.peak_flops:
                return self.peak_flops[k] * self.compute_efficiency
        raise ConfigError(
            f"hardware {self.name!r} has no peak for {key} compute "
            f"(peak_flops has: {', '.join(self.peak_flops)})"
        )

    def bandwidth(self) -> float:
        """Memory bandwidth, bytes/s: the measured one, else the peak times memory_efficiency."""
        if self.achievable is not None:
            return self.achievable.memory_bandwidth
        return self.memory_bandwidth * self.memory_efficiency

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, loadable again by `hardware_from_dict`."""
        d = asdict(self)
        if not self.links:  # a spec without measured links reads as it did before they existed
            del d["links"]
        if self.calibration is None:
            del d["calibration"]  # a file without the tables reads as before them
        else:
            d["calibration"] = self.calibration.to_dict()
        return d


def _positive(label: str, value: Any, *, integer: bool = False) -> float:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        want = "a positive integer" if integer else "a positive number"
        raise ConfigError(f"{label} must be {want}, got {shown(value, 40)}")
    if not 0 < value < float("inf"):
        raise ConfigError(f"{label} must be positive and finite, got {shown(value, 40)}")
    return value if integer else float(value)


def _figure(label: str, value: Any, kind: str) -> float:
    """A positive finite figure within RANGES[kind], named by `label` when it is not."""
    figure = _positive(label, value)
    low, high = RANGES[kind]
    if not low <= figure <= high:
        raise ConfigError(
            f"{label} is {shown(figure)}, outside the sane range [{low:g}, {high:g}] for a device"
        )
    return figure


def _unknown(label: str, key: str, known: tuple[str, ...] | list[str]) -> ConfigError:
    text = str(key)
    close = difflib.get_close_matches(text, list(known), n=1, cutoff=0.6) if len(text) < 64 else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    return ConfigError(f"{label}: unknown field {shown(key)}; {hint}known: {', '.join(known)}")


def hardware_from_dict(d: dict, name: str, where: str = "hardware") -> Hardware:
    """Validate a mapping of Hardware fields; `name` and `source` default to the given ones."""
    fields = list(Hardware.__dataclass_fields__)
    for key in d:
        if key not in fields:
            raise _unknown(where, key, fields)
    for key in REQUIRED:
        if key not in d:
            raise ConfigError(f"{where}: missing required field {key!r}")
    peaks = d["peak_flops"]
    if not isinstance(peaks, dict) or not peaks:
        raise ConfigError(
            f"{where}: peak_flops must be a mapping of dtype to FLOP/s, got {shown(peaks)}"
        )
    for key in peaks:
        if key not in PEAK_KEYS:
            raise _unknown(f"{where}: peak_flops", key, PEAK_KEYS)
    kw: dict[str, Any] = {
        "name": _text(where, "name", d.get("name") or name),
        "source": _text(where, "source", d.get("source") or where),
        "peak_flops": {
            k: _figure(f"{where}: peak_flops.{k}", v, "peak_flops") for k, v in peaks.items()
        },
        "devices_per_node": _devices(where, d["devices_per_node"]),
    }
    for key in ("memory_bandwidth", "memory_bytes", *NULLABLE):
        value = d[key]
        kw[key] = (
            None if value is None and key in NULLABLE else _figure(f"{where}: {key}", value, key)
        )
    for key in ("compute_efficiency", "memory_efficiency"):
        value = _positive(f"{where}: {key}", d.get(key, 1.0))
        if not MIN_EFFICIENCY <= value <= 1:
            raise ConfigError(
                f"{where}: {key} must be in [{MIN_EFFICIENCY:g}, 1], got {shown(value)}"
            )
        kw[key] = value
    extra = d.get("extra") or {}
    if not isinstance(extra, dict):
        raise ConfigError(f"{where}: extra must be a mapping of name to number, got {shown(extra)}")
    kw["extra"] = {
        _text(where, "extra", k): _figure(f"{where}: extra.{cut(str(k))}", v, "extra")
        for k, v in extra.items()
    }
    if d.get("achievable") is not None:
        kw["achievable"] = _achievable(d["achievable"], f"{where}: achievable")
    if d.get("cuda_graphs") is not None:
        if not isinstance(d["cuda_graphs"], bool):
            raise ConfigError(f"{where}: cuda_graphs must be true or false")
        kw["cuda_graphs"] = d["cuda_graphs"]
    if d.get("links"):
        kw["links"] = _links(d["links"], f"{where}: links")
    if d.get("calibration") is not None:
        kw["calibration"] = calibration_from_dict(d["calibration"], f"{where}: calibration")
    return Hardware(**kw)


ACHIEVABLE_FIELDS = tuple(Achievable.__dataclass_fields__)
OPTIONAL_ACHIEVABLE = (
    "dequant_efficiency",
    "stream_launch_seconds",
    "graph_stream_launch_seconds",
)
LINK_FIELDS = tuple(Link.__dataclass_fields__)
# a kernel launch or a link's hop takes between a nanosecond and a tenth of a second
LATENCY_RANGE = (1e-9, 0.1)


def _mapping(
    value: Any, where: str, known: tuple[str, ...], optional: tuple[str, ...] = ()
) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping, got {shown(value)}")
    for key in value:
        if key not in known:
            raise _unknown(where, key, known)
    missing = [k for k in known if k not in value and k not in optional]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)}")
    return value


def _latency(label: str, value: Any) -> float:
    figure = _positive(label, value)
    low, high = LATENCY_RANGE
    if not low <= figure <= high:
        raise ConfigError(f"{label} is {shown(figure)} s, outside [{low:g}, {high:g}]")
    return figure


def _rates(value: Any, where: str) -> dict[str, float]:
    # empty where no dtype was measured (l40s's attention): every dtype at its peak
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of dtype to FLOP/s, got {shown(value)}")
    for key in value:
        if key not in PEAK_KEYS:
            raise _unknown(where, key, PEAK_KEYS)
    return {k: _figure(f"{where}.{k}", v, "peak_flops") for k, v in value.items()}


def _link(value: Any, where: str, *, switch: bool = False) -> Link | None:
    """A link's figures; `switch`: inside a node, where an NVSwitch's NVLS may be given."""
    if value is None:
        return None
    d = _mapping(value, where, LINK_FIELDS, optional=("tuning", "nvls"))
    tuning = d.get("tuning")
    if tuning is not None and (not isinstance(tuning, str) or tuning not in TUNINGS):
        raise ConfigError(
            f"{where}.tuning: unknown collective tuning {shown(tuning, 40)}; "
            f"known: {', '.join(TUNINGS)}"
        )
    if d.get("nvls") is not None and not switch:
        # NCCL runs NVLS across nodes only as NVLS tree (or with CollNet), which is not modelled
        raise ConfigError(f"{where}.nvls: NVLS is given on the achievable interconnect only")
    return Link(
        bus_bandwidth=_figure(f"{where}.bus_bandwidth", d["bus_bandwidth"], "network_bandwidth"),
        step_latency=_latency(f"{where}.step_latency", d["step_latency"]),
        tuning=tuning,
        nvls=None if d.get("nvls") is None else _nvls(d["nvls"], f"{where}.nvls"),
    )


NVLS_FIELDS = tuple(Nvls.__dataclass_fields__)
MAX_NVLS_RANKS = 32  # NCCL_MAX_NVLS_ARITY: the GPUs one NVLS group spans


def _nvls(value: Any, where: str) -> Nvls:
    d = _mapping(value, where, NVLS_FIELDS)
    table = d["bandwidth"]
    if not isinstance(table, dict) or not table:
        raise ConfigError(
            f"{where}.bandwidth must be a mapping of group size to bytes/s, got {shown(table)}"
        )
    out = {}
    for key, bw in table.items():
        ranks = int(key) if isinstance(key, str) and key.isdigit() else key
        if isinstance(ranks, bool) or not isinstance(ranks, int):
            raise ConfigError(f"{where}.bandwidth: group size {shown(key)} is not an integer")
        if not 2 <= ranks <= MAX_NVLS_RANKS:
            raise ConfigError(
                f"{where}.bandwidth: group size {ranks} is outside [2, {MAX_NVLS_RANKS}]"
            )
        out[ranks] = _figure(f"{where}.bandwidth.{ranks}", bw, "network_bandwidth")
    return Nvls(latency=_latency(f"{where}.latency", d["latency"]), bandwidth=out)


# the collectives `links` may price (rows of the op table with latency steps; a test holds them
# to it): the kinds `graphllm calibrate --link` times, and those a spec file may give
LINK_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send")


def _links(value: Any, where: str) -> dict[str, Link]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of collective to link, got {shown(value)}")
    for key in value:
        if key not in LINK_KINDS:
            raise _unknown(where, key, LINK_KINDS)
    out = {k: _link(v, f"{where}.{k}") for k, v in value.items()}
    return {k: v for k, v in out.items() if v is not None}


def _achievable(value: Any, where: str) -> Achievable:
    """The measured rates of a preset or spec file, each figure in its sane range."""
    d = _mapping(value, where, ACHIEVABLE_FIELDS, optional=OPTIONAL_ACHIEVABLE)
    return Achievable(
        gemm_flops=_rates(d["gemm_flops"], f"{where}.gemm_flops"),
        attention_flops=_rates(d["attention_flops"], f"{where}.attention_flops"),
        memory_bandwidth=_figure(
            f"{where}.memory_bandwidth", d["memory_bandwidth"], "memory_bandwidth"
        ),
        interconnect=_link(d["interconnect"], f"{where}.interconnect", switch=True),
        network=_link(d["network"], f"{where}.network"),
        launch_seconds=_unmeasured(_latency, f"{where}.launch_seconds", d["launch_seconds"]),
        graph_launch_seconds=_unmeasured(
            _latency, f"{where}.graph_launch_seconds", d["graph_launch_seconds"]
        ),
        graph_replay_seconds=_unmeasured(
            _latency, f"{where}.graph_replay_seconds", d["graph_replay_seconds"]
        ),
        sm_count=_unmeasured(_count, f"{where}.sm_count", d["sm_count"]),
        gemm_tile=_unmeasured(_tile, f"{where}.gemm_tile", d["gemm_tile"]),
        source=_text(where, "source", d["source"]),
        dequant_efficiency=_shares(d.get("dequant_efficiency"), f"{where}.dequant_efficiency"),
        **{
            k: _unmeasured(_latency, f"{where}.{k}", d.get(k))
            for k in ("stream_launch_seconds", "graph_stream_launch_seconds")
        },
    )


def _unmeasured(parse: Callable[[str, Any], Any], label: str, value: Any) -> Any:
    """`parse(label, value)`, or None for a figure given as null (not measured)."""
    return None if value is None else parse(label, value)


def _count(label: str, value: Any) -> int:
    return int(_positive(label, value, integer=True))


# int8 is an activation dtype too (W8A8): its share prices only a matmul of two dtypes, a
# dequantising kernel (roofline's _dequant_share)
DEQUANT_DTYPES = WEIGHT_ONLY | {"int8"}


def _shares(value: Any, where: str) -> dict[str, float]:
    """Weight-only dtype -> a share of the bandwidth in (MIN_EFFICIENCY, 1]."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(
            f"{where} must be a mapping of weight dtype to a share, got {shown(value)}"
        )
    out = {}
    for key, share in value.items():
        if key not in DEQUANT_DTYPES:
            raise _unknown(where, key, sorted(DEQUANT_DTYPES))
        figure = _positive(f"{where}.{key}", share)
        if not MIN_EFFICIENCY <= figure <= 1:
            raise ConfigError(
                f"{where}.{key} must be in [{MIN_EFFICIENCY:g}, 1], got {shown(figure)}"
            )
        out[key] = figure
    return out


def _tile(label: str, value: Any) -> tuple[int, int]:
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        raise ConfigError(f"{label} must be [M, N], two positive integers, got {shown(value)}")
    m, n = (int(_positive(label, v, integer=True)) for v in value)
    return (m, n)


def _devices(where: str, value: Any) -> int:
    count = int(_positive(f"{where}: devices_per_node", value, integer=True))
    if count > MAX_DEVICES_PER_NODE:
        raise ConfigError(
            f"{where}: devices_per_node is {shown(count, 40)}; graphllm takes at most "
            f"{MAX_DEVICES_PER_NODE} (a node has 8 to 72)"
        )
    return count


MAX_TEXT = 8192  # characters: a preset's source cites a dozen measurements in one line


def _text(where: str, key: str, value: Any) -> str:
    """A name or source: a string of printable text that a report can print on one line."""
    text = str(value) if isinstance(value, (str, int, float)) else None
    if text is None or len(text) > MAX_TEXT or not text.isprintable():
        raise ConfigError(f"{where}: {key} must be a line of text, got {shown(value, 40)}")
    return text


def local_path() -> Path:
    """Where `graphllm calibrate` keeps this machine's figures."""
    cache = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(cache):  # the XDG spec: a relative path is invalid and ignored
        cache = str(Path.home() / ".cache")
    return Path(cache) / "graphllm" / "hardware-local.yaml"


def _presets() -> dict[str, dict]:
    return read_mapping(PRESETS_PATH, infinity=False)


def _canon(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


def _preset_key(name: str, presets: dict[str, dict]) -> str:
    want = _canon(name)
    for key, entry in presets.items():
        if want == key or want in entry.get("aliases", ()):
            return key
    names = [*presets, "local"]
    close = difflib.get_close_matches(want, names, n=1, cutoff=0.5) if len(want) < 64 else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ConfigError(
        f"unknown hardware {shown(name)}; {hint}known: {', '.join(names)} or a file path"
    )


def _looks_like_path(s: str) -> bool:
    return "/" in s or "\\" in s or s.lower().endswith((".json", ".yaml", ".yml"))


def load_hardware(name_or_path: str | Path) -> Hardware:
    """A preset (case-insensitive, aliases allowed), `local`, or a YAML/JSON file of the fields."""
    text = str(name_or_path)
    if isinstance(name_or_path, str) and _canon(text) == "local":
        path = local_path()
        problem = folder_problem(path.parent)
        if problem is not None and not path.is_file():
            raise ConfigError(f"--hardware local reads {path}, but {problem} (XDG_CACHE_HOME)")
        if file_mode(path) is not None and not path.is_file():  # read_mapping names what it is
            read_mapping(path, infinity=False)
        if not path.is_file():
            raise ConfigError(
                "no calibration for this machine; run `graphllm calibrate` first "
                f"(looked for {shown_path(path)})"
            )
        return _in_model(
            hardware_from_dict(read_mapping(path, infinity=False), "local", shown_path(path))
        )
    if isinstance(name_or_path, Path) or _looks_like_path(text) or file_mode(text) is not None:
        path = Path(text)
        return _in_model(
            hardware_from_dict(read_mapping(path, infinity=False), path.stem, shown_path(path))
        )
    presets = _presets()
    key = _preset_key(text, presets)
    d = {k: v for k, v in presets[key].items() if k not in PRESET_ONLY}
    return _in_model(hardware_from_dict(d, key, f"{PRESETS_PATH.name}: {key}"))


def _in_model(hw: Hardware) -> Hardware:
    """`hw` under the rate model of the running command (`rate_model`)."""
    ideal, graphs = _RATE_MODEL.get()
    hw = hw.ideal() if ideal else hw
    return hw if graphs is None else replace(hw, cuda_graphs=graphs)


def _summary(hw: Hardware) -> str:
    link = hw.interconnect_bandwidth
    links = f", link {link / 1e9:g} GB/s/dir x{hw.devices_per_node}" if link else ""
    return (
        f"{hw.peak('bf16') / 1e12:g} TFLOP/s bf16, {hw.memory_bandwidth / 1e12:.3g} TB/s, "
        f"{hw.memory_bytes / 1e9:g} GB{links}{_measured_summary(hw)}"
    )


def _measured_summary(hw: Hardware) -> str:
    """The achievable figures' part of `_summary` (none for `local`: calibrate's figures are
    themselves measured)."""
    ach = hw.achievable
    if ach is None:
        return "" if hw.name == "local" else "; peaks only (no achievable figures)"
    text = (
        f"; achievable {hw.gemm_rate('bf16') / 1e12:g} TFLOP/s GEMM, "
        f"{ach.memory_bandwidth / 1e12:.3g} TB/s"
    )
    if ach.interconnect is not None:
        text += f", link busbw {ach.interconnect.bus_bandwidth / 1e9:g} GB/s"
        if ach.interconnect.nvls is not None:
            text += " (NVLS all-reduce)"
    return text


def list_hardware() -> list[tuple[str, str]]:
    """(name, one-line description) for every preset, then `local`."""
    out = []
    for key, entry in _presets().items():
        hw = load_hardware(key)
        out.append((key, f"{entry.get('description', key)}: {_summary(hw)}"))
    if local_path().is_file():
        out.append(
            ("local", f"this machine (graphllm calibrate): {_summary(load_hardware('local'))}")
        )
    else:
        out.append(("local", "this machine: not calibrated yet; run `graphllm calibrate`"))
    return out
