"""The timing record each rank writes: per step (prefill, decode 1..K), the seconds each segment
computed and each cut point took, with what a collective moved. dist-measure builds the
measured-beside-predicted table and the Perfetto lanes from these; `graphllm run --json` prints
them under ranks[i].steps."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class SegmentTime:
    """One run of a segment (once per microbatch)."""

    segment: int  # Segment.index
    microbatch: int
    start: float  # seconds since the rank's clock origin (after init_process_group's barrier)
    seconds: float
    nodes: int  # compute nodes it ran


@dataclass
class CollectiveTime:
    """One cut point carried out: a collective, a send or recv, or a local shard_slice."""

    node: str  # the rank program's node name (the partition report's collectives[].name)
    kind: str  # the op: all_reduce, all_gather, reduce_scatter, all_to_all, send, recv, ...
    mesh_axis: str  # tp, cp, ep, dp, pp
    group_size: int
    bytes: int  # the rank's payload: its input's bytes (all_gather: its output's)
    microbatch: int
    start: float
    seconds: float  # wall time of the torch.distributed call (includes waiting for peers)
    peer: int | None = None  # send/recv: the global rank at the other end


@dataclass
class StepRecord:
    """One forward step of the generation on one rank."""

    step: str  # "prefill", "decode 1", ..., "decode K"
    seq_len: int  # new tokens T of the step
    past_len: int  # P
    strategy: str  # Strategy.describe() of the program this step ran (decode drops cp and sp)
    compute_seconds: float = 0.0  # sum of segments[].seconds
    comm_seconds: float = 0.0  # sum of collectives[].seconds
    other_seconds: float = 0.0  # build + partition of the step's program, KV cache reshards
    seconds: float = 0.0  # the step's wall time on this rank
    segments: list[SegmentTime] = field(default_factory=list)
    collectives: list[CollectiveTime] = field(default_factory=list)


@dataclass
class RankRecord:
    """Everything one rank measured."""

    rank: int  # global rank
    coords: dict[str, int]  # device mesh coordinates (dp, pp, cp, ep, tp)
    backend: str  # gloo or nccl
    runtime: str  # numpy or onnxruntime
    weight_bytes: int  # bytes of the weight blocks this rank holds
    load_seconds: float
    steps: list[StepRecord] = field(default_factory=list)

    @property
    def compute_seconds(self) -> float:
        return sum(s.compute_seconds for s in self.steps)

    @property
    def comm_seconds(self) -> float:
        return sum(s.comm_seconds for s in self.steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "compute_seconds": self.compute_seconds,
            "comm_seconds": self.comm_seconds,
        }
