"""Partial rotary and longrope (Phi-4-mini's attention) == transformers' phi3, through the numpy
interpreter: a prefill below original_max_position_embeddings (short factors), 16 cached decode
steps that cross it (long factors from then on, the cached keys keeping the rotation they were
made with), and a prefill past it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import graphllm.ops  # noqa: F401  (registers the rope row)
from graphllm.ir.opspec import OPS
from graphllm.runtime.interpret import run_graph
from tests.support.tiny_models import BATCH, SEQ, SMALL, presents

ATOL, STEPS, CASE = 1e-4, 16, "phi3-partial-longrope"


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


def test_config_reads_partial_rotary_and_longrope(tiny_model):
    cfg = tiny_model(CASE).cfg
    assert (cfg.head_dim, cfg.rotary_dim) == (16, 8)
    assert cfg.rope.type == "longrope" and cfg.rope.original_max_position_embeddings == 16
    # transformers' default: sqrt(1 + ln(256 / 16) / ln 16)
    assert cfg.rope.attention_factor == pytest.approx((1 + np.log(16) / np.log(16)) ** 0.5)


def test_decode_crosses_to_long_factors(tiny_model):
    m = tiny_model(CASE)
    ids = _ids(1)
    ours, theirs = m.run(ids), m.hf(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    cache = theirs.cache
    for _ in range(STEPS):  # positions 8 .. 23: the long factors from position 16 on
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        ours = m.run(nxt, past=presents(ours))
        theirs = m.hf(nxt, past=cache)
        cache = theirs.cache
        np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    # the cache holds keys of both rotations, as transformers' does
    np.testing.assert_allclose(
        ours["present.0.key"], cache.layers[0].keys.numpy(), atol=ATOL, rtol=0
    )


def test_prefill_past_original_context_uses_long_factors(tiny_model):
    m = tiny_model(CASE)
    ids = _ids(2, seq=20)
    ours = m.run(ids)["logits"]
    np.testing.assert_allclose(ours, m.hf(ids).logits.numpy(), atol=ATOL, rtol=0)
    # and the choice matters: rotating by the short factors alone gives other logits
    g = m.graph(20)
    for n in g.nodes():
        n.attrs.pop("long_inv_freq", None)
    short = run_graph(g, m.weights, ids)["logits"]
    assert np.abs(short - ours).max() > 1e-3


def test_rope_op_passes_the_channels_past_its_frequencies_through():
    x = np.random.default_rng(4).standard_normal((1, 2, 3, 16)).astype(np.float32)
    pos = np.array([[5, 6, 7]])
    out = OPS["rope"].impl([x, pos], {"inv_freq": np.array([1.0, 0.5, 0.1, 0.01])})
    np.testing.assert_array_equal(out[..., 8:], x[..., 8:])
    assert not np.allclose(out[..., :8], x[..., :8])
