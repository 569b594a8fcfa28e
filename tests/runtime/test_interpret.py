"""graphllm's numpy interpreter == HF transformers, per family, on tiny random checkpoints.

Each case is one of the `tiny_model` fixture's tiny transformers models with random weights (every
parameter moved off its initial value, so norm weights are not 1 and biases not 0), saved as a
safetensors checkpoint and loaded with `graphllm.load_config` + `load_weights`; the tests compare
logits (prefill and one cached decode step), the KV cache and causality.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import graphllm
from graphllm.runtime.interpret import run_graph
from tests.support.tiny_models import BATCH, CASES, SEQ, SMALL, presents

ATOL = 1e-4


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


@pytest.mark.parametrize("case", CASES)
def test_prefill_logits(tiny_model, case):
    m = tiny_model(case)
    ids = _ids(1)
    ours = m.run(ids)["logits"]
    theirs = m.hf(ids).logits.numpy()
    assert ours.shape == theirs.shape == (BATCH, SEQ, SMALL["vocab_size"])
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_cached_decode_step(tiny_model, case):
    m = tiny_model(case)
    ids, nxt = _ids(2), _ids(3, seq=1)
    prefill = m.run(ids)
    step = m.run(nxt, past=presents(prefill))
    hf_prefill = m.hf(ids)
    hf_step = m.hf(nxt, past=hf_prefill.cache)
    np.testing.assert_allclose(step["logits"], hf_step.logits.numpy(), atol=ATOL, rtol=0)
    # a window layer's cache rolls like transformers': the last W-1 past keys plus the new one;
    # a chunked layer's the last C-1 (issue 16: Llama 4)
    spans = {
        "sliding_attention": m.cfg.sliding_window,
        "chunked_attention": m.cfg.attention_chunk_size,
    }
    w = spans.get(m.cfg.layer_types[0])
    held = min(SEQ, w - 1) if w else SEQ
    assert step["present.0.key"].shape[2] == held + 1


@pytest.mark.parametrize(
    "case", ["llama", "llama-mha", "gemma", "qwen3", "olmo2", "cohere-qk-norm"]
)
def test_present_kv_matches_hf_cache(tiny_model, case):
    m = tiny_model(case)
    ids = _ids(4)
    ours = m.run(ids)
    cache = m.hf(ids).cache
    assert len(cache.layers) == m.cfg.num_hidden_layers
    for i, layer in enumerate(cache.layers):
        # both are (B, kv_heads, T, head_dim), keys after RoPE
        np.testing.assert_allclose(ours[f"present.{i}.key"], layer.keys.numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(
            ours[f"present.{i}.value"], layer.values.numpy(), atol=ATOL, rtol=0
        )


@pytest.mark.parametrize("case", ["llama", "mistral-window", "qwen2_moe", "mixtral"])
def test_causal(tiny_model, case):
    m = tiny_model(case)
    ids = _ids(5)
    base = m.run(ids)["logits"]
    for t in (0, 3, SEQ - 2):
        changed = ids.copy()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % SMALL["vocab_size"]
        out = m.run(changed)["logits"]
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=0)
        assert not np.allclose(out[:, t + 1 :], base[:, t + 1 :], atol=1e-3)


@pytest.mark.parametrize("case", ["llama4_text-chunked", "llama4_text-moe"])
def test_llama4_chunked_cache_rolls_through_16_decode_steps(tiny_model, case):
    """issue 16: 16 cached steps past the 8-token prompt, the chunked layers' caches holding the
    last C-1 keys (what transformers' DynamicSlidingWindowLayer holds), so a query's chunk is
    found from absolute positions once the cache has rolled past chunk boundaries; issue 18: the
    same with Llama 4's MoE layers routing each new token."""
    m = tiny_model(case)
    rng = np.random.default_rng(6)
    ids = rng.integers(0, SMALL["vocab_size"], (BATCH, SEQ))
    ours, theirs = m.run(ids), m.hf(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    chunk = m.cfg.attention_chunk_size
    for step in range(16):
        nxt = rng.integers(0, SMALL["vocab_size"], (BATCH, 1))
        ours, theirs = m.run(nxt, past=presents(ours)), m.hf(nxt, past=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )
        for i, kind in enumerate(m.cfg.layer_types):
            held = theirs.cache.layers[i].keys.shape[2]  # after this step's update
            assert ours[f"present.{i}.key"].shape[2] == (
                chunk if kind == "chunked_attention" else SEQ + step + 1
            )
            assert held == (chunk - 1 if kind == "chunked_attention" else SEQ + step + 1)


def test_llama4_router_decides_and_scales_the_expert_input(tiny_model):
    """issue 18: Llama4TextMoe's top-1 router sends tokens to different experts (the logits
    follow transformers' only because each token reaches its own), and its sigmoid weight
    scales the expert's input: scaling the output instead moves the logits off transformers'."""
    m = tiny_model("llama4_text-moe")
    assert m.cfg.moe_layers == (False, True, False, True) and m.cfg.moe_weights_input
    ids = _ids(7)
    ours, theirs = m.run(ids)["logits"], m.hf(ids).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)
    wl = graphllm.Workload(batch=BATCH, seq_len=SEQ, dtype="fp32")
    g = graphllm.build_graph(m.cfg, wl)
    router = next(n.name for n in g.params() if n.name.endswith("feed_forward.router.weight"))
    # a zero router: every logit 0, so every token goes to expert 0 (the first of equals)
    forced = dict(m.weights) | {router: np.zeros_like(m.weights[router])}
    assert not np.allclose(run_graph(g, forced, ids)["logits"], ours, atol=1e-3)
    on_output = graphllm.build_graph(dataclasses.replace(m.cfg, moe_weights_input=False), wl)
    assert "moe_combine" in {n.op for n in on_output.nodes()}
    assert not np.allclose(run_graph(on_output, m.weights, ids)["logits"], theirs, atol=1e-3)
