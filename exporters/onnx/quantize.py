"""Weight-only quantized MatMuls: onnxruntime's com.microsoft `MatMulNBits`, from float weights.

`Quantization` (graphllm.exporters.onnx.nbits) is what `export_onnx(quantize=...)` and
`graphllm export --quantize` take; the defaults are onnxruntime-genai's model builder's for the
CPU (block 32, accuracy_level 4).
`quantize_blockwise` is onnxruntime's own rule (MLAS `MlasQuantizeBlockwise`, which
`onnxruntime.quantization.matmul_nbits_quantizer.DefaultWeightOnlyQuantizer` calls), written out
in numpy and checked bit for bit against it: blocks of `block_size` values along K (the input
axis) per output column; asymmetric: scale = (max(0, max) - min(0, min)) / (2^bits - 1), a uint8
zero point round(-min / scale); symmetric: scale = (the value of largest magnitude) / -2^(bits-1)
and the implicit zero point 2^(bits-1); q = clamp(round(w / scale + zp)). K need not be a multiple
of the block: the last block is padded with zeros, as MatMulNBits expects.

Which weights: every 2-D linear a lowering multiplies by (Q/K/V, the output projection, MLP and
shared-expert projections, MoE routers, the LM head), as onnxruntime-genai's builder quantizes
every MatMul by default; embeddings stay float (the builder quantizes Gather only when asked),
and so do routed experts, stacked (E, out, in): MatMulNBits takes a 2-D B only.

From a GPTQ/AWQ checkpoint (`graphllm export --weights DIR --quantize int4`): the matrices it
stores quantized keep their integers, re-laid out and not re-quantized (`from_int_groups`): the
checkpoint's values, scales and zero points (GPTQ v1's plus one) in blocks of its group size, so
MatMulNBits computes exactly the dequantized checkpoint's weight. With `g_idx` (desc_act) the
zero points are float and g_idx is the op's fifth input: packed uint8 zero points with g_idx
give wrong results silently (onnxruntime 1.32's CPU kernel), and at 8 bits that kernel takes no
float zero points, so an 8-bit desc_act checkpoint is refused. The weights the checkpoint keeps
float (the LM head, routers) are quantized here by the rule above, in blocks of the group size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from graphllm.build.quantized import IntGroups
from graphllm.errors import ConfigError, WeightsError
from graphllm.exporters.onnx.lowering import Lowering
from graphllm.exporters.onnx.nbits import (
    MS_DOMAIN,
    Quantization,
)
from graphllm.ir import Node
from graphllm.models.quantization import QuantFormat


@dataclass(frozen=True)
class QuantizedWeight:
    """One (N, K) weight in MatMulNBits's layout: `packed` (N, k_blocks, block_size * bits / 8)
    uint8, low nibble first for 4 bits; `scales` (N, k_blocks) float; `zero_points` (N,
    ceil(k_blocks * bits / 8)) uint8, packed like the values, or (N, k_blocks) float (with
    `g_idx`), or None (symmetric); `g_idx` (K,) int32, the block of each input, or None."""

    packed: np.ndarray
    scales: np.ndarray
    zero_points: np.ndarray | None
    g_idx: np.ndarray | None = None


def _roundf(x: np.ndarray) -> np.ndarray:
    """C's roundf (halves away from zero), which MLAS uses; numpy's round goes to even."""
    return np.sign(x) * np.floor(np.abs(x) + np.float32(0.5))


def _pack(q: np.ndarray, bits: int, fill: int = 0) -> np.ndarray:
    """uint8 values < 2^bits along the last axis, two to a byte (low nibble first) for 4 bits,
    an odd count's last high nibble `fill`."""
    if bits == 8:
        return q.astype(np.uint8)
    if q.shape[-1] % 2:
        q = np.concatenate([q, np.full((*q.shape[:-1], 1), fill, np.uint8)], axis=-1)
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8)


def _unpack(p: np.ndarray, bits: int, count: int) -> np.ndarray:
    if bits == 8:
        return p[..., :count].astype(np.int32)
    both = np.stack([p & 15, p >> 4], axis=-1).reshape(*p.shape[:-1], -1)
    return both[..., :count].astype(np.int32)


