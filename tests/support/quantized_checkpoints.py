"""Tiny quantized checkpoints, made the way each method's published tools make them.

Quantizers (random weights in, the stored tensors out):
- FP8 block-scaled: per (r x c) block scale = amax / 448, values rounded to e4m3; the scale is
  stored as `weight_scale_inv` (what the values are multiplied by: DeepSeek-V3's inference/
  kernel.py weight_dequant, transformers' finegrained_fp8);
- MXFP4: per 32 values along a row the shared exponent floor(log2(amax)) - 2 (e2m1's largest
  exponent), stored biased by 127 (E8M0), values rounded to the nearest e2m1 (OCP MX v1.0
  section 6.3); two a byte, low nibble first (gpt-oss, transformers' integrations/mxfp4.py);
- GPTQ: per group of input rows and output column asymmetric min/max with 0 in range,
  scale = (max - min) / (2**bits - 1), zero = round(-min / scale) (AutoGPTQ's quantizer.py
  find_params), int32 words packing along the input axis for qweight and along the output axis
  for qzeros, lowest bits first (AutoGPTQ qlinear pack; GPTQModel), v1 storing zero - 1;
  desc_act permutes the input rows and records each row's group in g_idx;
- AWQ GEMM: per group min/max with zero = round(-min / scale) clamped to [0, 15] (AutoAWQ's
  quantizer.py pseudo_quantize_tensor), qweight [in, out/8] and qzeros [groups, out/8] packing
  eight output columns a word in the order 0, 2, 4, 6, 1, 3, 5, 7 (AutoAWQ gemm.py pack).
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

import graphllm
from graphllm.build.builder import build_export_graph
from graphllm.build.weights import random_weights
from graphllm.models.quantization import QuantFormat
from graphllm.passes import run

E4M3_MAX = 448.0
E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# the tiny checkpoints' sizes, as a config.json gives them: head_dim 16 and hidden 64, so that
# FP8's blocks and the groups of GPTQ, AWQ and MXFP4 divide their matrices
SMALL = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
    "dtype": "float32",
}
MXFP4_CONFIG = {  # gpt-oss-20b's quantization_config: the experts MXFP4, the rest as it was
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}


# --- quantizers: one [out, in] float32 matrix in, the stored tensors out -----------------------


def quantize_fp8(w: np.ndarray, block: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 values [out, in], float32 scale_inv [ceil(out/r), ceil(in/c)])."""
    r, c = block
    out, inn = w.shape
    grid = (-(-out // r), -(-inn // c))
    scale = np.empty(grid, np.float32)
    q = np.empty(w.shape, ml_dtypes.float8_e4m3fn)
    for i in range(grid[0]):
        for j in range(grid[1]):
            part = w[i * r : (i + 1) * r, j * c : (j + 1) * c]
            s = np.float32(max(float(np.abs(part).max()), 1e-12) / E4M3_MAX)
            scale[i, j] = s
            q[i * r : (i + 1) * r, j * c : (j + 1) * c] = (part / s).astype(ml_dtypes.float8_e4m3fn)
    return q, scale


def quantize_mxfp4(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(blocks uint8 [out, in/32, 16], scales uint8 [out, in/32])."""
    out, inn = w.shape
    g = w.reshape(out, inn // 32, 32)
    amax = np.maximum(np.abs(g).max(-1), 2.0**-126)
    exp = np.floor(np.log2(amax)).astype(np.int32) - 2
    x = g / np.ldexp(1.0, exp)[..., None]
    mag = np.minimum(np.abs(x), 6.0)
    code = np.abs(mag[..., None] - E2M1_GRID).argmin(-1).astype(np.uint8)  # nearest, ties low
    code |= (x < 0).astype(np.uint8) << 3
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).astype(np.uint8)
    return blocks, (exp + 127).astype(np.uint8)


def _asymmetric(x: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of x [rows, cols]: (q, scale fp16, zero), min/max widened to hold 0."""
    maxq = (1 << bits) - 1
    lo = np.minimum(x.min(0), 0.0)
    hi = np.maximum(x.max(0), 0.0)
    scale = ((hi - lo) / maxq).astype(np.float16)
    s = scale.astype(np.float32)
    zero = np.clip(np.round(-lo / s), 1, maxq).astype(np.int64)  # v1 cannot store a zero of 0
    q = np.clip(np.round(x / s) + zero, 0, maxq).astype(np.int64)
    return q, scale, zero


def _pack_rows(q: np.ndarray, bits: int) -> np.ndarray:
    per = 32 // bits
    words = np.zeros((q.shape[0] // per, q.shape[1]), np.uint32)
    for k in range(q.shape[0]):
        words[k // per] |= (q[k].astype(np.uint32) & ((1 << bits) - 1)) << (bits * (k % per))
    return words.view(np.int32)


def _pack_cols(q: np.ndarray, bits: int, order: tuple[int, ...] | None = None) -> np.ndarray:
    per = 32 // bits
    words = np.zeros((q.shape[0], q.shape[1] // per), np.uint32)
    for j in range(q.shape[1] // per):
        for i in range(per):
            col = j * per + (order[i] if order else i)
            words[:, j] |= (q[:, col].astype(np.uint32) & ((1 << bits) - 1)) << (bits * i)
    return words.view(np.int32)


def quantize_gptq(
    w: np.ndarray, bits: int, group: int, desc_act: bool, v2: bool, seed: int = 0
) -> dict[str, np.ndarray]:
    """qweight, qzeros, scales, g_idx of one [out, in] matrix, by GPTQ's stored layout."""
    out, inn = w.shape
    x = w.T  # (in, out): GPTQ quantizes the transposed weight, input rows in groups
    perm = np.random.default_rng(seed).permutation(inn) if desc_act else np.arange(inn)
    g_idx = np.empty(inn, np.int32)
    g_idx[perm] = np.arange(inn) // group  # row perm[i] is the i-th row quantized
    groups = -(-inn // group)
    q = np.empty((inn, out), np.int64)
    scales = np.empty((groups, out), np.float16)
    zeros = np.empty((groups, out), np.int64)
    for g in range(groups):
        rows = np.nonzero(g_idx == g)[0]
        q[rows], scales[g], zeros[g] = _asymmetric(x[rows], bits)
    stored = zeros if v2 else zeros - 1
    return {
        "qweight": _pack_rows(q, bits),
        "qzeros": _pack_cols(stored, bits),
        "scales": scales,
        "g_idx": g_idx,
    }


def quantize_awq(w: np.ndarray, group: int) -> dict[str, np.ndarray]:
    """qweight, qzeros, scales of one [out, in] matrix in AWQ's 4-bit GEMM layout."""
    out, inn = w.shape
    x = w.T  # (in, out)
    groups = inn // group
    q = np.empty((inn, out), np.int64)
    scales = np.empty((groups, out), np.float16)
    zeros = np.empty((groups, out), np.int64)
    for g in range(groups):
        part = x[g * group : (g + 1) * group]
        lo, hi = part.min(0), part.max(0)
        scales[g] = ((hi - lo).clip(1e-5) / 15).astype(np.float16)
        s = scales[g].astype(np.float32)
        zeros[g] = np.clip(np.round(-lo / s), 0, 15)
        q[g * group : (g + 1) * group] = np.clip(np.round(part / s) + zeros[g], 0, 15)
    return {
        "qweight": _pack_cols(q, 4, AWQ_ORDER),
        "qzeros": _pack_cols(zeros, 4, AWQ_ORDER),
        "scales": scales,
    }


# --- writing -----------------------------------------------------------------------------------

_DTYPE_NAMES = {
    np.dtype("<f4"): "F32",
    np.dtype("<f2"): "F16",
    np.dtype(ml_dtypes.bfloat16): "BF16",
    np.dtype("<i4"): "I32",
    np.dtype("<i8"): "I64",
    np.dtype(np.uint8): "U8",
    np.dtype(ml_dtypes.float8_e4m3fn): "F8_E4M3",
}


def save_tensors(tensors: dict[str, np.ndarray], path: Path, dtypes: dict | None = None) -> None:
    """A safetensors file of `tensors` (F8_E4M3 and U8 included, which safetensors.numpy does
    not write); `dtypes` overrides a tensor's header dtype (F8_E8M0 codes are uint8)."""
    header, chunks, pos = {}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name])
        raw = arr.tobytes()
        dtype = (dtypes or {}).get(name) or _DTYPE_NAMES[arr.dtype]
        header[name] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "data_offsets": [pos, pos + len(raw)],
        }
        chunks.append(raw)
        pos += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def quantized_tensors(
    weights: dict[str, np.ndarray], fmt: QuantFormat, quantized: set[str]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, str]]:
    """The checkpoint's tensors for `weights` (by checkpoint name) with the names in `quantized`
    stored as `fmt`; also each quantized matrix as its stored values mean it (what a loader
    must give back), and the header dtypes to override."""
    out: dict[str, np.ndarray] = {}
    meant: dict[str, np.ndarray] = {}
    dtypes: dict[str, str] = {}
    for name, w in weights.items():
        if name not in quantized:
            out[name] = w
            continue
        base = name.removesuffix(".weight")
        if fmt.method == "fp8":
            q, s = quantize_fp8(w, fmt.block)
            out[name], out[name + "_scale_inv"] = q, s
            r, c = fmt.block
            full = np.repeat(np.repeat(s, r, 0), c, 1)[: w.shape[0], : w.shape[1]]
            meant[name] = q.astype(np.float32) * full
        elif fmt.method == "mxfp4":
            b, s = quantize_mxfp4(w)
            out[name + "_blocks"], out[name + "_scales"] = b, s
            meant[name] = mxfp4_reference(b, s)
        elif fmt.method == "gptq":
            v2 = fmt.checkpoint_format == "gptq_v2"
            group = fmt.block[1] or w.shape[1]  # group_size -1: one group per column
            parts = quantize_gptq(w, fmt.value_bits, group, fmt.desc_act, v2)
            out |= {f"{base}.{k}": v for k, v in parts.items()}
            meant[name] = gptq_reference(parts, fmt.value_bits, fmt.checkpoint_format == "gptq_v2")
        elif fmt.method == "awq":
            parts = quantize_awq(w, fmt.block[1])
            out |= {f"{base}.{k}": v for k, v in parts.items()}
            meant[name] = awq_reference(parts, fmt.block[1])
        else:
            raise ValueError(f"no quantizer for {fmt.method}")
    return out, meant, dtypes


# --- reference dequantizers, element by element from the published layouts --------------------


def _field(word: int, slot: int, bits: int) -> int:
    return (word >> (slot * bits)) & ((1 << bits) - 1)


def mxfp4_reference(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """OCP MX: value k of a block is e2m1 code k (low nibble of byte k//2 first) x 2**(s-127)."""
    signs = [1.0] * 8 + [-1.0] * 8
    out = np.empty((blocks.shape[0], blocks.shape[1] * 32), np.float32)
    for r in range(blocks.shape[0]):
        for g in range(blocks.shape[1]):
            for k in range(32):
                code = (int(blocks[r, g, k // 2]) >> (4 * (k % 2))) & 0xF
                v = signs[code] * float(E2M1_GRID[code & 7])
                out[r, g * 32 + k] = v * 2.0 ** (int(scales[r, g]) - 127)
    return out


def gptq_reference(parts: dict[str, np.ndarray], bits: int, v2: bool) -> np.ndarray:
    """w[j, k] = scales[g, j] * (q[k, j] - zero[g, j]), g = g_idx[k]: input row k in word k//per
    at slot k%per of qweight, output column j at slot j%per of qzeros (AutoGPTQ's
    qlinear_cuda_old dequantization: zeros + 1 for v1)."""
    per = 32 // bits
    qw = parts["qweight"].view(np.uint32)
    qz = parts["qzeros"].view(np.uint32)
    inn, out = qw.shape[0] * per, qw.shape[1]
    w = np.empty((out, inn), np.float32)
    for k in range(inn):
        g = int(parts["g_idx"][k])
        for j in range(out):
            q = _field(int(qw[k // per, j]), k % per, bits)
            z = _field(int(qz[g, j // per]), j % per, bits) + (0 if v2 else 1)
            w[j, k] = np.float32(parts["scales"][g, j]) * np.float32(q - z)
    return w


def awq_reference(parts: dict[str, np.ndarray], group: int) -> np.ndarray:
    """w[j, k] = scales[k//group, j] * (q - z), column j in nibble i of its word where
    AWQ_ORDER[i] == j % 8 (AutoAWQ's packing)."""
    qw = parts["qweight"].view(np.uint32)
    qz = parts["qzeros"].view(np.uint32)
    inn, out = qw.shape[0], qw.shape[1] * 8
    w = np.empty((out, inn), np.float32)
    for k in range(inn):
        for j in range(out):
            slot = AWQ_ORDER.index(j % 8)
            q = _field(int(qw[k, j // 8]), slot, 4)
            z = _field(int(qz[k // group, j // 8]), slot, 4)
            w[j, k] = np.float32(parts["scales"][k // group, j]) * np.float32(q - z)
    return w


# --- whole checkpoints -------------------------------------------------------------------------


def checkpoint_weights(graph: object, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded random weights of `graph` by checkpoint name, stacked experts split per expert."""
    out = {}
    for name, arr in random_weights(graph, seed=seed).items():
        if "*" in name:
            out |= {name.replace("*", str(e)): arr[e] for e in range(arr.shape[0])}
        else:
            out[name] = arr
    return out


def quantized_names(graph: object) -> set[str]:
    """The checkpoint names of the matrices the config's quantization stores quantized."""
    quant = graph.meta["checkpoint_quantization"]
    out = set()
    for n in graph.params():
        if len(n.out.dims) > 1 and quant.format_of(n.name, n.attrs["kind"]) is not None:
            size = int(n.out.dims[0].size) if "*" in n.name else 1
            out |= {n.name.replace("*", str(e)) for e in range(size)}
    return out


def write_quantized(
    folder: Path, config: dict, quantization_config: dict, edit: Callable | None = None
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A checkpoint of `config` (a config.json's fields) with `quantization_config`: seeded
    random weights, the matrices that config quantizes stored in its method's layout;
    `edit(tensors, header_dtypes)` may damage them before they are written. Returns (the float
    weights, each quantized matrix as its stored values mean it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(config | {"quantization_config": quantization_config})
    )
    graph = build_export_graph(graphllm.load_config(folder))
    fmt = graph.meta["checkpoint_quantization"].weights
    weights = checkpoint_weights(graph)
    tensors, meant, dtypes = quantized_tensors(weights, fmt, quantized_names(graph))
    if edit is not None:
        edit(tensors, dtypes)
    save_tensors(tensors, folder / "model.safetensors", dtypes)
    return weights, meant


def write_dense(folder: Path, config: dict, weights: dict[str, np.ndarray]) -> Path:
    """An unquantized checkpoint of `weights` (float32) with `config`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_tensors(weights, folder / "model.safetensors")
    return folder


def stored_values(graph: object) -> tuple[int, int]:
    """(parameters, block scales) of the graph's params as the checkpoint stores them: each
    quantized param's scales counted from its stored format, per matrix of a stacked tensor."""
    params = run(graph, ["params"])["params"].total
    scales = 0
    for n in graph.params():
        fmt = n.attrs.get("stored")
        if fmt is not None:
            *lead, rows, cols = (d.size for d in n.out.dims)
            scales += math.prod(lead) * fmt.scales(rows, cols)
    return params, scales
