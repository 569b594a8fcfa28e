"""graphllm's interpreter == transformers' DeepseekV2/DeepseekV3 on tiny random checkpoints.

Logits for a prefill and 16 cached single-token steps, each step fed graphllm's own latent cache
(`present.{i}.key`: the normed latent, `.value`: the RoPE key), which must also equal what
transformers caches. Both MLA forms (naive and absorbed) are checked against transformers.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_parity import Tiny as DenseTiny  # noqa: E402
from test_parity import _presents, tiny_models  # noqa: E402

import graphllm  # noqa: E402
from graphllm.runtime.interpret import run_graph  # noqa: E402

BATCH, SEQ, STEPS = 2, 8, 16
ATOL = 1e-4
SMALL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "moe_intermediate_size": 16,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "kv_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "n_routed_experts": 8,
    "num_experts_per_tok": 3,
    "first_k_dense_replace": 1,
    "max_position_embeddings": 256,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
    "mscale": 0.707,
    "mscale_all_dim": 0.707,
}
CASES: dict[str, tuple[str, dict]] = {
    # DeepSeek-V2-Lite's shape: one q_proj, greedy softmax routing, two shared experts
    "v2-lite-greedy": ("deepseek_v2", {"q_lora_rank": None, "topk_method": "greedy"}),
    # DeepSeek-V2's: q down/up, group-limited routing, routed scaling, yarn with mscale
    "v2-group-yarn": (
        "deepseek_v2",
        {
            "q_lora_rank": 24,
            "topk_method": "group_limited_greedy",
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 1.5,
            "rope_parameters": YARN,
        },
    ),
    # DeepSeek-V3's: sigmoid + correction bias + grouped top-k, normalised, scaled
    "v3-noaux": (
        "deepseek_v3",
        {
            "q_lora_rank": 24,
            "n_group": 4,
            "topk_group": 2,
            "n_shared_experts": 1,
            "rope_parameters": {**YARN, "mscale": 1.0, "mscale_all_dim": 1.0},
        },
    ),
    "v3-no-interleave": (
        "deepseek_v3",
        {"q_lora_rank": None, "n_group": 2, "topk_group": 1, "rope_interleave": False},
    ),
}

# DeepSeek-V2 with norm_topk_prob: DeepSeek's modeling_deepseek.py renormalises the top-k weights
# instead of scaling them; transformers ignores the flag (its routing is patched in the test)
RENORM = {
    "v2-norm-topk": (
        "deepseek_v2",
        {"q_lora_rank": None, "norm_topk_prob": True, "routed_scaling_factor": 2.0},
    )
}


class Tiny(DenseTiny):
    cases = CASES | RENORM
    small = SMALL

    def settle(self, model) -> None:
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # nonzero, so it changes choices
                buf.copy_(0.05 * torch.randn_like(buf))


tiny = tiny_models(Tiny)


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
@pytest.mark.parametrize("case", CASES)
def test_prefill_and_16_cached_steps(tiny, case, mla):
    m = tiny(case)
    ids = _ids(1)
    ours = m.run(ids, mla=mla)
    theirs = m.hf(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    cache = theirs.cache
    past = _presents(ours)
    for step in range(STEPS):
        nxt = _ids(100 + step, seq=1)
        ours = m.run(nxt, past=past, mla=mla)
        theirs = m.hf(nxt, past=cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )
        past, cache = _presents(ours), theirs.cache
    assert past["present.0.key"].shape == (BATCH, 1, SEQ + STEPS, SMALL["kv_lora_rank"])
    assert past["present.0.value"].shape == (BATCH, 1, SEQ + STEPS, SMALL["qk_rope_head_dim"])


@pytest.mark.parametrize("case", CASES)
def test_cache_is_the_latent_and_the_rope_key(tiny, case):
    m = tiny(case)
    ids = _ids(4)
    ours = m.run(ids)
    cache = m.hf(ids).cache
    for i, layer in enumerate(cache.layers):
        np.testing.assert_allclose(ours[f"present.{i}.key"], layer.keys.numpy(), atol=ATOL, rtol=0)
        np.testing.assert_allclose(
            ours[f"present.{i}.value"], layer.values.numpy(), atol=ATOL, rtol=0
        )


def test_correction_bias_and_group_limit_change_the_choice(tiny):
    """Dropping the stored bias or the group limit changes the logits: both are exercised."""
    m = tiny("v3-noaux")
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


def test_v2_norm_topk_prob_renormalises_instead_of_scaling(tiny):
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2TopkRouter

    m = tiny("v2-norm-topk")
    assert m.cfg.norm_topk_prob and m.cfg.routed_scaling_factor == 2.0
    ids = _ids(7)
    plain = m.hf(ids).logits.numpy()  # transformers as it is: scaled, not renormalised
    routers = [mod for mod in m.model.modules() if isinstance(mod, DeepseekV2TopkRouter)]
    hooks = [r.register_forward_hook(_renormalised) for r in routers]
    try:
        ours, theirs = m.run(ids), m.hf(ids)
        np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
        assert not np.allclose(ours["logits"], plain, atol=1e-3)  # the flag changes the logits
        cache, past = theirs.cache, _presents(ours)
        for step in range(4):
            nxt = _ids(300 + step, seq=1)
            ours, theirs = m.run(nxt, past=past), m.hf(nxt, past=cache)
            np.testing.assert_allclose(
                ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
            )
            past, cache = _presents(ours), theirs.cache
    finally:
        for h in hooks:
            h.remove()
