"""issue 19: Qwen3-Next through graphllm's numpy interpreter == transformers' Qwen3NextForCausalLM
(fp32, 1e-4) on tiny random checkpoints: a prefill longer than one chunk of the delta rule, 16
cached decode steps carrying the conv and recurrent states, several new tokens after a past, and
the states themselves against transformers' cache."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.support.tiny_qwen3_next import BATCH, CASES, LONG, SMALL, carried

ATOL = 1e-4


def _ids(rng: np.random.Generator, t: int) -> np.ndarray:
    return rng.integers(0, SMALL["vocab_size"], (BATCH, t))


@pytest.mark.parametrize("case", CASES)
def test_prefill_longer_than_a_chunk_then_16_decode_steps(tiny_qwen3_next, case):
    m = tiny_qwen3_next(case)
    rng = np.random.default_rng(0)
    ids = _ids(rng, LONG)
    ours, theirs = m.run(ids), m.hf(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    for step in range(16):
        nxt = _ids(rng, 1)
        ours, theirs = m.run(nxt, past=carried(ours)), m.hf(nxt, past=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )


def test_the_states_are_transformers_cache(tiny_qwen3_next):
    m = tiny_qwen3_next("qwen3_next")
    ids = _ids(np.random.default_rng(1), 8)
    ours, cache = m.run(ids), m.hf(ids).cache
    k = m.cfg.conv_kernel
    for i, kind in enumerate(m.cfg.layer_types):
        if kind != "linear_attention":
            assert f"present.{i}.conv_state" not in ours
            continue
        layer = cache.layers[i]
        # transformers keeps the last K inputs channels first; the state needs the last K-1,
        # its channels regrouped as the graph's conv reads them (group by group)
        conv = layer.conv_states[0].numpy()[:, :, 1:].transpose(0, 2, 1)
        conv = conv[
            :, :, m.graph(8)[f"model.layers.{i}.linear_attn.conv1d.weight_view"].attrs["index"]
        ]
        assert ours[f"present.{i}.conv_state"].shape == (BATCH, k - 1, conv.shape[2])
        np.testing.assert_allclose(ours[f"present.{i}.conv_state"], conv, atol=ATOL, rtol=0)
        np.testing.assert_allclose(
            ours[f"present.{i}.recurrent_state"],
            layer.recurrent_states[0].numpy(),
            atol=ATOL,
            rtol=0,
        )


def test_several_new_tokens_after_a_past_run_the_chunked_form_from_the_state(tiny_qwen3_next):
    m = tiny_qwen3_next("qwen3_next")
    rng = np.random.default_rng(2)
    ids, more = _ids(rng, 8), _ids(rng, 5)
    ours, theirs = m.run(ids), m.hf(ids)
    step = m.run(more, past=carried(ours))
    np.testing.assert_allclose(
        step["logits"], m.hf(more, past=theirs.cache).logits.numpy(), atol=ATOL, rtol=0
    )
    ops = {n.op for n in m.graph(5, 8).nodes()}
    assert "gated_delta_chunked_state" in ops and "gated_delta_step" not in ops
    assert "gated_delta_step" in {n.op for n in m.graph(1, 8).nodes()}


def test_a_prompt_shorter_than_the_kernel(tiny_qwen3_next):
    m = tiny_qwen3_next("qwen3_next")
    rng = np.random.default_rng(3)
    ids = _ids(rng, 2)  # fewer than K-1 inputs: the conv state keeps zeros in front
    ours, theirs = m.run(ids), m.hf(ids)
    for step in range(3):
        nxt = _ids(rng, 1)
        ours, theirs = m.run(nxt, past=carried(ours)), m.hf(nxt, past=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )


def test_padded_positions_enter_the_recurrence_as_zeros(tiny_qwen3_next):
    """The graph reads the attention mask before each linear layer (transformers'
    apply_mask_to_padding_states): a masked position changes nothing downstream of the
    linear layers' input (the attention layers' padding is the ONNX export's mask)."""
    m = tiny_qwen3_next("qwen3_next")
    from graphllm.runtime.interpret import run_graph

    g = m.graph(6)
    assert "attention_mask" in g
    ids = _ids(np.random.default_rng(4), 6)
    mask = np.ones((BATCH, 6), np.int64)
    mask[1, :2] = 0
    out = run_graph(g, m.weights, ids, extra={"attention_mask": mask})
    base = run_graph(g, m.weights, ids)
    np.testing.assert_array_equal(out["logits"][0], base["logits"][0])
    zeroed = [n for n in g.nodes() if n.op == "zero_padding"]
    assert len(zeroed) == m.cfg.layer_types.count("linear_attention")
    assert not np.allclose(
        out["present.1.recurrent_state"][1], base["present.1.recurrent_state"][1]
    )
