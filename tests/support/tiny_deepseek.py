"""Tiny transformers DeepseekV2/DeepseekV3 models with random weights (the `tiny_deepseek`
fixture): V2-Lite's and V2's shapes, V3's routing with and without rope_interleave, and V2 with
norm_topk_prob."""

from __future__ import annotations

from typing import ClassVar

import torch

from tests.support.tiny_models import BATCH, SEQ, TinyModel

__all__ = ["BATCH", "CASES", "RENORM", "SEQ", "SMALL", "TinyDeepSeek"]

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
    # issue 18: Kimi-K2's routing (one group, routed_scaling_factor 2.827) and yarn on a
    # DeepseekV3 model, its config.json relabelled as Moonshot publishes it (KIMI)
    "kimi-k2": (
        "deepseek_v3",
        {
            "q_lora_rank": 24,
            "n_group": 1,
            "topk_group": 1,
            "routed_scaling_factor": 2.827,
            "rope_parameters": {**YARN, "beta_fast": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0},
        },
    ),
}
# what Kimi-K2's config.json says in place of transformers' deepseek_v3
KIMI = {
    "model_type": "kimi_k2",
    "auto_map": {
        "AutoConfig": "configuration_deepseek.DeepseekV3Config",
        "AutoModel": "modeling_deepseek.DeepseekV3Model",
        "AutoModelForCausalLM": "modeling_deepseek.DeepseekV3ForCausalLM",
    },
}

# DeepSeek-V2 with norm_topk_prob: DeepSeek's modeling_deepseek.py renormalises the top-k weights
# instead of scaling them; transformers ignores the flag (its routing is patched in the test)
RENORM = {
    "v2-norm-topk": (
        "deepseek_v2",
        {"q_lora_rank": None, "norm_topk_prob": True, "routed_scaling_factor": 2.0},
    )
}


class TinyDeepSeek(TinyModel):
    cases = CASES | RENORM
    small = SMALL
    published_as: ClassVar[dict[str, dict]] = {"kimi-k2": KIMI}

    def settle(self, model) -> None:
        for name, buf in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # nonzero, so it changes choices
                buf.copy_(0.05 * torch.randn_like(buf))
