"""Each block layout the builder declares == a transformers model that has it, on tiny random
checkpoints: the prefill logits and one cached decode step.

No family is added to the config loader for this (that is the families' own issue): graphllm's
config is a loadable family's (llama, gemma) with the layout fields set by hand, and the
transformers model is the one whose decoder layer has that layout. Where that model also differs
in something other than the layout, the difference is switched off in its config or, where no
setting switches it off, replaced in the model instance before the checkpoint is saved:

- Gemma 2, pre- and post-norms around both sub-layers: soft-capping off, the query scale
  1/sqrt(head_dim), every layer full attention.
- OLMo 2, post-norms only: its q/k norms (over the whole projection, not per head) replaced by
  identities.
- SmolLM3, NoPE layers: no_rope_layers as given, no sliding window.
- Cohere, attention and MLP in parallel on one input_layernorm, RoPE on adjacent channel pairs:
  logit_scale 1; its LayerNorms (mean-subtracting) replaced by RMSNorms with the same weights.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import graphllm  # noqa: E402
from graphllm.build.weights import load_weights  # noqa: E402
from graphllm.models.model_config import BlockLayout  # noqa: E402
from graphllm.runtime.interpret import run_graph  # noqa: E402

BATCH, SEQ = 2, 8
ATOL = 1e-4
SMALL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}
ROPE = {"rope_type": "default", "rope_theta": 10000.0}
HF_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _rms_instead_of_layernorm(model) -> None:
    """Cohere's LayerNorms as RMSNorms over the same weights (the norm kind is not the layout)."""

    class RMSNorm(torch.nn.Module):
        def __init__(self, ln) -> None:
            super().__init__()
            self.weight, self.eps = ln.weight, ln.variance_epsilon

        def forward(self, x):
            return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    for layer in model.model.layers:
        layer.input_layernorm = RMSNorm(layer.input_layernorm)
    model.model.norm = RMSNorm(model.model.norm)


def _no_qk_norms(model) -> None:
    for layer in model.model.layers:
        layer.self_attn.q_norm = torch.nn.Identity()
        layer.self_attn.k_norm = torch.nn.Identity()


# case -> (transformers model_type, its config, its change or None, graphllm's family and
# config on top of SMALL, the layout fields set on graphllm's config)
CASES: dict[str, tuple] = {
    "gemma2-pre-and-post-norms": (
        "gemma2",
        {
            "query_pre_attn_scalar": 8,
            "attn_logit_softcapping": None,
            "final_logit_softcapping": None,
            "layer_types": ["full_attention"] * 2,
            "tie_word_embeddings": True,
        },
        None,
        {"model_type": "gemma", "tie_word_embeddings": True},
        {
            "block": BlockLayout(
                attention_post="post_attention_layernorm",
                ffn_pre="pre_feedforward_layernorm",
                ffn_post="post_feedforward_layernorm",
            )
        },
    ),
    "olmo2-post-norms": (
        "olmo2",
        {},
        _no_qk_norms,
        {"model_type": "llama"},
        {
            "block": BlockLayout(
                attention_pre=None,
                attention_post="post_attention_layernorm",
                ffn_pre=None,
                ffn_post="post_feedforward_layernorm",
            )
        },
    ),
    "smollm3-nope-layers": (
        "smollm3",
        {"num_hidden_layers": 3, "no_rope_layers": [1, 0, 1], "use_sliding_window": False},
        None,
        {"model_type": "llama", "num_hidden_layers": 3},
        {"rope_layers": (True, False, True)},
    ),
    "cohere-parallel-one-norm": (
        "cohere",
        {"logit_scale": 1.0, "layer_norm_eps": 1e-6, "tie_word_embeddings": True},
        _rms_instead_of_layernorm,
        {"model_type": "llama", "tie_word_embeddings": True},
        {"block": BlockLayout(ffn_pre=None, parallel=True), "rope_layout": "complex"},
    ),
}


