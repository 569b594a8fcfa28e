"""Tiny configs, as a config.json spells them, that several test modules build."""

# a device spec file's fields, with made-up figures in the ranges real devices have
HARDWARE_SPEC = {
    "name": "mine",
    "peak_flops": {"bf16": 100e12, "fp32": 10e12},
    "memory_bandwidth": 1e12,
    "memory_bytes": 24e9,
    "interconnect_bandwidth": 32e9,
    "network_bandwidth": None,
    "devices_per_node": 4,
    "source": "made up",
}

# a two-layer GQA llama as ModelConfig's own fields (what ONNX metadata carries)
MODEL_CONFIG_FIELDS = {
    "name": "tiny",
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 48,
}

LLAMA = {
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
}

# MLA with q down/up projections, grouped sigmoid routing, one dense layer first
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "kv_lora_rank": 16,
    "q_lora_rank": 24,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "first_k_dense_replace": 1,
}

# issue 18: GLM-4.5 in small: partial rotate-half RoPE, QKV bias, per-head q/k norms, a dense
# first layer, DeepSeek-V3's grouped sigmoid routing with a shared expert, one MTP layer
GLM4_MOE = {
    "model_type": "glm4_moe",
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 4,
    "topk_group": 2,
    "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1,
    "attention_bias": True,
    "use_qk_norm": True,
    "num_nextn_predict_layers": 1,
}
# issue 18: MiniMax-M2 in small: q/k norms over the projection, rotary_dim 8 of 16
MINIMAX_M2 = {
    "model_type": "minimax_m2",
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rotary_dim": 8,
    "intermediate_size": 32,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
# issue 18: Kimi-K2's published model_type on DeepSeek-V3's fields (one group, 2.827)
KIMI_K2 = {
    **DEEPSEEK_V3,
    "model_type": "kimi_k2",
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.827,
}

# issue 18: Llama 4's MoE in small, interleaved as Maverick's (layers 1 and 3 route, 0 and 2
# dense): top 1 of 4 experts, its sigmoid weight on the expert's input, the fused expert
# tensors, a shared expert; chunked RoPE layers and NoPE ones with their temperature
LLAMA4_MOE = {
    **LLAMA,
    "model_type": "llama4_text",
    "num_hidden_layers": 4,
    "head_dim": 8,
    "intermediate_size": 24,
    "intermediate_size_mlp": 40,
    "num_local_experts": 4,
    "num_experts_per_tok": 1,
    "interleave_moe_layer_step": 2,
    "no_rope_layer_interval": 2,
    "attention_chunk_size": 3,
    "floor_scale": 2,
    "attn_scale": 0.5,
}

# issue 18: gpt-oss's block: sinks, a window-4 layer then a full one, biased router and experts
# (E, in, out), a clamp that bites
GPT_OSS = {
    "model_type": "gpt_oss",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "sliding_window": 4,
    "max_position_embeddings": 256,
    "swiglu_limit": 0.5,
}

# Phi-4-mini's rotary in small: RoPE on half of each head, longrope whose short factors serve an
# 8-token prefill and whose long ones take over once a position passes 16
PARTIAL_LONGROPE = {
    "partial_rotary_factor": 0.5,
    "original_max_position_embeddings": 16,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0, 1.3, 1.7, 2.1],
        "long_factor": [1.5, 3.0, 6.5, 11.0],
    },
}