def quantize_blockwise(w: np.ndarray, q: Quantization) -> QuantizedWeight:
    """A float weight (N, K) (out, in, as a checkpoint holds a linear's) as MatMulNBits stores
    it, by onnxruntime's rule (the module docstring); scales in fp32."""
    n, k = w.shape
    bits, block = q.bits, q.block_size
    n_blocks = -(-k // block)
    padded = np.zeros((n, n_blocks * block), np.float32)
    padded[:, :k] = w
    blocks = padded.reshape(n, n_blocks, block)  # (N, k_blocks, block)
    valid = (np.arange(n_blocks * block) < k).reshape(n_blocks, block)
    big = np.float32(np.finfo(np.float32).max)
    lo = np.where(valid, blocks, big).min(axis=-1)  # the padding takes no part in the range
    hi = np.where(valid, blocks, -big).max(axis=-1)
    top = (1 << bits) - 1
    if q.symmetric:
        mid = 1 << (bits - 1)
        extreme = np.where(np.abs(hi) > np.abs(lo), hi, lo)
        scales = (extreme / np.float32(-mid)).astype(np.float32)
        zp = np.full(scales.shape, mid, np.float32)
    else:
        lo, hi = np.minimum(lo, 0), np.maximum(hi, 0)
        scales = ((hi - lo) / np.float32(top)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            zp_f = np.where(scales != 0, np.float32(0) - lo / scales, lo)
        zp = np.where(zp_f < 0, 0, np.where(zp_f > top, top, _roundf(zp_f))).astype(np.float32)
    with np.errstate(divide="ignore"):
        recip = np.where(scales != 0, np.float32(1) / scales, np.float32(0)).astype(np.float32)
    values = np.clip(_roundf(blocks * recip[..., None] + zp[..., None]), 0, top)
    values = np.where(valid, values, 0).astype(np.uint8)
    # an odd count of 4-bit zero points ends on the default zero point, as MLAS writes it
    zero_points = None if q.symmetric else _pack(zp.astype(np.uint8), bits, 1 << (bits - 1))
    return QuantizedWeight(_pack(values, bits), scales, zero_points)


def from_int_groups(
    parts: tuple[IntGroups, ...], block: int, float_zeros: bool, name: str
) -> QuantizedWeight:
    """GPTQ/AWQ matrices (stacked along N in order, as Q/K/V are) in MatMulNBits's layout, their
    integers as stored: values padded to whole blocks with zeros, a scale and zero point per
    (row, group). `float_zeros` (with g_idx) keeps the zero points float; else they are packed
    uint8, and one that does not fit (GPTQ v1's stored 15 reads 16) is refused."""
    first = parts[0]
    if any(p.group_size != block or p.bits != first.bits for p in parts):
        raise WeightsError(f"{name}: its parts are not all {first.bits}-bit in groups of {block}")
    g_idx = first.g_idx
    if any((p.g_idx is None) != (g_idx is None) for p in parts) or (
        g_idx is not None and any(not np.array_equal(p.g_idx, g_idx) for p in parts)
    ):
        raise WeightsError(
            f"{name}: the matrices one MatMulNBits stacks have different g_idx (desc_act's "
            "order); export with --ops decomposed, which keeps them apart"
        )
    bits = first.bits
    values = np.concatenate([p.values for p in parts], axis=0)  # (N, K)
    zeros = np.concatenate([p.zeros for p in parts], axis=0)  # (N, groups)
    scales = np.concatenate([p.scales for p in parts], axis=0)  # (N, groups)
    n, k = values.shape
    n_blocks = -(-k // block)
    padded = np.zeros((n, n_blocks * block), np.uint8)
    padded[:, :k] = values
    packed = _pack(padded.reshape(n, n_blocks, block), bits)  # (N, k_blocks, block * bits / 8)
    if float_zeros:
        zp: np.ndarray = zeros.astype(np.float32)
    else:
        top = (1 << bits) - 1
        if zeros.min() < 0 or zeros.max() > top:
            bad = int(zeros.max() if zeros.max() > top else zeros.min())
            raise WeightsError(
                f"{name}: a zero point of {bad} does not fit MatMulNBits's {bits}-bit zero points"
            )
        zp = _pack(zeros.astype(np.uint8), bits, 1 << (bits - 1))
    return QuantizedWeight(packed, scales, zp, None if g_idx is None else g_idx.astype(np.int32))


def dequantize(qw: QuantizedWeight, bits: int, k: int) -> np.ndarray:
    """The (N, K) fp32 weight a MatMulNBits computes with: (q - zero point) * scale."""
    n, n_blocks, _ = qw.packed.shape
    block = qw.packed.shape[2] * 8 // bits
    values = _unpack(qw.packed, bits, block)  # (N, k_blocks, block)
    if qw.zero_points is None:
        zp = np.full((n, n_blocks), 1 << (bits - 1), np.int32)
    else:
        zp = _unpack(qw.zero_points, bits, n_blocks)
    w = (values - zp[..., None]).astype(np.float32) * qw.scales.astype(np.float32)[..., None]
    return w.reshape(n, n_blocks * block)[:, :k]


class _Parts:
    """The packed values, scales and zero points of one weight, quantized once for the three
    initializers made from it (each asks in turn, with the same source arrays)."""

    def __init__(
        self,
        make: Callable[..., np.ndarray],
        q: Quantization,
        count: int,
        stored: QuantFormat | None = None,
        name: str = "",
    ) -> None:
        self.make, self.q, self.count = make, q, count
        self.stored, self.name = stored, name  # GPTQ/AWQ sources come as IntGroups
        self.sources: tuple[np.ndarray, ...] = ()
        self.value: QuantizedWeight | None = None
        self.left = 0

    def part(self, field: str) -> Callable[..., np.ndarray]:
        def get(*ws: np.ndarray) -> np.ndarray:
            same = len(ws) == len(self.sources) and all(a is b for a, b in zip(ws, self.sources))
            if self.value is None or not same:
                self.value = self._quantized(ws)
                self.sources, self.left = ws, self.count
            out = getattr(self.value, field)
            self.left -= 1
            if not self.left:  # the last part: let the sources and the quantized weight go
                self.sources, self.value = (), None
            return out

        return get

    def _quantized(self, ws: tuple) -> QuantizedWeight:
        if self.stored is None:
            return quantize_blockwise(self.make(*ws).astype(np.float32), self.q)
        # the makes a MatMulNBits weight takes (`unchanged`, a Q/K/V stack) stack rows, which
        # from_int_groups does to the integers itself
        return from_int_groups(ws, self.q.block_size, self.stored.desc_act, self.name)


def _stored_format(c: Lowering, sources: tuple[str, ...], name: str) -> QuantFormat | None:
    """The one GPTQ/AWQ format all of a MatMulNBits weight's sources are stored in, checked
    against the export's quantization; None when all are float."""
    fmts = {c.stored_format(s) for s in sources}
    if fmts == {None}:
        return None
    q = c.quantization
    assert q is not None
    fmt = next(iter(fmts))
    if len(fmts) > 1:
        raise ConfigError(f"{name}: its parts are stored in different forms; MatMulNBits takes one")
    assert fmt is not None
    if fmt.value_bits != q.bits or fmt.block[1] != q.block_size:
        raise ConfigError(
            f"{name}: stored as {fmt.value_bits}-bit {fmt.method} in groups of {fmt.block[1]}, "
            f"not the export's {q.method} in blocks of {q.block_size}"
        )
    if fmt.desc_act and q.bits == 8:
        raise ConfigError(
            f"{name}: 8-bit {fmt.method} with desc_act needs float zero points and g_idx, "
            "which onnxruntime's CPU MatMulNBits does not take at 8 bits"
        )
    return fmt


def nbits_matmul(
    c: Lowering,
    x: str,
    name: str,
    sources: tuple[str, ...],
    out_in: tuple[int, int],
    make: Callable[..., np.ndarray],
    scope: str,
    bias: str | None = None,
) -> tuple[str, list[str], dict]:
    """The inputs and attributes of a MatMulNBits computing x @ W^T (+ bias), W (N, K) made by
    `make` from the named params; its initializers `NAME_Q4|Q8`, `NAME_scales` and
    `NAME_zero_points` (onnxruntime's quantizer's names). Returns (op type, inputs, attrs)."""
    q = c.quantization
    assert q is not None, "nbits_matmul needs a quantizing lowering"
    weight = _nbits_weight(c, name, sources, out_in, make, _stored_format(c, sources, name))
    n, k = out_in
    ins = [x, *weight, bias or ""]
    while not ins[-1]:
        ins.pop()
    attrs = {
        "domain": MS_DOMAIN,
        "K": k,
        "N": n,
        "bits": q.bits,
        "block_size": q.block_size,
        "accuracy_level": q.accuracy_level,
    }
    return "MatMulNBits", ins, attrs


def _nbits_weight(
    c: Lowering,
    name: str,
    sources: tuple[str, ...],
    out_in: tuple[int, int],
    make: Callable[..., np.ndarray],
    stored: QuantFormat | None,
) -> list[str]:
    """The initializers of one MatMulNBits weight (N, K): [packed values, scales, zero points
    ("" when symmetric), g_idx ("" without desc_act)]; records each source's zero points
    (c.nbits_stored)."""
    q = c.quantization
    assert q is not None
    n, k = out_in
    n_blocks = -(-k // q.block_size)
    # a checkpoint's integers keep their zero points, float ones with g_idx (desc_act)
    symmetric = q.symmetric if stored is None else False
    float_zeros = stored is not None and stored.desc_act
    parts = _Parts(make, q, (2 if symmetric else 3) + float_zeros, stored, name)
    made = stored is not None
    packed = c.initializer(
        f"{name}_Q{q.bits}",
        sources,
        (n, n_blocks, q.block_size * q.bits // 8),
        parts.part("packed"),
        dtype="uint8",
        takes_stored=made,
    )
    scales = c.initializer(
        f"{name}_scales", sources, (n, n_blocks), parts.part("scales"), takes_stored=made
    )
    zp = g_idx = ""
    if not symmetric:
        zp_shape = (n, n_blocks) if float_zeros else (n, -(-n_blocks * q.bits // 8))
        zp = c.initializer(
            f"{name}_zero_points",
            sources,
            zp_shape,
            parts.part("zero_points"),
            dtype=None if float_zeros else "uint8",
            takes_stored=made,
        )
    kind = "none" if symmetric else "float" if float_zeros else "uint8"
    for i, src in enumerate(sources):
        c.nbits_stored[src] = "float+g_idx" if float_zeros and i == 0 else kind
    if float_zeros:
        g_idx = c.initializer(
            f"{name}_g_idx", sources, (k,), parts.part("g_idx"), dtype="int32", takes_stored=True
        )
    return [packed, scales, zp, g_idx]


# a MatMulNBits weight's zero points: symmetric, packed, float (desc_act) with the g_idx of a
# stack (Q/K/V share one) counted on its first matrix
ZERO_POINTS = ("none", "uint8", "float", "float+g_idx")


def nbits_format(q: Quantization, zero_points: str, act_dtype: str) -> QuantFormat:
    """How a MatMulNBits weight of the export is stored, for the bytes passes/stored.py counts:
    `bits` values per row in whole blocks, a scale at the export's float dtype per block, zero
    points packed per row ("uint8") or float ("float"; "float+g_idx": and an int32 g_idx per
    input)."""
    scale_bits = 16 if act_dtype == "fp16" else 32
    zero_bits = {"none": 0, "uint8": q.bits}.get(zero_points, scale_bits)
    return QuantFormat(
        method="matmulnbits",
        value_bits=q.bits,
        values="int",
        block=(1, q.block_size),
        scale_bits=scale_bits,
        zero_bits=zero_bits,
        desc_act=zero_points.startswith("float"),
        scale_fmt=act_dtype,
        index_bits=32 if zero_points == "float+g_idx" else 0,
        packed_along="blocks",
        symmetric=zero_points == "none",
    )


KEPT_METHODS = ("gptq", "awq")  # checkpoints whose integers MatMulNBits takes as they are


def checkpoint_quantization(
    q: Quantization, stored: QuantFormat | None, block_given: bool = True
) -> Quantization:
    """The export's quantization of a checkpoint stored as `stored` (a config's weights format,
    or None): for GPTQ/AWQ, `q` in blocks of the checkpoint's group (taken when the block size
    was not given), refused in one line where the checkpoint's integers cannot be kept."""
    if stored is None or stored.method not in KEPT_METHODS:
        return q
    what = f"{stored.value_bits}-bit {stored.method}"
    if stored.value_bits != q.bits:
        raise ConfigError(
            f"the checkpoint stores {what}; --quantize {q.method} would quantize its "
            f"dequantized weights again: give --quantize int{stored.value_bits}, which keeps them"
        )
    group = stored.block[1]
    if group <= 0:
        raise ConfigError(
            f"the checkpoint's {what} groups are whole rows (group_size -1), which MatMulNBits "
            f"(one power-of-two block size for every matrix) cannot take as stored"
        )
    if block_given and q.block_size != group:
        raise ConfigError(
            f"the checkpoint's {what} groups are {group} inputs: --block-size {q.block_size} "
            f"disagrees (its packed values are kept, in blocks of {group})"
        )
    return Quantization(q.method, group, q.accuracy_level, q.symmetric)


def unchanged(w: np.ndarray) -> np.ndarray:
    """A weight quantized as the checkpoint holds it, (out, in)."""
    return w


def quantized_linear(c: Lowering, n: Node, i: list[str], o: list[str]) -> None:
    """A `linear` / `linear_bias` row as one MatMulNBits: its weight (out, in) quantized, its
    bias (a third input) added by the op."""
    w = n.inputs[1].node
    bias = i[2] if len(i) > 2 else None
    src, make = w, unchanged
    if c.graph[w].op != "param":  # a view of a weight's rows (Mamba2's in_proj): stored so
        src, index = c.graph[w].inputs[0].node, np.asarray(c.graph[w].attrs["index"])
        make = lambda v: v[index]  # noqa: E731
    op, ins, attrs = nbits_matmul(c, i[0], w, (src,), c.param_shape(w), make, n.name, bias)  # type: ignore[arg-type]
    c.final(op, ins, n, o, **attrs)
