"""The `roofline` pass: predicted time per op on a device, and what bounds it.

Each op takes max(FLOPs / peak FLOP/s, bytes / memory bandwidth): the peak for the activations'
dtype and the bandwidth scaled by the hardware's achievable fractions (1.0 by default, the pure
roofline). Ops run one after another; the step's time is their sum. With fused (flash) attention
the masked (query, key) blocks are skipped, so attention ops are timed on the FLOPs the mask
allows. For a training step (cost pass with training=True) the bytes are taken 3x (see cost.py).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from graphllm.build.kinds import LAYER, SCOPE_KINDS
from graphllm.errors import PassError
from graphllm.ir import Graph
from graphllm.models.hardware import Hardware
from graphllm.passes.cost import scopes_of
from graphllm.passes.registry import meta_result, register


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
    peak = hardware.peak(graph.meta.get("act_dtype", "bf16"))
    bw = hardware.bandwidth()
    cost = results["cost"]
    skip_masked = cost.attention == "flash"
    byte_factor = 3.0 if cost.training else 1.0
    if peak <= 0 or bw <= 0:
        raise PassError(f"hardware {hardware.name}: peak and bandwidth must be positive")
    total = comp = mem = 0.0
    by_scope: dict[str, float] = defaultdict(float)
    by_op: dict[str, float] = defaultdict(float)
    for n in graph.nodes():
        oc = meta_result(n, "cost")
        flops = oc.flops - (oc.matmul - oc.matmul_causal) if skip_masked else oc.flops
        tc, tm = flops / peak, byte_factor * oc.bytes / bw
        t = max(tc, tm)
        bound = "none" if t == 0 else ("compute" if tc >= tm else "memory")
        n.meta["time"] = OpTime(t, bound)
        if t == 0:
            continue
        total += t
        if bound == "compute":
            comp += t
        else:
            mem += t
        by_op[n.op] += t
        for kind in {k for _, k in scopes_of(graph, n.name) if k != LAYER}:
            by_scope[kind] += t
    wl = graph.meta["workload"]
    return RooflineReport(
        hardware=hardware.name,
        seconds=total,
        compute_bound_seconds=comp,
        memory_bound_seconds=mem,
        by_scope={k: by_scope[k] for k in SCOPE_KINDS if k in by_scope},
        by_op=dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
        phase=wl.phase,
        tokens_per_step=wl.batch * wl.seq_len,
        new_tokens=wl.seq_len,
        peak_flops=peak,
        bandwidth=bw,
    )
