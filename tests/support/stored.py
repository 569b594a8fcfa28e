"""A traced model's stored weights against the built graph's of the same quantized config."""

from __future__ import annotations

import re

from graphllm.build.builder import build_graph
from graphllm.ir import Graph, Node
from graphllm.models.config import load_config
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.passes.stored import param_bytes
from graphllm.trace import traced_graph

PASSES = ["params", "cost", "memory"]


def _built_names(n: Node) -> list[str]:
    """The built graph's params a traced param is: itself, or a fused stack's pieces (one
    tensor an expert and a projection in the checkpoint, `experts.*.` in the built graph)."""
    how = n.attrs.get("stored_as")
    if not isinstance(how, dict) or "parts" not in how:
        return [n.name]
    pieces = {re.sub(r"\.experts\.\d+\.", ".experts.*.", p) for g in how["parts"] for p in g}
    return sorted(pieces)


def _by_kind(g: Graph) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in g.params():
        out[n.attrs["kind"]] = out.get(n.attrs["kind"], 0.0) + param_bytes(n, g.bindings)
    return out


def assert_stored_as_built(
    raw: dict, wl: Workload, alike: bool = True, cost: bool = True
) -> tuple[Graph, Graph]:
    """The traced graph of `raw` against the built one: weights (total, active, by dtype),
    (`cost`) the weights' bytes a step reads, and where the two name and count their params
    alike (`alike`) the bytes by kind and each param's stored format and dtype."""
    built, traced = build_graph(load_config(raw), wl), traced_graph(raw, wl)
    b, t = run(built, PASSES), run(traced, PASSES)
    assert t["params"].total == b["params"].total
    for key in ("weights", "weights_active", "weights_by_dtype"):
        assert getattr(t["memory"], key) == getattr(b["memory"], key), key
    if cost:
        assert t["cost"].bytes["weights"] == b["cost"].bytes["weights"]
    assert traced.meta["quantization"] == built.meta["quantization"]
    assert traced.meta["weight_dtype"] == built.meta["weight_dtype"]
    if alike:
        assert _by_kind(traced) == _by_kind(built)
        formats = {n.name: (n.attrs.get("stored"), n.out.dtype) for n in built.params()}
        for n in traced.params():
            for name in _built_names(n):
                assert formats[name] == (n.attrs.get("stored"), n.out.dtype), name
    return built, traced