class Pair:
    """One tiny transformers model, its checkpoint, and graphllm's config and weights for it."""

    def __init__(self, case: str, folder) -> None:
        model_type, theirs, change, family, layout = CASES[case]
        torch.manual_seed(0)
        hf_cfg = transformers.AutoConfig.for_model(
            model_type, **{**SMALL, **HF_IDS, "rope_parameters": ROPE, **theirs}
        )
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
        if change is not None:
            change(model)
        with torch.no_grad():
            for p in model.parameters():  # norm weights off their identity, so they show
                p.add_(0.1 * torch.randn_like(p))
        self.model = model.eval()
        model.save_pretrained(folder)
        self.folder = folder
        ours = graphllm.load_config({**SMALL, "rope_parameters": ROPE, **family})
        self.cfg = dataclasses.replace(ours, name=case, **layout)
        self.weights: dict | None = None

    def run(self, ids: np.ndarray, past: dict | None = None) -> dict[str, np.ndarray]:
        p = 0 if past is None else next(iter(past.values())).shape[2]
        wl = graphllm.Workload.with_dtype(
            batch=BATCH, seq_len=ids.shape[1], past_len=p, dtype="fp32"
        )
        g = graphllm.build_graph(self.cfg, wl)
        if self.weights is None:
            self.weights = load_weights(g, self.folder)  # every graph param, by its HF name
        return run_graph(g, self.weights, ids, past)

    @torch.no_grad()
    def hf(self, ids: np.ndarray, past=None):
        return self.model(torch.from_numpy(ids), cache=past, use_cache=True)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    pairs: dict[str, Pair] = {}

    def get(case: str) -> Pair:
        if case not in pairs:
            pairs[case] = Pair(case, tmp_path_factory.mktemp(case))
        return pairs[case]

    return get


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


@pytest.mark.parametrize("case", CASES)
def test_prefill_logits_match_transformers(pair, case):
    m = pair(case)
    ids = _ids(1)
    ours, theirs = m.run(ids)["logits"], m.hf(ids).logits.numpy()
    assert ours.shape == theirs.shape == (BATCH, SEQ, SMALL["vocab_size"])
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_a_cached_decode_step_matches_transformers(pair, case):
    m = pair(case)
    ids, nxt = _ids(2), _ids(3, seq=1)
    prefill = m.run(ids)
    past = {k: v for k, v in prefill.items() if k.startswith("present.")}
    step = m.run(nxt, past=past)
    hf_prefill = m.hf(ids)
    # the keys each layer caches are transformers' (a NoPE layer's unrotated); read before the
    # step, which appends to transformers' cache in place
    assert len(hf_prefill.cache.layers) == m.cfg.num_hidden_layers
    for i, layer in enumerate(hf_prefill.cache.layers):
        np.testing.assert_allclose(past[f"present.{i}.key"], layer.keys.numpy(), atol=ATOL, rtol=0)
    hf_step = m.hf(nxt, past=hf_prefill.cache)
    np.testing.assert_allclose(step["logits"], hf_step.logits.numpy(), atol=ATOL, rtol=0)


# the same checkpoints through a layout short of the model's: their logits differ, so the
# matches above do depend on the layout
SHORT = {
    "gemma2-pre-and-post-norms": {"block": BlockLayout(ffn_pre="pre_feedforward_layernorm")},
    "olmo2-post-norms": {"block": BlockLayout(attention_pre=None, ffn_pre=None)},
    "smollm3-nope-layers": {"rope_layers": ()},
    "cohere-parallel-one-norm": {"block": BlockLayout(ffn_pre=None)},
}


@pytest.mark.parametrize("case", CASES)
def test_a_layout_short_of_the_models_does_not_match(pair, case):
    m = pair(case)
    ids = _ids(4)
    theirs = m.hf(ids).logits.numpy()
    short = dataclasses.replace(m.cfg, **SHORT[case])
    wl = graphllm.Workload.with_dtype(batch=BATCH, seq_len=SEQ, dtype="fp32")
    g = graphllm.build_graph(short, wl)
    ours = run_graph(g, load_weights(g, m.folder), ids)["logits"]
    assert np.abs(ours - theirs).max() > 1e-2
