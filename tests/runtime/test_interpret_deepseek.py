"""graphllm's interpreter == transformers' DeepseekV2/DeepseekV3 on tiny random checkpoints.

Logits for a prefill and 16 cached single-token steps, each step fed graphllm's own latent cache
(`present.{i}.key`: the normed latent, `.value`: the RoPE key), which must also equal what
transformers caches. Both MLA forms (naive and absorbed) are checked against transformers.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import graphllm
from graphllm.runtime.interpret import run_graph
from tests.support.tiny_deepseek import BATCH, CASES, SEQ, SMALL
from tests.support.tiny_models import presents

STEPS = 16
ATOL = 1e-4


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
@pytest.mark.parametrize("case", CASES)
def test_prefill_and_16_cached_steps(tiny_deepseek, case, mla):
    m = tiny_deepseek(case)
    ids = _ids(1)
    ours = m.run(ids, mla=mla)
    theirs = m.hf(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    cache = theirs.cache
    past = presents(ours)
    for step in range(STEPS):
        nxt = _ids(100 + step, seq=1)
        ours = m.run(nxt, past=past, mla=mla)
        theirs = m.hf(nxt, past=cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )
        past, cache = presents(ours), theirs.cache
    assert past["present.0.key"].shape == (BATCH, 1, SEQ + STEPS, SMALL["kv_lora_rank"])
    assert past["present.0.value"].shape == (BATCH, 1, SEQ + STEPS, SMALL["qk_rope_head_dim"])


@pytest.mark.parametrize("case", CASES)
def test_cache_is_the_latent_and_the_rope_key(tiny_deepseek, case):
    m = tiny_deepseek(case)
    ids = _ids(4)
    ours = m.run(ids)
    cache = m.hf(ids).cache
    for i, layer in enumerate(cache.layers):
        np.testing.assert_allclose(ours[f"present.{i}.key"], layer.keys.numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(
            ours[f"present.{i}.value"], layer.values.numpy(), atol=ATOL, rtol=0
        )


def test_correction_bias_and_group_limit_change_the_choice(tiny_deepseek):
    """Dropping the stored bias or the group limit changes the logits: both are exercised."""
    m = tiny_deepseek("v3-noaux")
    ids = _ids(6)
    base = m.run(ids)["logits"]
    g = graphllm.build_graph(m.cfg, graphllm.Workload(batch=BATCH, seq_len=SEQ, dtype="fp32"))
    assert {"bias_add", "group_limit", "gather_k", "normalize", "rope_pairs"} <= {
        n.op for n in g.nodes()
    }
    no_bias = {k: (0 * v if "correction_bias" in k else v) for k, v in m.weights.items()}
    assert not np.allclose(run_graph(g, no_bias, ids)["logits"], base, atol=1e-3)
    for node in g.nodes():
        if node.op == "group_limit":
            node.attrs["topk_group"] = node.attrs["n_group"]
    assert not np.allclose(run_graph(g, m.weights, ids)["logits"], base, atol=1e-3)


def _renormalised(module, inputs, out):
    """DeepSeek-V2's MoEGate with norm_topk_prob: top-k weights / their sum, unscaled."""
    logits, weights, chosen = out
    return logits, weights / (weights.sum(dim=-1, keepdim=True) + 1e-20), chosen


def test_v2_norm_topk_prob_renormalises_instead_of_scaling(tiny_deepseek):
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    m = tiny_deepseek("v2-norm-topk")
    assert m.cfg.norm_topk_prob and m.cfg.routed_scaling_factor == 2.0
    ids = _ids(7)
    plain = m.hf(ids).logits.numpy()  # transformers as it is: scaled, not renormalised
    routers = [mod for mod in m.model.modules() if isinstance(mod, DeepseekV2TopkRouter)]
    hooks = [r.register_forward_hook(_renormalised) for r in routers]
    try:
        ours, theirs = m.run(ids), m.hf(ids)
        np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
        assert not np.allclose(ours["logits"], plain, atol=1e-3)  # the flag changes the logits
        cache, past = theirs.cache, presents(ours)
        for step in range(4):
            nxt = _ids(300 + step, seq=1)
            ours, theirs = m.run(nxt, past=past), m.hf(nxt, past=cache)
            np.testing.assert_allclose(
                ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
            )
            past, cache = presents(ours), theirs.cache
    finally:
        for h in hooks:
            h.remove()
