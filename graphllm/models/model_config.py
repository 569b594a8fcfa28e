"""The one flat, normalised model config the builder reads.

`graphllm.config` turns HF config.json / YAML / presets into this; every derived field (head_dim, the
per-layer attention and FFN kinds) is resolved there, so the builder never looks at family quirks
except through these fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FAMILIES = (
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "phi3",
    "deepseek_v2",
    "deepseek_v3",
)


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: base theta plus an optional frequency scaling rule."""

    theta: float = 10000.0
    # 'default' | 'linear' | 'llama3' | 'yarn'
    type: str = "default"
    factor: float = 1.0
    # llama3
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int | None = None
    # yarn
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class ModelConfig:
    """A decoder-only LLM, normalised across families. Sizes are exact integers."""

    name: str
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int  # width of the dense gated MLP (0 when no layer is dense)
    hidden_act: str = "silu"  # 'silu' | 'gelu_tanh'
    rms_norm_eps: float = 1e-6
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False  # per-head RMSNorm on q and k (qwen3)
    norm_weight_offset: float = 0.0  # gemma: x * (1 + w)
    embedding_multiplier: float = 1.0  # gemma: sqrt(hidden_size)
    fused_qkv: bool = False  # phi3: one qkv_proj weight
    fused_gate_up: bool = False  # phi3: one gate_up_proj weight
    # 'full_attention' | 'sliding_attention', one per layer
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    # MoE; num_experts == 0 means dense everywhere
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    # True where layer i has an MoE FFN, one per layer
    moe_layers: tuple[bool, ...] = ()
    # the HF module layout of the MoE block: 'mixtral' (block_sparse_moe, w1/w2/w3) or 'qwen'
    moe_naming: str = "qwen"
    # DeepSeek routing: scores 'softmax' | 'sigmoid'; selection 'greedy' | 'group_limited_greedy'
    # (groups ranked by their best score) | 'noaux_tc' (sigmoid scores plus a stored
    # e_score_correction_bias pick the experts, groups ranked by their two best; the unbiased
    # scores weight them); routed weights are multiplied by routed_scaling_factor. DeepSeek-V2
    # with norm_topk_prob and top-k > 1 renormalises the weights *instead of* scaling them (its
    # modeling_deepseek.py MoEGate; transformers' DeepseekV2 ignores the flag)
    scoring_func: str = "softmax"
    topk_method: str = "greedy"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    # MLA (DeepSeek-V2/V3 latent attention); kv_lora_rank == 0 means standard attention.
    # head_dim is then the query/key head width qk_nope_head_dim + qk_rope_head_dim
    q_lora_rank: int = 0  # 0: one q_proj
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # how RoPE pairs channels: 'half' (x_i with x_{i+d/2}); 'complex' (pairs (x_2i, x_2i+1),
    # written back interleaved: DeepSeek-V2); 'interleave' (same pairs, written back as all
    # first-of-pair then all second-of-pair: DeepSeek-V3's rope_interleave)
    rope_layout: str = "half"
    # the softmax scale; None: head_dim ** -0.5 (MLA with yarn multiplies in mscale^2)
    attention_scale: float | None = None
    # DeepSeek-V3's multi-token-prediction layers, kept out of the main model unless the builder
    # is asked for them (build_graph(..., mtp=True)); True where MTP depth k's block is MoE
    num_nextn_predict_layers: int = 0
    mtp_moe_layers: tuple[bool, ...] = ()

    @property
    def n_rep(self) -> int:
        """Query heads per KV head (GQA group size)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0 and any(self.moe_layers)
