"""issue 16: published Llama 4 configs the llama4_text tests load."""

from __future__ import annotations

# Llama-4-Scout-17B-16E's published text_config (huggingface.co/meta-llama/Llama-4-Scout-17B-16E,
# config.json, as transformers 4.51.0 prints it in a public notes file found with the code
# search; `moe_layers` there abbreviated "0..47"), every key as published
SCOUT_TEXT = {
    "attention_bias": False,
    "attention_chunk_size": 8192,
    "attention_dropout": 0.0,
    "attn_scale": 0.1,
    "attn_temperature_tuning": 4,
    "bos_token_id": 200000,
    "eos_token_id": [200001, 200007, 200008],
    "floor_scale": 8192,
    "for_llm_compressor": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 5120,
    "initializer_range": 0.02,
    "interleave_moe_layer_step": 1,
    "intermediate_size": 8192,
    "intermediate_size_mlp": 16384,
    "max_position_embeddings": 262144,
    "model_type": "llama4_text",
    "moe_layers": list(range(48)),
    "no_rope_layers": [1, 1, 1, 0] * 12,
    "num_attention_heads": 40,
    "num_experts_per_tok": 1,
    "num_hidden_layers": 48,
    "num_key_value_heads": 8,
    "num_local_experts": 16,
    "output_router_logits": False,
    "pad_token_id": 200018,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "factor": 8.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "rope_theta": 500000.0,
    "router_aux_loss_coef": 0.001,
    "router_jitter_noise": 0.0,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_qk_norm": True,
    "vocab_size": 202048,
}
# the 10M-context Scout's RoPE as other public copies of its config.json carry it (factor 16,
# low and high band factors both 1: no band between, which transformers warns of and computes)
SCOUT_10M_ROPE = {
    "factor": 16.0,
    "high_freq_factor": 1.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
