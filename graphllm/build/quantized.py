"""One quantized matrix of a checkpoint: the tensors it is stored as, checked, then dequantized.

A graph param `...q_proj.weight` whose `QuantFormat` (from the config's quantization_config)
says it is stored quantized lies in the checkpoint as several tensors, named as each method's
published checkpoints name them:

| method | tensors (dtype, shape for an [out, in] matrix)                                        |
|--------|---------------------------------------------------------------------------------------|
| fp8    | `W` F8_E4M3 [out, in]; `W_scale_inv` F32/BF16 (or F8_E8M0 with scale_fmt ue8m0)        |
|        | [ceil(out/r), ceil(in/c)] for blocks of r x c                                          |
| mxfp4  | `W_blocks` U8 [out, in/32, 16]; `W_scales` U8 [out, in/32]                              |
| gptq   | `P.qweight` I32 [in*b/32, out]; `P.qzeros` I32 [groups, out*b/32]; `P.scales` F16        |
|        | [groups, out]; `P.g_idx` I32 [in] (required with desc_act)                              |
| awq    | `P.qweight` I32 [in, out*b/32]; `P.qzeros` I32 [groups, out*b/32]; `P.scales` F16        |
|        | [groups, out]                                                                           |

(W: the param's name; P: W without its `.weight`.) Every tensor is checked (present, dtype,
shape, and g_idx's values) before any is dequantized, so a damaged checkpoint is one
WeightsError naming the tensor, and only one matrix's stored tensors are in memory at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from graphllm.build import dequantize as dq
from graphllm.echo import shown
from graphllm.errors import WeightsError

if TYPE_CHECKING:
    from graphllm.models.quantization import QuantFormat


class Stored(Protocol):
    """What a quantized read needs of a checkpoint (`graphllm.build.weights.SafetensorsFolder`)."""

    def __contains__(self, name: str) -> bool: ...
    def dtype_shape(self, name: str) -> tuple[str, tuple[int, ...]]: ...
    def stored(self, name: str) -> np.ndarray: ...


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _block(fmt: QuantFormat, shape: tuple[int, int]) -> tuple[int, int]:
    """The (rows, cols) one scale covers; a non-positive size is the whole axis (GPTQ's
    group_size -1: one group per column)."""
    rows, cols = fmt.block
    return (rows if rows > 0 else shape[0], cols if cols > 0 else shape[1])


def _base(name: str) -> str:
    return name[: -len(".weight")] if name.endswith(".weight") else name


def stored_names(name: str, fmt: QuantFormat) -> list[str]:
    """The tensors the matrix `name` needs from the checkpoint (g_idx only when desc_act
    makes it part of the meaning; without it the groups are consecutive)."""
    if fmt.method == "fp8":
        return [name, name + "_scale_inv"]
    if fmt.method == "mxfp4":
        return [name + "_blocks", name + "_scales"]
    base = _base(name)
    names = [f"{base}.qweight", f"{base}.qzeros", f"{base}.scales"]
    return names + [f"{base}.g_idx"] if fmt.method == "gptq" and fmt.desc_act else names


def _check(
    ckpt: Stored, name: str, dtypes: tuple[str, ...], shape: tuple[int, ...], why: str
) -> None:
    """The tensor `name` is there, of one of `dtypes` and of `shape`; `why` says who needs it."""
    if name not in ckpt:
        raise WeightsError(f"storing {why} needs tensor {shown(name)}, which the checkpoint lacks")
    dtype, got = ckpt.dtype_shape(name)
    if dtype not in dtypes:
        raise WeightsError(
            f"{shown(name)}: dtype {dtype}, but storing {why} needs {' or '.join(dtypes)}"
        )
    if got != shape:
        raise WeightsError(
            f"{shown(name)}: shape {list(got)}, but storing {why} needs {list(shape)}"
        )


Read = Callable[[], np.ndarray]
# what GPTQ's stored zero point lacks, by checkpoint_format (graphllm.build.dequantize.gptq)
GPTQ_ZERO_OFFSET = {"gptq": 1, "gptq_v2": 0}


def check_quantized(ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, ...]) -> Read:
    """Every stored tensor of the [out, in] matrix `name` checked against `fmt` from the headers
    alone; returns the read that dequantizes it to float32."""
    if len(shape) == 3 and fmt.method == "mxfp4":
        return _mxfp4_stacked(ckpt, name, fmt, (shape[0], shape[1], shape[2]))
    if len(shape) != 2:
        raise WeightsError(f"{name}: {fmt.method} stores matrices, the graph's is {list(shape)}")
    if fmt.method not in _READERS:
        raise WeightsError(f"{name}: graphllm does not read {fmt.method} checkpoints")
    return _READERS[fmt.method](ckpt, name, fmt, (shape[0], shape[1]))


def _fp8(ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, int]) -> Read:
    if (fmt.values, fmt.value_bits) != ("e4m3", 8):
        raise WeightsError(f"{name}: graphllm reads FP8 e4m3 values, not {fmt.values}")
    rows, cols = _block(fmt, shape)
    why = f"{name} {list(shape)} as FP8 e4m3 in {rows}x{cols} blocks"
    _check(ckpt, name, ("F8_E4M3",), shape, why)
    # DeepSeek-V3 stores F32 scales, Qwen3's FP8 checkpoints BF16 ones (transformers casts
    # either); ue8m0 scales (DeepSeek-V3.1's scale_fmt) are powers of two, also as E8M0 codes
    floats = ("F32", "BF16", "F16")
    scale_dtypes = (*floats, "F8_E8M0") if fmt.scale_fmt == "e8m0" else floats
    # one scale for the whole matrix (weight_block_size null) is a scalar, as transformers keeps it
    per_tensor = tuple(fmt.block) == (0, 0)
    grid = () if per_tensor else (_cdiv(shape[0], rows), _cdiv(shape[1], cols))
    _check(ckpt, name + "_scale_inv", scale_dtypes, grid, why)
    codes = ckpt.dtype_shape(name + "_scale_inv")[0] == "F8_E8M0"

    def read() -> np.ndarray:
        scale = ckpt.stored(name + "_scale_inv")
        scale = dq.e8m0(scale) if codes else scale
        scale = scale.reshape(1, 1) if per_tensor else scale
        return dq.fp8_blocks(ckpt.stored(name), scale, (rows, cols))

    return read


def _mxfp4(ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, int]) -> Read:
    if (fmt.values, fmt.value_bits, tuple(fmt.block)) != ("e2m1", 4, (1, dq.MX_BLOCK)):
        raise WeightsError(
            f"{name}: graphllm reads MXFP4 as e2m1 values in blocks of {dq.MX_BLOCK} along a row"
        )
    out, inn = shape
    if inn % dq.MX_BLOCK:
        raise WeightsError(f"{name}: MXFP4 needs rows of a multiple of 32 values, not {inn}")
    why = f"{name} {list(shape)} as MXFP4 (e2m1 in blocks of 32, E8M0 scales)"
    groups = inn // dq.MX_BLOCK
    _check(ckpt, name + "_blocks", ("U8",), (out, groups, dq.MX_BLOCK // 2), why)
    _check(ckpt, name + "_scales", ("U8",), (out, groups), why)
    return lambda: dq.mxfp4(ckpt.stored(name + "_blocks"), ckpt.stored(name + "_scales"))


# gpt-oss keeps all experts of a projection in one tensor: the graph's (E, in, out) is
# stored as E [out, in] matrices, W_blocks U8 [E, out, in/32, 16] and W_scales U8 [E, out, in/32]
# (transformers' convert_moe_packed_tensors dequantizes them and swaps the last two axes)
def _mxfp4_stacked(ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, int, int]) -> Read:
    if (fmt.values, fmt.value_bits, tuple(fmt.block)) != ("e2m1", 4, (1, dq.MX_BLOCK)):
        raise WeightsError(
            f"{name}: graphllm reads MXFP4 as e2m1 values in blocks of {dq.MX_BLOCK} along a row"
        )
    experts, inn, out = shape
    if inn % dq.MX_BLOCK:
        raise WeightsError(f"{name}: MXFP4 needs rows of a multiple of 32 values, not {inn}")
    why = f"{name} {list(shape)} as {experts} MXFP4 [out, in] matrices (E8M0 scales)"
    groups = inn // dq.MX_BLOCK
    _check(ckpt, name + "_blocks", ("U8",), (experts, out, groups, dq.MX_BLOCK // 2), why)
    _check(ckpt, name + "_scales", ("U8",), (experts, out, groups), why)

    def read() -> np.ndarray:
        w = dq.mxfp4(ckpt.stored(name + "_blocks"), ckpt.stored(name + "_scales"))
        return np.ascontiguousarray(w.transpose(0, 2, 1))  # (E, in, out)

    return read


def _int_bits(name: str, fmt: QuantFormat, allowed: tuple[int, ...]) -> int:
    bits = fmt.value_bits
    if fmt.values != "int" or bits not in allowed:
        raise WeightsError(
            f"{name}: graphllm reads {fmt.method} of {' or '.join(map(str, allowed))} bits, "
            f"not {bits}"
        )
    return bits


def _groups(name: str, fmt: QuantFormat, shape: tuple[int, int]) -> tuple[int, int]:
    rows, cols = _block(fmt, shape)
    if rows != 1:
        raise WeightsError(f"{name}: {fmt.method} groups run along the input axis, not {rows} rows")
    return cols, _cdiv(shape[1], cols)


def _gptq_checked(
    ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, int]
) -> tuple[int, int, int]:
    """(bits, group size, groups) of a GPTQ matrix whose stored tensors are all checked."""
    # 3 bits pack across word boundaries (GPTQ's own layout for it); not read here
    bits = _int_bits(name, fmt, (2, 4, 8))
    out, inn = shape
    size, groups = _groups(name, fmt, shape)
    per = 32 // bits
    if inn % per or out % per:
        raise WeightsError(
            f"{name}: {bits}-bit GPTQ packs {per} values a word; {list(shape)} does not divide"
        )
    base, why = _base(name), f"{name} {list(shape)} as {bits}-bit GPTQ in groups of {size}"
    _check(ckpt, f"{base}.qweight", ("I32",), (inn // per, out), why)
    _check(ckpt, f"{base}.qzeros", ("I32",), (groups, out // per), why)
    _check(ckpt, f"{base}.scales", ("F16", "BF16"), (groups, out), why)
    if fmt.desc_act:  # checked now, read again with the matrix: a MoE has many of them
        _check(ckpt, f"{base}.g_idx", ("I32",), (inn,), why + " with desc_act")
        _group_index(ckpt, f"{base}.g_idx", groups)
    return bits, size, groups


def _gptq(ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, int]) -> Read:
    bits, size, groups = _gptq_checked(ckpt, name, fmt, shape)
    inn, base, desc_act = shape[1], _base(name), fmt.desc_act
    offset = GPTQ_ZERO_OFFSET[fmt.checkpoint_format]

    def read() -> np.ndarray:
        # without desc_act: consecutive runs of `size` input rows, whatever a stored g_idx says
        g_idx = _group_index(ckpt, f"{base}.g_idx", groups) if desc_act else np.arange(inn) // size
        return dq.gptq(
            ckpt.stored(f"{base}.qweight"),
            ckpt.stored(f"{base}.qzeros"),
            ckpt.stored(f"{base}.scales"),
            g_idx,
            bits,
            offset,
        )

    return read


def _group_index(ckpt: Stored, name: str, groups: int) -> np.ndarray:
    """desc_act's group of each input row, read when checked (4 bytes a row): each one of the
    `groups` scales' rows."""
    g_idx = np.array(ckpt.stored(name))
    bad = (g_idx < 0) | (g_idx >= groups)
    if bad.any():
        row = int(np.argmax(bad))
        raise WeightsError(
            f"{name}: input row {row} is in group {int(g_idx[row])}, not one of the {groups}"
        )
    return g_idx


