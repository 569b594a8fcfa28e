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

Not modelled, and so never picked: NVLS (NVLink SHARP, on NVSwitch systems from Hopper; NCCL
runs it for large all-reduces over 8 H100s at about 480 GB/s busbw), CollNet, PAT (all-gather and
reduce-scatter with one GPU a node), and the per-channel caps on LL128 and tree bandwidth (they
need NCCL's channel count; on the H100 and A100 NVLink rings they sit above the measured busbw).
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


@lru_cache(maxsize=1024)
def nccl_table(
    kind: str,
    ranks: int,
    nodes: int,
    ring_steps: int,
    bus_bandwidth: float,
    intra: Tuning | None,
    inter: Tuning | None,
) -> Mapping[tuple[str, str], tuple[float, float]]:
    """(algorithm, protocol) -> (latency in microseconds, algorithm bandwidth in bytes/s, before
    the tree's correction by size) of a `kind` collective over `ranks` ranks on `nodes` nodes:
    the table NCCL prints under NCCL_DEBUG_SUBSYS=TUNING, at the link's Simple-protocol
    `bus_bandwidth`. `intra` tunes the links inside a node, `inter` the network (None on one
    node). Empty when the tuner does not price `kind` or lacks a link it needs."""
    ppn = ranks // nodes
    if kind not in PRICED or ranks < 2:
        return {}
    if (nodes > 1 and inter is None) or (ppn > 1 and intra is None):
        return {}
    link = intra if nodes == 1 else inter
    cap = link.ll_cap[0] if nodes <= 2 else link.ll_cap[1]
    ll128 = link.ll128 and (intra is None or intra.ll128)
    out = {}
    for algorithm in ("ring", "tree") if kind == "all_reduce" else ("ring",):
        for p, protocol in enumerate(PROTOCOLS):
            if protocol == "LL128" and not ll128:
                continue
            bw = _algorithm_bandwidth(algorithm, p, bus_bandwidth, cap, nodes, ranks, ring_steps)
            lat = _latency_us(kind, algorithm, p, ranks, nodes, ring_steps, intra, inter)
            out[algorithm, protocol] = (lat, bw)
    return MappingProxyType(out)  # cached: read-only


@lru_cache(maxsize=8192)  # plan prices the same collective for every layer of every layout
def nccl_choice(
    kind: str,
    nbytes: float,
    ranks: int,
    nodes: int,
    ring_steps: int,
    bus_bandwidth: float,
    intra: Tuning | None,
    inter: Tuning | None,
) -> Choice | None:
    """The cheapest entry of `nccl_table` for a collective of `nbytes` (NCCL's count x type
    size, the whole tensor: the all-gather's output, the reduce-scatter's input), as NCCL's
    `ncclTopoGetAlgoTime` prices it; None where the table is empty."""
    best = None
    table = nccl_table(kind, ranks, nodes, ring_steps, bus_bandwidth, intra, inter)
    for (algorithm, protocol), (lat, bw) in table.items():
        if algorithm == "tree":
            bw *= _tree_correction(PROTOCOLS.index(protocol), nbytes)
        seconds = lat * 1e-6 + nbytes / bw
        if best is None or seconds < best.seconds:
            best = Choice(algorithm, protocol, seconds)
    return best


def _algorithm_bandwidth(
    algorithm: str, p: int, bus: float, cap: float, nodes: int, ranks: int, ring_steps: int
) -> float:
    """Bytes/s of the whole tensor (NCCL's algorithm bandwidth)."""
    if algorithm == "ring":
        bw = (min(cap, bus * 0.5), bus * 0.92, bus)[p]
        return bw * ranks / ring_steps
    bw = bus * 0.92
    bw = (min(bw / 3.8, cap), bw * (7 / 9 if nodes == 1 else 120 / 128), bw)[p]
    return bw * 0.5


def _tree_correction(p: int, nbytes: float) -> float:
    chunks = int(nbytes) >> 6
    level = chunks.bit_length() - 1  # floor(log2), -1 below 64 bytes
    return TREE_CORRECTION[p][level] if 0 <= level < len(TREE_CORRECTION[p]) else 1.0


def _latency_us(
    kind: str,
    algorithm: str,
    p: int,
    ranks: int,
    nodes: int,
    ring_steps: int,
    intra: Tuning | None,
    inter: Tuning | None,
) -> float:
    ppn = ranks // nodes
    intra_hop = HOP_US[intra.hops][algorithm][p] if intra is not None else 0.0
    # with one rank a node every hop is the network's, priced at the tree's network latency
    inter_hop = HOP_US["net"]["tree" if ppn == 1 else algorithm][p]
    lat = BASE_US[algorithm][p]
    if algorithm == "tree":
        return lat + 2 * ((ppn - 1) * intra_hop + int(math.log2(nodes)) * inter_hop)
    if nodes == 1:
        return lat + ring_steps * intra_hop
    # a ring across nodes posts a network send at every step, intra-node ones included
    overhead = inter.net_overhead_us * (3 if PROTOCOLS[p] == "Simple" else 1)
    inter_steps = 2 * (nodes - 1) if kind == "all_reduce" else nodes - 1
    lat += (ring_steps - inter_steps) * max(intra_hop, overhead) + inter_steps * inter_hop
    if kind == "all_reduce" and PROTOCOLS[p] == "Simple":
        # NCCL applies it from 64 bytes a channel a rank, far below where Simple wins
        lat *= RING_SIMPLE_PLATEAU
    return lat
