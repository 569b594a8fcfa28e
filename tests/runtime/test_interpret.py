"""graphllm's numpy interpreter == HF transformers, per family, on tiny random checkpoints.

Each case builds a tiny transformers model with random weights (every parameter moved off its
initial value, so norm weights are not 1 and biases not 0), saves it as a safetensors
checkpoint, loads that folder with `graphllm.load_config` + `load_weights`, and compares logits
(prefill and one cached decode step), the KV cache, causality, and bf16/fp16 checkpoint loading.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import graphllm  # noqa: E402
from graphllm.build.weights import load_weights  # noqa: E402
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
    "max_position_embeddings": 256,
    # token ids inside the tiny vocabulary (some families default to 32000)
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 10000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # small, so that the 16-dim head has frequencies in all three llama3 bands
    "original_max_position_embeddings": 64,
}
YARN_ROPE = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 64,
}
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 48}

# id -> (model_type, config overrides on top of SMALL)
CASES: dict[str, tuple[str, dict]] = {
    "llama": ("llama", {}),
    "llama-llama3-rope": ("llama", {"rope_parameters": LLAMA3_ROPE}),
    "llama-tied-llama3.2": (
        "llama",
        {"rope_parameters": LLAMA3_ROPE, "tie_word_embeddings": True, "num_hidden_layers": 3},
    ),
    "llama-bias": ("llama", {"attention_bias": True, "mlp_bias": True}),
    "llama-mha": ("llama", {"num_key_value_heads": 4}),  # Llama 2: no repeat_kv
    "mistral-window": ("mistral", {"sliding_window": 4, "num_hidden_layers": 3}),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2": ("qwen2", {}),
    "qwen2-window": (  # layers from max_window_layers on slide
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    ),
    "qwen2_moe": (
        "qwen2_moe",
        {
            **MOE,
            "num_hidden_layers": 4,
            "shared_expert_intermediate_size": 40,
            "decoder_sparse_step": 2,  # layers 1 and 3 route ...
            "mlp_only_layers": [3],  # ... but layer 3 is dense: only layer 1 is MoE
        },
    ),
    "qwen3": ("qwen3", {"head_dim": 16}),
    "qwen3-yarn": ("qwen3", {"head_dim": 16, "rope_parameters": YARN_ROPE}),
    "qwen3_moe-norm_topk": ("qwen3_moe", {**MOE, "head_dim": 16, "norm_topk_prob": True}),
    "qwen3_moe-no_norm_topk": ("qwen3_moe", {**MOE, "head_dim": 16, "norm_topk_prob": False}),
    "gemma": (
        "gemma",
        {"num_key_value_heads": 1, "head_dim": 16, "tie_word_embeddings": True},
    ),
    "phi3-window": ("phi3", {"sliding_window": 4}),
    "phi3-mha-window": ("phi3", {"num_key_value_heads": 4, "sliding_window": 4}),  # Phi-3-mini
}


class Tiny:
    """One tiny HF model, its checkpoint folder and graphllm's config and weights for it.
    Subclasses (test_parity_deepseek) bring their own `cases`, `small` and `settle`."""

    cases: dict[str, tuple[str, dict]] = CASES
    small: dict = SMALL

    def __init__(self, case: str, folder) -> None:
        model_type, overrides = self.cases[case]
        torch.manual_seed(0)
        hf_cfg = transformers.AutoConfig.for_model(model_type, **{**self.small, **overrides})
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():  # norm weights off 1 (gemma: off 0), biases off 0
                p.add_(0.1 * torch.randn_like(p))
            self.settle(model)
        self.model = model.eval()
        self.folder = folder
        model.save_pretrained(folder)
        self.cfg = graphllm.load_config(folder)
        self.weights: dict | None = None

    def settle(self, model) -> None:
        """Move what else the family keeps (buffers) off its initial value."""

    def graph(self, seq_len: int = SEQ, past_len: int = 0, **build):
        wl = graphllm.Workload.with_dtype(
            batch=BATCH, seq_len=seq_len, past_len=past_len, dtype="fp32"
        )
        return graphllm.build_graph(self.cfg, wl, **build)

    def run(self, ids: np.ndarray, past: dict | None = None, **build) -> dict[str, np.ndarray]:
        p = 0 if past is None else next(iter(past.values())).shape[2]
        g = self.graph(ids.shape[1], p, **build)
        if self.weights is None:
            self.weights = load_weights(g, self.folder)
        return run_graph(g, self.weights, ids, past)

    @torch.no_grad()
    def hf(self, ids: np.ndarray, past=None):
        return self.model(torch.from_numpy(ids), cache=past, use_cache=True)


def tiny_models(kind: type[Tiny]):
    """A module-scoped fixture: case -> its `kind` model, each built once per module."""

    @pytest.fixture(scope="module")
    def tiny(tmp_path_factory):
        models: dict[str, Tiny] = {}

        def get(case: str) -> Tiny:
            if case not in models:
                models[case] = kind(case, tmp_path_factory.mktemp(case))
            return models[case]

        return get

    return tiny


tiny = tiny_models(Tiny)


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


def _presents(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in out.items() if k.startswith("present.")}


@pytest.mark.parametrize("case", CASES)
def test_prefill_logits(tiny, case):
    m = tiny(case)
    ids = _ids(1)
    ours = m.run(ids)["logits"]
    theirs = m.hf(ids).logits.numpy()
    assert ours.shape == theirs.shape == (BATCH, SEQ, SMALL["vocab_size"])
    np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("case", CASES)
def test_cached_decode_step(tiny, case):
    m = tiny(case)
    ids, nxt = _ids(2), _ids(3, seq=1)
    prefill = m.run(ids)
    step = m.run(nxt, past=_presents(prefill))
    hf_prefill = m.hf(ids)
    hf_step = m.hf(nxt, past=hf_prefill.cache)
    np.testing.assert_allclose(step["logits"], hf_step.logits.numpy(), atol=ATOL, rtol=0)
    # a window layer's cache rolls like transformers': the last W-1 past keys plus the new one
    w = m.cfg.sliding_window if m.cfg.layer_types[0] == "sliding_attention" else None
    held = min(SEQ, w - 1) if w else SEQ
    assert step["present.0.key"].shape[2] == held + 1


@pytest.mark.parametrize("case", ["llama", "llama-mha", "gemma", "qwen3"])
def test_present_kv_matches_hf_cache(tiny, case):
    m = tiny(case)
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
def test_causal(tiny, case):
    m = tiny(case)
    ids = _ids(5)
    base = m.run(ids)["logits"]
    for t in (0, 3, SEQ - 2):
        changed = ids.copy()
        changed[:, t + 1 :] = (changed[:, t + 1 :] + 7) % SMALL["vocab_size"]
        out = m.run(changed)["logits"]
        np.testing.assert_allclose(out[:, : t + 1], base[:, : t + 1], atol=1e-6, rtol=0)
        assert not np.allclose(out[:, t + 1 :], base[:, t + 1 :], atol=1e-3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", ["llama-bias", "mixtral"])
def test_half_precision_checkpoint(tiny, tmp_path, case, dtype):
    m = tiny(case)
    half = copy.deepcopy(m.model).to(getattr(torch, dtype))
    half.save_pretrained(tmp_path)
    state = {k: v.float().numpy() for k, v in half.state_dict().items()}
    assert graphllm.load_config(tmp_path).num_experts == m.cfg.num_experts
    got = load_weights(m.graph(), tmp_path)
    assert set(got) == {n.name for n in m.graph().params()}
    for name, arr in got.items():
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr, _from_state(state, name), err_msg=name)
    fp32 = m.model.state_dict()["model.embed_tokens.weight"].numpy()
    assert not np.array_equal(got["model.embed_tokens.weight"], fp32)  # stored rounded


def _from_state(state: dict[str, np.ndarray], name: str) -> np.ndarray:
    """The in-memory tensor a graph param holds. transformers 5 keeps each MoE layer's experts
    fused, as `experts.gate_up_proj` (E, 2 ffn, d) and `experts.down_proj` (E, d, ffn), in a
    module named `mlp`; the checkpoint has one tensor per expert (`*` in the graph's name)."""
    name = name.replace(".block_sparse_moe.", ".mlp.")
    if "*" not in name:
        return state[name]
    prefix, role = name.split(".*.")
    if role in ("w2.weight", "down_proj.weight"):
        return state[f"{prefix}.down_proj"]
    gate, up = np.split(state[f"{prefix}.gate_up_proj"], 2, axis=1)
    return gate if role in ("w1.weight", "gate_proj.weight") else up