def _awq_checked(
    ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, int]
) -> tuple[int, int, int]:
    """(bits, group size, groups) of an AWQ GEMM matrix whose stored tensors are all checked."""
    bits = _int_bits(name, fmt, (4,))  # AWQ's GEMM layout interleaves eight 4-bit columns
    out, inn = shape
    size, groups = _groups(name, fmt, shape)
    per = 32 // bits
    if out % per:
        raise WeightsError(f"{name}: 4-bit AWQ packs {per} output columns a word, not {out}")
    base, why = _base(name), f"{name} {list(shape)} as 4-bit AWQ (GEMM) in groups of {size}"
    _check(ckpt, f"{base}.qweight", ("I32",), (inn, out // per), why)
    _check(ckpt, f"{base}.qzeros", ("I32",), (groups, out // per), why)
    _check(ckpt, f"{base}.scales", ("F16", "BF16"), (groups, out), why)
    return bits, size, groups


def _awq(ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, int]) -> Read:
    bits, size, _ = _awq_checked(ckpt, name, fmt, shape)
    base = _base(name)
    return lambda: dq.awq(
        ckpt.stored(f"{base}.qweight"),
        ckpt.stored(f"{base}.qzeros"),
        ckpt.stored(f"{base}.scales"),
        size,
        bits,
    )


_READERS: dict[str, Callable[[Stored, str, QuantFormat, tuple[int, int]], Read]] = {
    "fp8": _fp8,
    "mxfp4": _mxfp4,
    "gptq": _gptq,
    "awq": _awq,
}


# -- the integers themselves, for a consumer that keeps them packed (MatMulNBits) -------------
@dataclass(frozen=True)
class IntGroups:
    """One GPTQ/AWQ [out, in] matrix as the integers it stores, unpacked but not dequantized:
    w[j, k] = scales[j, g] * (values[j, k] - zeros[j, g]), g = g_idx[k] (desc_act) or k //
    group_size; zeros with GPTQ v1's missing one added back."""

    values: np.ndarray  # (out, in) uint8 (or uint16 past 8 bits: none is read)
    zeros: np.ndarray  # (out, groups) int32; v1's stored 15 reads 16 at 4 bits
    scales: np.ndarray  # (out, groups) float32, exactly the stored fp16/bf16
    g_idx: np.ndarray | None  # (in,) int32 with desc_act, else None: consecutive groups
    bits: int
    group_size: int


ReadGroups = Callable[[], IntGroups]


def check_int_groups(
    ckpt: Stored, name: str, fmt: QuantFormat, shape: tuple[int, ...]
) -> ReadGroups:
    """`check_quantized` for a GPTQ/AWQ matrix whose integers are wanted as they are: the same
    checks, a read that unpacks them (`IntGroups`) instead of dequantizing."""
    if len(shape) != 2 or fmt.method not in ("gptq", "awq"):
        raise WeightsError(f"{name}: only GPTQ/AWQ matrices keep their integers, not {fmt.method}")
    two = (shape[0], shape[1])
    base = _base(name)
    if fmt.method == "awq":
        bits, size, _ = _awq_checked(ckpt, name, fmt, two)
        order: tuple[int, ...] | None = dq.AWQ_REVERSE_ORDER
        offset, desc_act, groups = 0, False, 0
    else:
        bits, size, groups = _gptq_checked(ckpt, name, fmt, two)
        order, offset, desc_act = None, GPTQ_ZERO_OFFSET[fmt.checkpoint_format], fmt.desc_act

    def read() -> IntGroups:
        words = ckpt.stored(f"{base}.qweight")
        if order is None:  # GPTQ: packed along the input axis
            values = dq.unpack_along_rows(words, bits)  # (in, out)
        else:
            values = dq.unpack_along_cols(words, bits, order)  # (in, out)
        zeros = dq.unpack_along_cols(ckpt.stored(f"{base}.qzeros"), bits, order) + offset
        g_idx = _group_index(ckpt, f"{base}.g_idx", groups).astype(np.int32) if desc_act else None
        return IntGroups(
            values.T.astype(np.uint8),
            np.ascontiguousarray(zeros.T, np.int32),
            np.ascontiguousarray(ckpt.stored(f"{base}.scales").astype(np.float32).T),
            g_idx,
            bits,
            size,
        )

    return read
