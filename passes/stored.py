"""The bytes a weight takes as the checkpoint stores it.

A param the builder marked with a `stored` QuantFormat (its config's quantization_config) takes
that format's exact bytes, scales, zero points and group indices included, ceil over each block
dimension of each matrix (of each piece, where `stored_parts` (axis, count) says the checkpoint
keeps it as equal pieces joined on that axis: a traced `gate_up_proj`, a gate and an up
projection an expert, each with its scales); any other tensor takes its dtype's. A part of a weight (the rows an
embedding gathers, the experts one step touches, one shard) takes its share of the whole.
"""

from __future__ import annotations

from graphllm.ir import Node
from graphllm.models.quantization import QuantFormat
from graphllm.models.workload import nbytes


def param_bytes(n: Node, bindings: dict[str, float], numel: float | None = None) -> float:
    """Bytes of param `n` as stored; of `numel` of its elements (a share of them) if given."""
    t = n.out
    whole = t.numel(bindings)
    fmt = n.attrs.get("stored")
    if not isinstance(fmt, QuantFormat):
        return nbytes(t.dtype, whole if numel is None else numel)
    shape = [int(d.size if d.size is not None else bindings[d.name]) for d in t.dims]
    axis, count = n.attrs.get("stored_parts") or (0, 1)
    shape[axis] //= count
    b = float(count * fmt.nbytes(shape))
    return b if numel is None else b * numel / whole if whole else 0.0
