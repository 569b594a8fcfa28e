"""issue 19: tiny transformers NemotronH models with random weights (the `tiny_nemotron` fixture),
saved with save_pretrained (which writes NVIDIA's checkpoint names, backbone.*, one tensor per
expert), and graphllm's config and weights for each."""

from __future__ import annotations

from tests.support.tiny_models import BATCH, SEQ, TinyModel

__all__ = ["BATCH", "CASES", "SEQ", "SMALL", "TinyNemotron"]

SMALL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 256,
    # Mamba2: 8 heads of 4 channels in 2 groups, a state of 8, chunks of 4 under the 8-token
    # prompt (two chunks; 11 tokens: a padded third)
    "mamba_num_heads": 8,
    "mamba_head_dim": 4,
    "ssm_state_size": 8,
    "n_groups": 2,
    "conv_kernel": 4,
    "chunk_size": 4,
    # the chunked scan clamps dt below at 0.001 (transformers >= 5.25 reads time_step_limit; the
    # published configs leave it at [0, Infinity], where the clamp never bites)
    "time_step_limit": [0.001, float("inf")],
    # MoE: top 2 of 8 relu^2 experts with a shared one, scaled
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "moe_shared_expert_intermediate_size": 24,
    "routed_scaling_factor": 1.5,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
CASES: dict[str, tuple[str, dict]] = {
    # every layer kind but Mamba2: NoPE attention, the relu^2 MLP, the MoE
    "attention-mlp-moe": ("nemotron_h", {"hybrid_override_pattern": "*-E*E"}),
    # Nemotron-H's every layer kind, Mamba2 first and last, a conv bias (use_conv_bias)
    "hybrid": ("nemotron_h", {"hybrid_override_pattern": "M*-EM"}),
    # two Mamba2 layers (and an attention layer: transformers cannot cache Mamba layers alone),
    # in_proj / out_proj biased (use_bias) and the conv without one
    "mamba-bias": (
        "nemotron_h",
        {"hybrid_override_pattern": "MM*", "use_bias": True, "use_conv_bias": False},
    ),
}


class TinyNemotron(TinyModel):
    cases = CASES
    small = SMALL

    def settle(self, model) -> None:
        super().settle(model)  # the routers' correction biases off 0
        # every other Mamba head's dt below time_step_limit's 0.001: the chunked scan's clamp bites
        for name, param in model.named_parameters():
            if name.endswith("mixer.dt_bias"):
                param[::2] = -8.0

    def past_len(self, past: dict) -> int:
        # an attention layer's cache's (a state has no length)
        keys = [v for k, v in past.items() if k.endswith(".key")]
        return keys[0].shape[2] if keys else 0
