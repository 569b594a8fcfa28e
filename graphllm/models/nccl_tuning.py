"""NCCL's own price of a collective: the tuner model NCCL uses to pick an algorithm and protocol.

For every (algorithm, protocol) NCCL's tuner (src/graph/tuning.cc, `ncclTopoTuneModel` and
`ncclTopoGetAlgoTime`) prices a call as a latency (a base plus one hop latency per step, by link
class) plus the bytes over a bandwidth (the link's bus bandwidth times the protocol's share, over
the algorithm's bus-to-algorithm ratio), and runs the cheapest. One bandwidth and one latency per
link cannot give both ends: LL sends 8-byte lines of 4 data bytes and 4 flag bytes, so it has the
least latency and half the bandwidth; LL128 keeps 120 of each 128 bytes; Simple has the full
bandwidth and the most latency. Which one wins moves with the message size, and a prefill's
1-32 MiB tensor-parallel all-reduce falls where the single-figure model was 1.3-1.7x fast.

The constants are NCCL's, the same from NCCL 2.24.3 to 2.29.2 (NVIDIA/nccl, tuning.cc at
v2.24.3-1 6aae379, v2.26.2-1 f44ac75, v2.29.2-1 ebd1e92), the versions of the published
nccl-tests runs in benchmarks/published_collectives.yaml. The bus bandwidth is not NCCL's
(nChannels x the topology's per-channel figure) but the link's measured Simple-protocol busbw
(the preset's `bus_bandwidth`), which is what that product stands for.

Not here: NVLS (NVLink SHARP, on NVSwitch systems from Hopper), which NCCL's tuner prices at
25 us where nccl-tests on 8 H100s show it no faster than the ring below 32 MiB; an interconnect
with a measured `nvls` (models/hardware.py) prices it from those measurements instead, beside
this table (passes/parallel/figures.py, `nvls_seconds`). Not modelled at all: NVLS tree (across
nodes), CollNet, PAT (all-gather and reduce-scatter with one GPU a node), and the per-channel
caps on LL128 and tree bandwidth (they need NCCL's channel count; on the H100 and A100 NVLink
rings they sit above the measured busbw).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType

PROTOCOLS = ("LL", "LL128", "Simple")
# microseconds, per algorithm, one figure a protocol (LL, LL128, Simple): baseLat
BASE_US = {"ring": (6.6, 14.0, 8.4), "tree": (6.8, 14.0, 8.4)}
# microseconds a step (a hop), per link class and algorithm: hwLat
HOP_US = {
    "nvlink": {"ring": (0.6, 1.9, 3.4), "tree": (0.6, 1.25, 4.0)},
    "pci": {"ring": (1.0, 2.5, 5.7), "tree": (1.0, 1.9, 4.0)},
    "net": {"ring": (2.7, 4.0, 14.0), "tree": (5.0, 8.5, 14.0)},
}
# the share of the bus bandwidth a tree all-reduce reaches, by protocol and log2(bytes / 64)
TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9),
)  # fmt: skip
RING_SIMPLE_PLATEAU = 1.4  # Simple ring all-reduce across nodes, Ampere and later: latency x 1.4


@dataclass(frozen=True)
class Tuning:
    """What NCCL's tuner knows of one link: its hop latencies' class, the cap on LL's bus
    bandwidth (inside a node by GPU generation; across nodes by host CPU, for two nodes and for
    more), whether LL128 runs on it, and (across nodes) the host's cost to post a network send."""

    hops: str  # a key of HOP_US
    ll_cap: tuple[float, float]  # bytes/s: (one node, or two nodes; more than two nodes)
    ll128: bool
    net_overhead_us: float = 0.0


# llMaxBws: Ampere-N1 87.7, Hopper-N1 141.0 GB/s; across nodes Intel 39.0 / 20.4, AMD 22.5 / 19.0.
# LL128 runs over NVLink and over a network reached through a PCIe switch, not over a PCIe ring.
TUNINGS = {
    "nccl-nvlink-hopper": Tuning("nvlink", (141.0e9, 141.0e9), ll128=True),
    "nccl-nvlink-ampere": Tuning("nvlink", (87.7e9, 87.7e9), ll128=True),
    "nccl-pci-ampere": Tuning("pci", (87.7e9, 87.7e9), ll128=False),  # Ampere and Ada over PCIe
    "nccl-net-intel": Tuning("net", (39.0e9, 20.4e9), ll128=True, net_overhead_us=1.0),
    "nccl-net-amd": Tuning("net", (22.5e9, 19.0e9), ll128=True, net_overhead_us=2.0),
}
PRICED = ("all_reduce", "all_gather", "reduce_scatter")  # the rest are p2p, not tuned


@dataclass(frozen=True)
class Choice:
    """The algorithm and protocol NCCL's tuner picks, and its time in seconds."""

    algorithm: str
    protocol: str
    seconds: float


