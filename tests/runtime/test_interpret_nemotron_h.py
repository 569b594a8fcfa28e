"""issue 19: Nemotron-H through graphllm's interpreter == transformers' nemotron_h (fp32, 1e-4) on
the tiny_nemotron fixture's cases: a prefill longer than one chunk (8 tokens: two chunks of 4;
11: a padded third), then 16 cached steps that carry the conv and SSM states (the recurrent
step) beside the attention layers' KV cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.tiny_models import presents
from tests.support.tiny_nemotron import BATCH, SEQ, SMALL

ATOL = 1e-4


@pytest.mark.parametrize(
    ("case", "prompt"),
    [("attention-mlp-moe", SEQ), ("hybrid", SEQ), ("hybrid", 11), ("mamba-bias", SEQ)],
)
def test_prefill_and_sixteen_cached_steps(tiny_nemotron, case, prompt):
    m = tiny_nemotron(case)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, SMALL["vocab_size"], (BATCH, prompt))
    ours, theirs = m.run(ids), m.hf(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    for step in range(16):
        nxt = rng.integers(0, SMALL["vocab_size"], (BATCH, 1))
        ours, theirs = m.run(nxt, past=presents(ours)), m.hf(nxt, past=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )
    if "M" in m.model.config.hybrid_override_pattern:
        # the states are constant in the sequence length: conv K-1 inputs, SSM (H, P, N)
        c = m.cfg
        conv = c.mamba_inner + 2 * c.mamba_n_groups * c.ssm_state_size
        assert ours["present.0.conv_state"].shape == (BATCH, c.conv_kernel - 1, conv)
        assert ours["present.0.recurrent_state"].shape == (
            BATCH,
            c.mamba_num_heads,
            c.mamba_head_dim,
            c.ssm_state_size,
        )


def test_the_graph_takes_each_form_as_transformers_does(tiny_nemotron):
    m = tiny_nemotron("hybrid")
    forms = {
        (t, p): {n.attrs["form"] for n in m.graph(t, p).nodes() if "form" in n.attrs}
        for t, p in ((8, 0), (1, 8), (3, 8), (1, 0))
    }
    assert forms == {
        (8, 0): {"chunked"},
        (1, 8): {"recurrent"},
        (3, 8): {"chunked"},
        (1, 0): {"chunked"},
    }


@torch.no_grad()
def test_relu2_and_the_dt_clamp_are_live_in_the_cases(tiny_nemotron):
    """relu^2 is not relu on the tiny model's activations, and the chunked scan's clamp of dt at
    time_step_limit's floor bites: parity above is parity of both."""
    m = tiny_nemotron("hybrid")
    ids = np.random.default_rng(8).integers(0, SMALL["vocab_size"], (BATCH, SEQ))
    base = m.hf(ids).logits.numpy()
    mlp, mamba = m.model.model.layers[2].mixer, m.model.model.layers[0].mixer
    kept = mlp.act_fn, mamba.time_step_limit
    mlp.act_fn = torch.nn.ReLU()
    try:
        assert not np.allclose(m.hf(ids).logits.numpy(), base, atol=1e-4)
    finally:
        mlp.act_fn = kept[0]
    mamba.time_step_limit = (0.0, float("inf"))
    try:
        assert not np.allclose(m.hf(ids).logits.numpy(), base, atol=1e-6)
    finally:
        mamba.time_step_limit = kept[1]
    np.testing.assert_allclose(m.hf(ids).logits.numpy(), base, atol=0, rtol=0)
