"""Quantized weights back to floats, one stored form a function, in numpy.

Each function takes the stored tensors as the checkpoint holds them (already checked for shape
and dtype by `graphllm.build.quantized`) and returns the [out, in] matrix in float32:

- `fp8_blocks`: FP8 e4m3 values times one `weight_scale_inv` per (rows x cols) block, the
  blocks at the bottom and right edges cut short (DeepSeek-V3's layout; transformers'
  `_dequantize_fp8_weight` in integrations/finegrained_fp8.py);
- `mxfp4`: two e2m1 values a byte (low nibble first) in blocks of 32 sharing an E8M0 exponent
  (OCP Microscaling Formats v1.0; gpt-oss's `_blocks`/`_scales`, transformers'
  `convert_moe_packed_tensors` in integrations/mxfp4.py);
- `gptq`: int32 words packing 32/bits values along the input axis, zero points packed along the
  output axis, a group index per input row (`g_idx`, for `desc_act`);
- `awq`: AWQ's GEMM layout, int32 words packing 8 output columns in AWQ's interleaved order.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

# e2m1's sixteen codes (sign bit 3, two exponent bits, one mantissa bit): OCP MX v1.0 table 5
E2M1_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    np.float32,
)
MX_BLOCK = 32  # values sharing one exponent in every MX format
E8M0_BIAS = 127
# AWQ's packing puts output column order[i] of each eight in nibble i (AutoAWQ's
# awq/utils/packing_utils.py AWQ_ORDER); reading back needs the inverse, AWQ_REVERSE_ORDER
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)


def e8m0(scales: np.ndarray) -> np.ndarray:
    """E8M0 exponents (uint8) as float32 powers of two, 2**(e - 127); 255 is NaN in the format."""
    e = scales.astype(np.int32)
    out = np.ldexp(np.float32(1.0), np.minimum(e, 254) - E8M0_BIAS).astype(np.float32)
    out[e == 255] = np.nan
    return out


def fp8_blocks(values: np.ndarray, scale_inv: np.ndarray, block: tuple[int, int]) -> np.ndarray:
    """[out, in] e4m3 values (a float8_e4m3fn array) times `scale_inv[i // rows, j // cols]`."""
    rows, cols = block
    w = values.astype(np.float32)
    s = np.repeat(np.repeat(scale_inv.astype(np.float32), rows, 0), cols, 1)
    return w * s[: w.shape[0], : w.shape[1]]  # the edge blocks are cut to the matrix


def fp8_values(raw: np.ndarray) -> np.ndarray:
    """Stored bytes (uint8) viewed as e4m3 (finite, NaN at 0x7f/0xff: the `fn` variant)."""
    return raw.view(ml_dtypes.float8_e4m3fn)


def mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[..., G, 16] packed bytes and [..., G] exponents -> [..., G * 32] float32."""
    lo = E2M1_VALUES[blocks & 0x0F]
    hi = E2M1_VALUES[blocks >> 4]
    vals = np.stack([lo, hi], axis=-1).reshape(*blocks.shape[:-1], blocks.shape[-1] * 2)
    vals *= e8m0(scales)[..., None]
    return vals.reshape(*blocks.shape[:-2], -1)


def unpack_along_rows(words: np.ndarray, bits: int) -> np.ndarray:
    """int32 [n, m] packing 32/bits values a word along axis 0, lowest bits first -> [n*32/bits, m]."""
    per = 32 // bits
    u = words.view(np.uint32)
    shifts = (np.arange(per, dtype=np.uint32) * bits)[None, :, None]
    vals = (u[:, None, :] >> shifts) & np.uint32((1 << bits) - 1)
    return vals.reshape(u.shape[0] * per, u.shape[1]).astype(np.int32)


def unpack_along_cols(
    words: np.ndarray, bits: int, order: tuple[int, ...] | None = None
) -> np.ndarray:
    """int32 [n, m] packing 32/bits values a word along axis 1 -> [n, m*32/bits]; value c of a
    word sits in slot order[c] (lowest bits first) when an order is given."""
    per = 32 // bits
    u = words.view(np.uint32)
    slots = np.arange(per, dtype=np.uint32) if order is None else np.array(order, np.uint32)
    vals = (u[:, :, None] >> (slots * bits)[None, None, :]) & np.uint32((1 << bits) - 1)
    return vals.reshape(u.shape[0], u.shape[1] * per).astype(np.int32)


def gptq(
    qweight: np.ndarray,
    qzeros: np.ndarray,
    scales: np.ndarray,
    g_idx: np.ndarray,
    bits: int,
    zero_offset: int,
) -> np.ndarray:
    """GPTQ's int32 [in*bits/32, out] values, [groups, out*bits/32] zeros, [groups, out] scales
    and [in] group of each input row -> [out, in]. `zero_offset` is what the stored zero lacks:
    1 for checkpoint_format gptq (v1 stores z - 1, and AutoGPTQ's kernels add the 1 back without
    masking, so a stored 15 reads as 16), 0 for gptq_v2."""
    q = unpack_along_rows(qweight, bits)  # (in, out)
    s = scales.astype(np.float32)[g_idx]  # (in, out)
    z = (unpack_along_cols(qzeros, bits) + zero_offset)[g_idx]  # (in, out)
    return ((q - z).astype(np.float32) * s).T.copy()


def awq(
    qweight: np.ndarray, qzeros: np.ndarray, scales: np.ndarray, group_size: int, bits: int
) -> np.ndarray:
    """AWQ GEMM's int32 [in, out*bits/32] values, [groups, out*bits/32] zeros and [groups, out]
    scales, both packed in AWQ's order -> [out, in]."""
    order = AWQ_REVERSE_ORDER
    q = unpack_along_cols(qweight, bits, order)  # (in, out)
    z = np.repeat(unpack_along_cols(qzeros, bits, order), group_size, 0)[: q.shape[0]]
    s = np.repeat(scales.astype(np.float32), group_size, 0)[: q.shape[0]]
    return ((q - z).astype(np.float32) * s).T.copy()