@dataclass(frozen=True)
class Group:
    """A `kind` collective over `ranks` ranks on `nodes` nodes, as NCCL's tuner sees it: the
    ring's steps (the op table's), the link's Simple-protocol bus bandwidth (bytes/s), and the
    tunings of the links inside a node (`intra`) and of the network (`inter`, None on one
    node)."""

    kind: str
    ranks: int
    nodes: int
    ring_steps: int
    bus_bandwidth: float
    intra: Tuning | None
    inter: Tuning | None


@lru_cache(maxsize=1024)
def nccl_table(g: Group) -> Mapping[tuple[str, str], tuple[float, float]]:
    """(algorithm, protocol) -> (latency in microseconds, algorithm bandwidth in bytes/s, before
    the tree's correction by size): the table NCCL prints under NCCL_DEBUG_SUBSYS=TUNING. Empty
    when the tuner does not price `g.kind` or lacks a link it needs."""
    ppn = g.ranks // g.nodes
    if g.kind not in PRICED or g.ranks < 2:
        return MappingProxyType({})
    if (g.nodes > 1 and g.inter is None) or (ppn > 1 and g.intra is None):
        return MappingProxyType({})
    link = g.intra if g.nodes == 1 else g.inter
    cap = link.ll_cap[0] if g.nodes <= 2 else link.ll_cap[1]
    ll128 = link.ll128 and (g.intra is None or g.intra.ll128)
    out = {}
    for algorithm in ("ring", "tree") if g.kind == "all_reduce" else ("ring",):
        for p, protocol in enumerate(PROTOCOLS):
            if protocol == "LL128" and not ll128:
                continue
            out[algorithm, protocol] = (
                _latency_us(g, algorithm, p),
                _bandwidth(g, algorithm, p, cap),
            )
    return MappingProxyType(out)  # cached: read-only


@lru_cache(maxsize=8192)  # plan prices the same collective for every layer of every layout
def nccl_choice(g: Group, nbytes: float) -> Choice | None:
    """The cheapest entry of `nccl_table` for a collective of `nbytes` (NCCL's count x type
    size, the whole tensor: the all-gather's output, the reduce-scatter's input), as NCCL's
    `ncclTopoGetAlgoTime` prices it; None where the table is empty."""
    best = None
    for (algorithm, protocol), (lat, bw) in nccl_table(g).items():
        if algorithm == "tree":
            bw *= _tree_correction(PROTOCOLS.index(protocol), nbytes)
        seconds = lat * 1e-6 + nbytes / bw
        if best is None or seconds < best.seconds:
            best = Choice(algorithm, protocol, seconds)
    return best


def _bandwidth(g: Group, algorithm: str, p: int, cap: float) -> float:
    """Bytes/s of the whole tensor (NCCL's algorithm bandwidth) for protocol index `p`."""
    bus = g.bus_bandwidth
    if algorithm == "ring":
        bw = (min(cap, bus * 0.5), bus * 0.92, bus)[p]
        return bw * g.ranks / g.ring_steps
    bw = bus * 0.92
    bw = (min(bw / 3.8, cap), bw * (7 / 9 if g.nodes == 1 else 120 / 128), bw)[p]
    return bw * 0.5


def _tree_correction(p: int, nbytes: float) -> float:
    chunks = int(nbytes) >> 6
    level = chunks.bit_length() - 1  # floor(log2), -1 below 64 bytes
    return TREE_CORRECTION[p][level] if 0 <= level < len(TREE_CORRECTION[p]) else 1.0


def _latency_us(g: Group, algorithm: str, p: int) -> float:
    ppn = g.ranks // g.nodes
    intra_hop = HOP_US[g.intra.hops][algorithm][p] if g.intra is not None else 0.0
    # with one rank a node every hop is the network's, priced at the tree's network latency
    inter_hop = HOP_US["net"]["tree" if ppn == 1 else algorithm][p]
    lat = BASE_US[algorithm][p]
    if algorithm == "tree":
        return lat + 2 * ((ppn - 1) * intra_hop + int(math.log2(g.nodes)) * inter_hop)
    if g.nodes == 1:
        return lat + g.ring_steps * intra_hop
    # a ring across nodes posts a network send at every step, intra-node ones included
    overhead = g.inter.net_overhead_us * (3 if PROTOCOLS[p] == "Simple" else 1)
    inter_steps = 2 * (g.nodes - 1) if g.kind == "all_reduce" else g.nodes - 1
    lat += (g.ring_steps - inter_steps) * max(intra_hop, overhead) + inter_steps * inter_hop
    if g.kind == "all_reduce" and PROTOCOLS[p] == "Simple":
        # NCCL applies it from 64 bytes a channel a rank, far below where Simple wins
        lat *= RING_SIMPLE_PLATEAU
    return lat
