"""graphllm.build.dequantize against independent references: transformers' own dequantizers
for FP8 (integrations/finegrained_fp8.py) and MXFP4 (integrations/mxfp4.py), and for GPTQ and
AWQ, which transformers reads only through gptqmodel (not installable beside torch 2.13 and
transformers 5.24), element-by-element readers written from the published packing code
(tests/support/quantized_checkpoints.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from graphllm.build import dequantize as dq
from tests.support import quantized_checkpoints as qc

torch = pytest.importorskip("torch")
fp8 = pytest.importorskip("transformers.integrations.finegrained_fp8")
mx = pytest.importorskip("transformers.integrations.mxfp4")


def _w(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 0.05


def test_every_e4m3_code_reads_as_torch_reads_it():
    codes = np.arange(256, dtype=np.uint8)
    ours = dq.fp8_values(codes).astype(np.float32)
    theirs = torch.from_numpy(codes).view(torch.float8_e4m3fn).float().numpy()
    finite = np.isfinite(theirs)
    assert finite.sum() == 254  # 0x7f and 0xff are NaN, there is no infinity
    np.testing.assert_array_equal(ours[finite], theirs[finite])
    assert np.isnan(ours[~finite]).all()


@pytest.mark.parametrize("block", [(32, 48), (128, 128), (1, 16)])
def test_fp8_blocks_match_transformers_with_cut_edge_blocks(block):
    w = _w((70, 100))  # neither axis a multiple of the block: the last blocks are cut
    q, scale = qc.quantize_fp8(w, block)
    ours = dq.fp8_blocks(q, scale, block)
    theirs = fp8._dequantize_fp8_weight(
        torch.from_numpy(q.view(np.uint8)).view(torch.float8_e4m3fn),
        torch.from_numpy(scale),
        list(block),
        torch.float32,
    ).numpy()
    np.testing.assert_array_equal(ours, theirs)
    # the quantizer is the published rule: within e4m3's half-ulp (2**-4 relative) of the input
    np.testing.assert_allclose(ours, w, rtol=2**-4, atol=1e-9)


def test_ue8m0_scales_are_powers_of_two_as_torch_reads_e8m0():
    codes = np.arange(255, dtype=np.uint8)
    theirs = torch.from_numpy(codes).view(torch.float8_e8m0fnu).float().numpy()
    np.testing.assert_array_equal(dq.e8m0(codes), theirs)
    assert np.isnan(dq.e8m0(np.array([255], np.uint8))).all()


def test_fp8_with_e8m0_scales_equals_the_same_scales_in_fp32():
    w = _w((64, 64))
    q, scale = qc.quantize_fp8(w, (32, 32))
    codes = (np.ceil(np.log2(scale)) + 127).astype(np.uint8)  # ue8m0 rounds the scale up
    np.testing.assert_array_equal(
        dq.fp8_blocks(q, dq.e8m0(codes), (32, 32)),
        dq.fp8_blocks(q, np.exp2(codes.astype(np.float32) - 127), (32, 32)),
    )


def test_mxfp4_matches_transformers_convert_moe_packed_tensors():
    w = _w((3, 48, 96), seed=1)  # gpt-oss's experts layout: [E, out, in]
    blocks, scales = zip(*(qc.quantize_mxfp4(w[e]) for e in range(3)), strict=True)
    b, s = np.stack(blocks), np.stack(scales)
    assert b.shape == (3, 48, 3, 16) and s.shape == (3, 48, 3)
    ours = dq.mxfp4(b, s)
    theirs = mx.convert_moe_packed_tensors(
        torch.from_numpy(b), torch.from_numpy(s), dtype=torch.float32
    )
    theirs = theirs.transpose(1, 2).numpy()  # gpt-oss's experts compute x @ W: [E, in, out]
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(ours[1], qc.mxfp4_reference(b[1], s[1]))
    # e2m1 keeps one mantissa bit: a value is within a quarter of its block's largest power of 2
    err = np.abs(ours - w).reshape(3, 48, 3, 32).max(-1)
    assert (err <= np.abs(w).reshape(3, 48, 3, 32).max(-1) / 4 + 1e-9).all()


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("desc_act", [False, True])
@pytest.mark.parametrize("v2", [False, True])
def test_gptq_matches_the_reference_reader(bits, desc_act, v2):
    w = _w((32, 64), seed=bits)
    parts = qc.quantize_gptq(w, bits, 16, desc_act, v2)
    ours = dq.gptq(
        parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], bits, 0 if v2 else 1
    )
    np.testing.assert_array_equal(ours, qc.gptq_reference(parts, bits, v2))
    step = np.abs(w).max() * 2 / ((1 << bits) - 1)
    assert np.abs(ours - w).max() <= step  # a real quantization of w, not noise
    if desc_act:
        assert not np.array_equal(parts["g_idx"], np.arange(64) // 16)


def test_gptq_v1_and_v2_differ_by_one_in_the_stored_zero():
    """The same matrix read with the other format's zero offset is off by one step a group."""
    parts = qc.quantize_gptq(_w((16, 32)), 4, 16, False, v2=False)
    as_v1 = dq.gptq(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], 4, 1)
    as_v2 = dq.gptq(parts["qweight"], parts["qzeros"], parts["scales"], parts["g_idx"], 4, 0)
    s = np.repeat(parts["scales"].astype(np.float32), 16, 0).T
    np.testing.assert_allclose(as_v2 - as_v1, s, rtol=1e-6)


def test_awq_matches_the_reference_reader_and_its_interleaved_order():
    w = _w((32, 64), seed=5)
    parts = qc.quantize_awq(w, 32)
    ours = dq.awq(parts["qweight"], parts["qzeros"], parts["scales"], 32, 4)
    np.testing.assert_array_equal(ours, qc.awq_reference(parts, 32))
    assert np.abs(ours - w).max() <= (w.max() - w.min()) / 15
    # reading the words in plain order scrambles the columns: the order is part of the format
    plain = dq.unpack_along_cols(parts["qweight"], 4)
    assert not np.array_equal(
        plain, dq.unpack_along_cols(parts["qweight"], 4, dq.AWQ_REVERSE_ORDER)
    )


def test_the_awq_orders_are_inverse():
    assert [dq.AWQ_ORDER[i] for i in dq.AWQ_REVERSE_ORDER] == list(range(8))


def test_mxfp4_packs_the_low_nibble_first():
    blocks = np.zeros((1, 1, 16), np.uint8)
    blocks[0, 0, 0] = 0x2F  # low nibble 0xF (-6), high nibble 0x2 (+1)
    out = dq.mxfp4(blocks, np.array([[127]], np.uint8))
    assert out[0, :2].tolist() == [-6.0, 1.0]
    assert out.dtype == np.float32 and ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max == 448
