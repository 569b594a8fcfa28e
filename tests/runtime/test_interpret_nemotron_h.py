"""issue 19: Nemotron-H through graphllm's interpreter == transformers' nemotron_h (fp32, 1e-4):
a prefill and 16 cached steps on the tiny_nemotron fixture's cases."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.tiny_models import presents
from tests.support.tiny_nemotron import BATCH, SEQ, SMALL

ATOL = 1e-4


@pytest.mark.parametrize("case", ["attention-mlp-moe"])
def test_prefill_and_sixteen_cached_steps(tiny_nemotron, case):
    m = tiny_nemotron(case)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, SMALL["vocab_size"], (BATCH, SEQ))
    ours, theirs = m.run(ids), m.hf(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    for step in range(16):
        nxt = rng.integers(0, SMALL["vocab_size"], (BATCH, 1))
        ours, theirs = m.run(nxt, past=presents(ours)), m.hf(nxt, past=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )


def test_relu2_is_live_in_the_case(tiny_nemotron):
    """relu^2 is not relu on the tiny model's activations, so parity above is relu^2's."""
    import torch

    m = tiny_nemotron("attention-mlp-moe")
    ids = np.random.default_rng(8).integers(0, SMALL["vocab_size"], (BATCH, SEQ))
    base = m.hf(ids).logits.numpy()
    mlp = m.model.model.layers[1].mixer
    kept = mlp.act_fn
    mlp.act_fn = torch.nn.ReLU()
    try:
        assert not np.allclose(m.hf(ids).logits.numpy(), base, atol=1e-3)
    finally:
        mlp.act_fn = kept
    np.testing.assert_allclose(m.hf(ids).logits.numpy(), base, atol=0, rtol=0)
