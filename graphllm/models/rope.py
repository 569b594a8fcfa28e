"""Rotary-embedding frequencies for each scaling rule graphllm models (default, linear, llama3, yarn,
longrope).

The formulas follow the published methods (Llama 3.1's frequency-band rule; YaRN's ramp between
interpolated and extrapolated frequencies with its attention temperature).
"""

from __future__ import annotations

import math

import numpy as np

from graphllm.models.model_config import RopeConfig


def inv_freq(rope: RopeConfig, head_dim: int, max_position_embeddings: int) -> np.ndarray:
    """Inverse frequencies, one per rotated pair: shape (head_dim // 2,), float32."""
    dim = head_dim
    base = 1.0 / (rope.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if rope.type == "default":
        out = base
    elif rope.type == "linear":
        out = base / rope.factor
    elif rope.type == "llama3":
        out = _llama3(base, rope, max_position_embeddings)
    elif rope.type == "yarn":
        out = _yarn(rope, dim, max_position_embeddings)
    elif rope.type == "longrope":
        out = base / np.asarray(rope.short_factor, dtype=np.float64)
    else:  # config.py rejects other types; this guards direct construction
        raise ValueError(f"rope type {rope.type!r} is not modelled")
    return out.astype(np.float32)


def long_inv_freq(rope: RopeConfig, head_dim: int) -> np.ndarray | None:
    """longrope's inverse frequencies past original_max_position_embeddings (None for the other
    rules, whose frequencies do not depend on the positions of a call)."""
    if rope.type != "longrope":
        return None
    base = 1.0 / (rope.theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    return (base / np.asarray(rope.long_factor, dtype=np.float64)).astype(np.float32)


def attention_scaling(rope: RopeConfig) -> float:
    """Factor applied to cos and sin (YaRN's temperature, longrope's attention factor; 1 for
    the other rules)."""
    if rope.type == "longrope":
        return rope.attention_factor if rope.attention_factor is not None else 1.0
    if rope.type != "yarn":
        return 1.0
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)


def mscale(scale: float, m: float = 1.0) -> float:
    """yarn's attention factor for a context `scale`: 0.1 m ln(scale) + 1 (1 when not scaled)."""
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def _llama3(base: np.ndarray, rope: RopeConfig, max_pos: int) -> np.ndarray:
    old_ctx = rope.original_max_position_embeddings or max_pos
    low_wavelen = old_ctx / rope.low_freq_factor
    high_wavelen = old_ctx / rope.high_freq_factor
    wavelen = 2 * math.pi / base
    scaled = np.where(wavelen > low_wavelen, base / rope.factor, base)
    if rope.high_freq_factor == rope.low_freq_factor:  # no band between (Llama 4 Scout)
        return scaled
    smooth = (old_ctx / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn(rope: RopeConfig, dim: int, max_pos: int) -> np.ndarray:
    old_ctx = rope.original_max_position_embeddings or max_pos
    pos_freqs = rope.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (rope.factor * pos_freqs)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(old_ctx / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    return interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight
