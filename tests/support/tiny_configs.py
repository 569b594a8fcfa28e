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
