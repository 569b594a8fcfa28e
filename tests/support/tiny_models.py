"""Tiny transformers models with random weights, per family, saved with `save_pretrained`, and
graphllm's config and weights for each: the checkpoints behind the `tiny_model` fixture
(tests/conftest.py) that the interpreter and ONNX parity tests compare against.

Each case builds a tiny transformers model with random weights (every parameter moved off its
initial value, so norm weights are not 1 and biases not 0), saves it as a safetensors
checkpoint, and loads that folder with `graphllm.load_config` + `load_weights`.
"""

from __future__ import annotations

import json
from typing import ClassVar

import numpy as np
import torch
import transformers

import graphllm
from graphllm.build.weights import load_weights
from graphllm.runtime.interpret import run_graph
from tests.support.tiny_configs import PARTIAL_LONGROPE

BATCH, SEQ = 2, 8
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

# Llama 4's MoE in small, every other layer: top 1 of 4 experts and a shared one
LLAMA4_MOE = {
    "head_dim": 16,
    "intermediate_size": 24,
    "intermediate_size_mlp": 48,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 2,
}

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
    # Phi-4-mini's attention in small: RoPE on half of each 16-wide head, longrope whose short
    # factors serve the 8-token prefill and whose long ones take over once a decode step's
    # position passes original_max_position_embeddings (16), the cached keys keeping theirs
    "phi3-partial-longrope": ("phi3", {"hidden_size": 64, **PARTIAL_LONGROPE}),
    # granite's muP multipliers, each off its default and off any other (a tied head, as
    # Granite 3.3 has)
    "granite": (
        "granite",
        {
            "embedding_multiplier": 3.0,
            "attention_multiplier": 0.2,
            "residual_multiplier": 0.7,
            "logits_scaling": 3.0,
            "tie_word_embeddings": True,
        },
    ),
    # SmolLM3: every no_rope_layer_interval-th layer NoPE (layers 1 and 3 here) ...
    "smollm3": ("smollm3", {"num_hidden_layers": 4, "no_rope_layer_interval": 2}),
    # ... or as no_rope_layers lists them; with use_sliding_window the NoPE layers slide
    "smollm3-window": (
        "smollm3",
        {
            "num_hidden_layers": 3,
            "no_rope_layers": [1, 0, 0],
            "use_sliding_window": True,
            "sliding_window": 4,
        },
    ),
    # issue 16: OLMo 2, post-norms only and q/k norms over the whole projection
    "olmo2": ("olmo2", {}),
    # issue 16: Cohere, LayerNorms, attention beside the MLP, interleaved RoPE, logit_scale; and
    # per-head q/k LayerNorms, each head its own weight
    "cohere": ("cohere", {}),
    "cohere-qk-norm": ("cohere", {"use_qk_norm": True, "logit_scale": 0.5, "head_dim": 16}),
    # issue 16: Cohere 2, a window of 4 on layers 0-2 and a global NoPE layer 3, the prompt
    # longer than the window
    "cohere2-window": ("cohere2", {"num_hidden_layers": 4, "sliding_window": 4}),
    # issue 16: Gemma 2, layers 0 and 2 a window of 4 and 1 and 3 global, the prompt longer than
    # the window; caps small enough that the tanh bends the tiny model's scores and logits, and
    # a score scale off head_dim ** -0.5
    "gemma2-window": (
        "gemma2",
        {
            "num_hidden_layers": 4,
            "head_dim": 16,
            "sliding_window": 4,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 0.5,
            "final_logit_softcapping": 1.5,
        },
    ),
    # issue 16: Gemma 3, layers 0, 1 and 3 a window of 4 and layer 2 global
    # (sliding_window_pattern 3), the prompt longer than the window; the local layers' RoPE
    # base (rope_local_base_freq) far from the global one, which is linearly scaled; per-head
    # q/k norms; a score scale off head_dim ** -0.5
    "gemma3-window": (
        "gemma3_text",
        {
            "num_hidden_layers": 4,
            "head_dim": 16,
            "sliding_window": 4,
            "sliding_window_pattern": 3,
            "query_pre_attn_scalar": 24,
            "rope_theta": 10000.0,
            "rope_local_base_freq": 100.0,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
    # issue 16: Llama 4's attention on a dense decoder (no MoE layer): layers 0 and 2 RoPE,
    # chunked by 4 under the 8-token prompt and L2 QK-normed; layers 1 and 3 NoPE, full, with a
    # temperature whose floor_scale of 3 changes it inside the prompt; llama3 RoPE as Scout's;
    # the dense FFN (feed_forward) intermediate_size_mlp wide
    "llama4_text-chunked": (
        "llama4_text",
        {
            "num_hidden_layers": 4,
            "head_dim": 16,
            "intermediate_size_mlp": 48,
            "moe_layers": [],
            "no_rope_layer_interval": 2,
            "attention_chunk_size": 4,
            "floor_scale": 3,
            "attn_scale": 0.5,
            "use_qk_norm": True,
            "rope_parameters": LLAMA3_ROPE,
        },
    ),
    # issue 16: Llama 4's chunk alone, on NoPE layers without a temperature (so no rope_pairs,
    # l2norm or attn_temperature node: what the fused lowerings' attention can take)
    "llama4_text-nope-chunked": (
        "llama4_text",
        {
            "num_hidden_layers": 2,
            "head_dim": 16,
            "intermediate_size_mlp": 48,
            "moe_layers": [],
            "no_rope_layers": [0, 0],
            "layer_types": ["chunked_attention", "full_attention"],
            "attention_chunk_size": 4,
            "attn_temperature_tuning": False,
        },
    ),
    # issue 18: Llama 4's MoE in small, interleaved as Maverick's (interleave_moe_layer_step 2:
    # layers 1 and 3 route, 0 and 2 dense): top 1 of 4 experts whose sigmoid weight scales the
    # expert's input, the fused expert tensors, the shared expert, on Llama 4's attention
    "llama4_text-moe": (
        "llama4_text",
        {
            "num_hidden_layers": 4,
            **LLAMA4_MOE,
            "no_rope_layer_interval": 2,
            "attention_chunk_size": 4,
            "floor_scale": 3,
            "attn_scale": 0.5,
            "rope_parameters": LLAMA3_ROPE,
        },
    ),
    # issue 18: the same MoE under attention the fused lowerings take (no QK-norm, as Maverick's;
    # no chunk, no temperature), so that `standard` and `ort` export the MoE layers too
    "llama4_text-moe-plain": (
        "llama4_text",
        {
            "num_hidden_layers": 2,
            **LLAMA4_MOE,
            "use_qk_norm": False,
            "attention_chunk_size": None,
            "attn_temperature_tuning": False,
        },
    ),
    # issue 18: GLM-4.5's block in small: partial rotate-half RoPE (half of each 16-wide head),
    # QKV bias, per-head QK-norm, a dense first layer then DeepSeek-V3's routing (sigmoid,
    # correction bias moved off 0, groups ranked by their two best, renormalised, scaled) with a
    # shared expert, top 2 of 8 so that the router decides which experts a token reaches
    "glm4_moe": (
        "glm4_moe",
        {
            "head_dim": 16,
            "attention_bias": True,
            "use_qk_norm": True,
            "partial_rotary_factor": 0.5,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 24,
            "n_group": 4,
            "topk_group": 2,
            "routed_scaling_factor": 1.5,
            "first_k_dense_replace": 1,
            "num_hidden_layers": 3,
        },
    ),
    # GLM-4.5-Air's: no QK-norm, one group, unscaled
    "glm4_moe-air": (
        "glm4_moe",
        {
            "head_dim": 16,
            "attention_bias": True,
            "n_routed_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 24,
        },
    ),
    # issue 18: MiniMax-M2's: QK-norm over the whole projection, RoPE on 8 of 16 channels
    # (rotary_dim), sigmoid routing with the block's correction bias over 8 experts, top 2
    "minimax_m2": (
        "minimax_m2",
        {
            "head_dim": 16,
            "rotary_dim": 8,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "intermediate_size": 24,
        },
    ),
    # issue 18: gpt-oss's block in small: attention sinks, q/k/v/o biases, layers 0 and 2 a
    # window of 4 under the 8-token prompt and layer 1 full, YaRN RoPE; a biased router's top 2
    # of 8 softmaxed, experts with biases, gate and up interleaved, a swiglu_limit low enough
    # that the clamps bite the tiny model's activations
    "gpt_oss": (
        "gpt_oss",
        {
            "head_dim": 16,
            "num_hidden_layers": 3,
            "sliding_window": 4,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "intermediate_size": 24,
            "swiglu_limit": 0.3,
            "rope_parameters": {
                **YARN_ROPE,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
            },
        },
    ),
}


class TinyModel:
    """One tiny HF model, its checkpoint folder and graphllm's config and weights for it.
    Subclasses (tiny_deepseek.TinyDeepSeek) bring their own `cases`, `small` and `settle`;
    `overrides` go on top of the case's (e.g. `hidden_size=64` for head_dim 16)."""

    cases: dict[str, tuple[str, dict]] = CASES
    small: dict = SMALL
    # case -> the config.json keys its published checkpoints carry instead of transformers' own
    # (Kimi-K2's model_type kimi_k2 and auto_map on a DeepseekV3 model)
    published_as: ClassVar[dict[str, dict]] = {}

    def __init__(self, case: str, folder, **overrides) -> None:
        model_type, case_overrides = self.cases[case]
        torch.manual_seed(0)
        hf_cfg = transformers.AutoConfig.for_model(
            model_type, **{**self.small, **case_overrides, **overrides}
        )
        model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32)
        with torch.no_grad():
            for p in model.parameters():  # norm weights off 1 (gemma: off 0), biases off 0
                p.add_(0.1 * torch.randn_like(p))
            self.settle(model)
        self.model = model.eval()
        self.folder = folder
        model.save_pretrained(folder)
        if case in self.published_as:  # a model_type transformers has no class of its own for
            path = folder / "config.json"
            d = json.loads(path.read_text())
            path.write_text(json.dumps(d | self.published_as[case]))
        self.cfg = graphllm.load_config(folder)
        self.weights: dict | None = None

    def settle(self, model) -> None:
        """Move what else the family keeps (buffers) off its initial value: the routers'
        correction biases (GLM-4.5, MiniMax-M2), so that they change which experts are chosen."""
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buf.copy_(0.05 * torch.randn_like(buf))

    def graph(self, seq_len: int = SEQ, past_len: int = 0, **build):
        wl = graphllm.Workload.with_dtype(
            batch=BATCH, seq_len=seq_len, past_len=past_len, dtype="fp32"
        )
        return graphllm.build_graph(self.cfg, wl, **build)

    def past_len(self, past: dict) -> int:
        """P of a step whose past is `past`: the longest cache is a full layer's, all P past
        positions (a window or chunk layer's rolls to fewer once P passes it)."""
        return max(v.shape[2] for v in past.values())

    def run(self, ids: np.ndarray, past: dict | None = None, **build) -> dict[str, np.ndarray]:
        g = self.graph(ids.shape[1], 0 if past is None else self.past_len(past), **build)
        if self.weights is None:
            self.weights = load_weights(g, self.folder)
        return run_graph(g, self.weights, ids, past)

    @torch.no_grad()
    def hf(self, ids: np.ndarray, past=None):
        return self.model(torch.from_numpy(ids), cache=past, use_cache=True)


def presents(out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A step's KV cache outputs, to feed the next step as its past."""
    return {k: v for k, v in out.items() if k.startswith("present.")}
