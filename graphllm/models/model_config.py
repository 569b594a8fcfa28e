"""The one flat, normalised model config the builder reads.

`graphllm.models.config` turns HF config.json / YAML / presets into this; every derived field
(head_dim, the block's layout, the per-layer attention, RoPE and FFN kinds, the checkpoint's module
names) is resolved there, so the builder reads these fields and never a family's name.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from graphllm.echo import shown
from graphllm.errors import ConfigError
from graphllm.models.parse import describe
from graphllm.models.quantization import Quantization, quantization_from_fields

# the attention a layer can have (ModelConfig.layer_types), each one the builder implements; a
# new kind (chunked, linear attention, a state-space layer) joins here and in the builder together,
# while NoPE is not a kind but a layer without RoPE (rope_layers)
LAYER_TYPES = (
    "full_attention",
    "sliding_attention",
    # Llama 4: attention inside fixed blocks of attention_chunk_size absolute positions
    "chunked_attention",
    # Qwen3-Next: Gated DeltaNet, a causal conv and a gated delta-rule recurrence; its
    # layer carries a conv state and a recurrent state instead of keys and values
    "linear_attention",
    # Nemotron-H: a Mamba2 mixer (a selective state-space scan) in place of attention
    "mamba2",
)
# what one decoder layer holds (ModelConfig.layer_blocks): "both" the token mixer and
# the FFN (every attention family), or one of them alone with its own pre-norm and residual
# (Nemotron-H: a Mamba2, attention, MLP or MoE layer each)
LAYER_BLOCKS = ("both", "mixer", "ffn")


# Sanity limits on a model's sizes: a config past one is a mistake or an attack, refused in one
# line before anything is built. Each is far above the largest published model's figure, given
# with it. The layer limit is also the graph's price: a layer adds at most 66 nodes (DeepSeek-V3's
# MLA and MoE), so 1024 layers build and analyse in a few seconds, where a million took hours.
SIZE_LIMITS: dict[str, tuple[int, str]] = {
    "num_hidden_layers": (
        1024,
        "the deepest published decoders have about 128: Llama 3.1 405B has 126",
    ),
    "num_nextn_predict_layers": (64, "DeepSeek-V3 predicts 1 token ahead"),
    "num_attention_heads": (4096, "published models have at most 128"),
    "num_key_value_heads": (4096, "published models have at most 128"),
    "head_dim": (4096, "published heads are at most 256 wide"),
    "hidden_size": (1 << 17, "the widest published models have 16384 to 18432"),
    "intermediate_size": (1 << 20, "the widest published FFN, PaLM's, has 73728"),
    "moe_intermediate_size": (1 << 20, "the widest published FFN, PaLM's, has 73728"),
    "shared_expert_intermediate_size": (1 << 20, "the widest published FFN, PaLM's, has 73728"),
    "vocab_size": (1 << 22, "the largest published vocabularies have 262144 tokens"),
    "num_experts": (1 << 14, "published MoE models have at most 384 experts"),
    "n_shared_experts": (256, "published MoE models have at most 2 shared experts"),
    "max_position_embeddings": (1 << 27, "the longest published context is 10M tokens"),
}
# aliases of a field in HF configs share its limit
SIZE_LIMITS |= {
    "num_local_experts": SIZE_LIMITS["num_experts"],
    "n_routed_experts": SIZE_LIMITS["num_experts"],
    "num_mtp_layers": SIZE_LIMITS["num_nextn_predict_layers"],
}
MAX_SIZE = 1 << 27  # any other size or count: far above any model's


def size_limit(name: str) -> tuple[int, str]:
    """The most a size field `name` (its last dotted part) may be, and why."""
    return SIZE_LIMITS.get(name.rsplit(".", 1)[-1], (MAX_SIZE, "far above any model's"))


def check_size(name: str, value: Any, least: int = 1) -> int:
    """`value` as an integer size field `name`: an int (not a bool) from `least` to its limit."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        want = {0: "a non-negative integer", 1: "a positive integer"}.get(
            least, f"at least {least}"
        )
        raise ConfigError(f"{name} must be {want}, got {describe(value)}")
    limit, why = size_limit(name)
    if value > limit:
        raise ConfigError(f"{name} is {shown(value, 40)}; graphllm takes at most {limit:,} ({why})")
    return value


def check_number(name: str, value: Any, low: float, high: float) -> float:
    """`value` as a finite number in [low, high] (an int or float, not a bool)."""
    # an int is finite, though math.isfinite overflows on one past a float's range
    finite = isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))
    if isinstance(value, bool) or not finite:
        raise ConfigError(f"{name} must be a finite number, got {describe(value)}")
    if not low <= value <= high:
        raise ConfigError(f"{name} must be in [{low:g}, {high:g}], got {shown(value, 40)}")
    return float(value)


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
    # longrope (Phi-3.5, Phi-4-mini): per rotated pair, the divisor of its frequency when the
    # largest position of a forward call is below original_max_position_embeddings (short) or
    # not (long); attention_factor then scales cos and sin
    short_factor: tuple[float, ...] = ()
    long_factor: tuple[float, ...] = ()


@dataclass(frozen=True)
class BlockLayout:
    """How a decoder block wraps its two sub-layers (attention, then the FFN) in norms.

    Each norm is named as the checkpoint names it; None: there is none in that place. A pre-norm
    normalises the sub-layer's input, a post-norm its output before the residual add. Llama has
    the two pre-norms (the defaults), OLMo 2 the two post-norms, Gemma 2/3 all four.
    Sequential: h = x + attn(x); out = h + ffn(h). Parallel: both sub-layers read the block's
    input, out = x + attn(x) + ffn(x), and an FFN without a pre-norm of its own reads the
    attention's normalised input (Cohere's one input_layernorm).
    """

    attention_pre: str | None = "input_layernorm"
    attention_post: str | None = None
    ffn_pre: str | None = "post_attention_layernorm"
    ffn_post: str | None = None
    parallel: bool = False
    # a layer holds its mixer or its FFN, not both (ModelConfig.layer_blocks), so the
    # mixer's norms and the FFN's may share a name (Nemotron-H's one `norm` per layer)
    one_sublayer: bool = False

    def __post_init__(self) -> None:
        names = [n for n in self.norms().values() if n is not None]
        if self.one_sublayer:
            names = list(dict.fromkeys(names))
        for name in names:
            if not isinstance(name, str) or not name:
                raise ConfigError(
                    f"block: a norm's name must be a non-empty string, got {shown(name, 40)}"
                )
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ConfigError(f"block: two norms are both named {shown(twice, 40)}")

    def norms(self) -> dict[str, str | None]:
        """Each place ('attention_pre', ...) and the name of the norm there (None: none)."""
        return {
            "attention_pre": self.attention_pre,
            "attention_post": self.attention_post,
            "ffn_pre": self.ffn_pre,
            "ffn_post": self.ffn_post,
        }


@dataclass(frozen=True)
class MoENames:
    """The checkpoint's module names of a layer's MoE block (Qwen2/3-MoE's by default).

    Mixtral's block is `block_sparse_moe` with experts w1, w3, w2; DeepSeek's fused shared
    experts are `shared_experts`.
    """

    block: str = "mlp"  # model.layers.{i}.<block>
    router: str = "gate"  # <block>.<router>: the router's linear
    # <block>.experts.{e}.<name>: each routed expert's gate, up and down projections
    expert_gate: str = "gate_proj"
    expert_up: str = "up_proj"
    expert_down: str = "down_proj"
    shared: str = "shared_expert"  # <block>.<shared>: the shared expert's MLP
    shared_gate: str = "shared_expert_gate"  # <block>.<shared_gate>: its sigmoid gate's linear
    # where noaux_tc's e_score_correction_bias is stored under <block>; empty: on the
    # router (<router>.e_score_correction_bias: DeepSeek-V3, GLM-4.5); MiniMax-M2 keeps it on
    # the block itself
    correction_bias: str = ""


# ModelConfig's fields that are records of their own
_RECORDS = {
    "rope": RopeConfig,
    "block": BlockLayout,
    "moe_names": MoENames,
    "sliding_rope": RopeConfig,
}
_OPTIONAL_RECORDS = ("sliding_rope",)


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
    # what qk_norm normalises over: 'head' (each head's head_dim channels, one weight for all
    # heads: Qwen3), 'each_head' (the same, each head its own weight: Cohere) or 'projection'
    # (the whole q / k projection, heads * head_dim, before the head split: OLMo 2)
    qk_norm_scope: str = "head"
    # the norm every norm of the model is: 'rmsnorm', or 'layernorm' (mean-centred, a weight and
    # no bias: Cohere); rms_norm_eps is its epsilon either way
    norm_type: str = "rmsnorm"
    norm_weight_offset: float = 0.0  # gemma: x * (1 + w)
    embedding_multiplier: float = 1.0  # gemma: sqrt(hidden_size)
    fused_qkv: bool = False  # phi3: one qkv_proj weight
    fused_gate_up: bool = False  # phi3: one gate_up_proj weight
    # where each block's norms sit and whether its sub-layers run side by side
    block: BlockLayout = field(default_factory=BlockLayout)
    # one of LAYER_TYPES per layer (empty: every layer full attention)
    layer_types: tuple[str, ...] = ()
    # per layer: whether its attention rotates q and k (False: a NoPE layer); empty: every layer
    # does. A config cut to fewer layers: with_layers(n)
    rope_layers: tuple[bool, ...] = ()
    sliding_window: int | None = None
    # MoE; num_experts == 0 means dense everywhere
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # the top-k weights are renormalised to sum to 1
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = False
    # True where layer i has an MoE FFN, one per layer (empty: every layer dense)
    moe_layers: tuple[bool, ...] = ()
    moe_names: MoENames = field(default_factory=MoENames)
    # routing: scores 'softmax' | 'sigmoid'; selection 'greedy' | 'group_limited_greedy' (groups
    # ranked by their best score) | 'noaux_tc' (sigmoid scores plus a stored
    # e_score_correction_bias pick the experts, groups ranked by their two best; the unbiased
    # scores weight them); Mixtral and Qwen: softmax, greedy. Routed weights are multiplied by
    # routed_scaling_factor, unless renorm_replaces_scaling and they were renormalised:
    # DeepSeek-V2 with norm_topk_prob and top-k > 1 renormalises the weights *instead of*
    # scaling them (its modeling_deepseek.py MoEGate; transformers' DeepseekV2 ignores the flag)
    scoring_func: str = "softmax"
    topk_method: str = "greedy"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    renorm_replaces_scaling: bool = False
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
    # the leading channels of each query/key head that RoPE rotates, the rest passed through
    # (partial_rotary_factor: Phi-4-mini rotates 96 of 128); 0: the whole head
    rotary_dim: int = 0
    # the softmax scale; None: head_dim ** -0.5 (MLA with yarn multiplies in mscale^2)
    attention_scale: float | None = None
    # DeepSeek-V3's multi-token-prediction layers, kept out of the main model unless the builder
    # is asked for them (build_graph(..., mtp=True)); True where MTP depth k's block is MoE
    num_nextn_predict_layers: int = 0
    mtp_moe_layers: tuple[bool, ...] = ()
    # granite's muP: each sub-layer's output times residual_multiplier before its residual add;
    # the LM head's output times logits_multiplier (granite: 1 / logits_scaling; Cohere's
    # logit_scale). Visible as mul_const nodes where they are not 1
    residual_multiplier: float = 1.0
    logits_multiplier: float = 1.0
    # Gemma 2: the attention scores (after the scale, before the mask) and the final
    # logits each through cap * tanh(x / cap), visible as softcap nodes; None: no cap
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    # Gemma 3: the RoPE of the sliding-window layers where it is not `rope` (Gemma 3's
    # local layers rotate with rope_local_base_freq and no scaling); None: every layer `rope`
    sliding_rope: RopeConfig | None = None
    # the model_type of the multimodal model whose text decoder this is (a `gemma3` config's
    # text_config); its vision tower and projector are not modelled, and reports say so
    text_decoder_of: str = ""
    # Llama 4: a chunked_attention layer's queries see the keys of their own chunk of
    # attention_chunk_size absolute positions (s // C == t // C) and none after them
    attention_chunk_size: int | None = None
    # Llama 4's use_qk_norm: on RoPE layers, q and k through a weightless L2 norm
    # x / sqrt(mean(x^2) + rms_norm_eps) after RoPE (l2norm nodes)
    qk_l2_norm: bool = False
    # Llama 4's attention temperature on NoPE layers: each query times
    # log(floor((i + 1) / floor_scale) + 1) * attn_scale + 1, i its absolute position index;
    # floor_scale 0: none
    temperature_floor_scale: int = 0
    temperature_attn_scale: float = 0.0
    # the dense FFN's module name: model.layers.{i}.<mlp_name> (Llama 4: feed_forward)
    mlp_name: str = "mlp"
    # Llama 4's Llama4TextMoe: each routed expert's input is scaled by its router
    # weight (expert(w * x), summed over the chosen experts) instead of its output (w * expert(x));
    # the two differ because SwiGLU is not linear
    moe_weights_input: bool = False
    # Llama 4's Llama4TextExperts: the routed experts stored as two (E, in, out) tensors,
    # <block>.experts.gate_up_proj (E, d, 2 * moe_intermediate_size: gate then up) and
    # <block>.experts.down_proj (E, moe_intermediate_size, d), not one (out, in) matrix per expert
    fused_experts: bool = False
    # the checkpoint's quantization_config (how each weight is stored); None: every
    # tensor at the checkpoint's dtype
    quantization: Quantization | None = None
    # gpt-oss: a learned logit per query head (self_attn.sinks) joins each softmax
    # row and takes probability mass, with no value behind it
    attention_sinks: bool = False
    # the router's linear has a bias (gpt-oss's mlp.router.bias)
    router_bias: bool = False
    # the top-k is taken on the router's logits and the scoring (softmax) runs over the k
    # chosen ones (gpt-oss); False: scores over all experts, then the top-k
    topk_then_score: bool = False
    # the routed experts as gpt-oss stores them: one tensor per projection for all experts,
    # stacked (E, in, out), each with a bias (E, out), gate and up interleaved in gate_up_proj
    # (gate the even columns, up the odd ones)
    experts_stacked: bool = False
    # the experts' clamped SwiGLU (gpt-oss): gate clamped above and up on both sides at
    # swiglu_limit, (up + 1) * gate * sigmoid(swiglu_alpha * gate); None: act(gate) * up
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.702
    # the causal conv of a linear-attention or Mamba layer, its kernel K (the layer
    # carries its last K-1 inputs as its conv state); 0: no such layer
    conv_kernel: int = 0
    # Qwen3-Next's Gated DeltaNet (linear_attention layers): key heads (q and k) and
    # value heads (v, z, the decay and beta), their widths, and the chunk of the prefill's
    # chunked form (transformers' torch_chunk_gated_delta_rule: 64)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_chunk_size: int = 64
    # Qwen3-Next's gated attention: q_proj writes a query and a gate per head
    # (interleaved per head), and the attention output is times sigmoid(gate) before o_proj
    attn_output_gate: bool = False
    # how a checkpoint lays out its MTP layers. "layers": DeepSeek-V3's and GLM-4.5's
    # model.layers.{n+k-1} with their own embedding, enorm/hnorm, eh_proj and shared_head;
    # "mtp": Qwen3-Next's mtp.fc, mtp.pre_fc_norm_embedding/hidden, mtp.layers.{k-1}, mtp.norm,
    # the main model's embedding and lm_head shared (vLLM's qwen3_next_mtp.py)
    mtp_layout: str = "layers"
    # Nemotron-H. Per layer one of LAYER_BLOCKS (empty: every layer "both")
    layer_blocks: tuple[str, ...] = ()
    # module names as the checkpoint has them: <layers_prefix>.{i}.<attention_name>, the
    # embedding table's and the final norm's (Nemotron-H, as transformers 5 saves it too:
    # backbone.layers.{i}.mixer, backbone.embeddings, backbone.norm_f)
    layers_prefix: str = "model.layers"
    attention_name: str = "self_attn"
    embedding_name: str = "model.embed_tokens"
    final_norm_name: str = "model.norm"
    # the MLP, the shared expert and the routed experts gated, down(act(gate(x)) * up(x));
    # False: down(act(up(x))) (Nemotron-H's relu^2 MLP and NemotronHExperts)
    mlp_gated: bool = True
    # a mamba2 layer's mixer: mamba_num_heads heads of mamba_head_dim channels, a state of
    # ssm_state_size per channel, B and C shared by the heads of each of mamba_n_groups groups,
    # a depthwise causal conv of conv_kernel taps (with a bias when mamba_conv_bias) over
    # x, B and C; the chunked scan runs in chunks of mamba_chunk_size and clamps dt below at
    # mamba_dt_min (transformers' time_step_limit of its torch path); in_proj and out_proj
    # biased when mamba_proj_bias
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    mamba_n_groups: int = 0
    mamba_chunk_size: int = 0
    mamba_conv_bias: bool = False
    mamba_proj_bias: bool = False
    mamba_dt_min: float = 0.0

    def __post_init__(self) -> None:
        if self.quantization is not None and not isinstance(self.quantization, Quantization):
            raise ConfigError(
                f"quantization must be a Quantization, got {type(self.quantization).__name__}"
            )
        for name, record in _RECORDS.items():
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_RECORDS:
                continue
            if not isinstance(value, record):
                raise ConfigError(f"{name} must be a {record.__name__}, got {type(value).__name__}")
        self._check_kinds()
        self._check_sizes()  # before the per-layer tuples below are made num_hidden_layers long
        n = self.num_hidden_layers
        for name, default in {"layer_types": LAYER_TYPES[0], "moe_layers": False}.items():
            if not getattr(self, name):  # frozen: filled once, at construction
                object.__setattr__(self, name, (default,) * n)
        for name in ("layer_types", "moe_layers", "rope_layers", "layer_blocks"):
            value = getattr(self, name)
            if value and len(value) != n:
                raise ConfigError(f"{name} has {len(value)} entries for {n} hidden layers")
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        if bad:
            raise ConfigError(
                f"layer_types has {bad[0]!r}; graphllm models {', '.join(LAYER_TYPES)}"
            )
        bad = [t for t in self.layer_blocks if t not in LAYER_BLOCKS]
        if bad:
            raise ConfigError(
                f"layer_blocks has {shown(bad[0], 40)}; graphllm models {', '.join(LAYER_BLOCKS)}"
            )
        if self.is_mla and not all(self.rope_layers):
            raise ConfigError("rope_layers: an MLA layer always rotates its RoPE part (no NoPE)")
        self._check_combinations()

    def _check_kinds(self) -> None:
        """Strings, flags and per-layer tuples of the types the builder reads (a config read back
        from an ONNX file's metadata was written by anyone)."""
        for name in ("name", "model_type", "text_decoder_of"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ConfigError(f"{name} must be a string, got {shown(value, 40)}")
            if len(value) > MAX_NAME_CHARS:  # it titles every report and diagram
                raise ConfigError(
                    f"{name} is a string of {len(value):,} characters; graphllm takes at most "
                    f"{MAX_NAME_CHARS}"
                )
        ropes = {"rope.type": self.rope, "sliding_rope.type": self.sliding_rope}
        for name, allowed in _CHOICES.items():
            if name in ropes and ropes[name] is None:
                continue
            value = ropes[name].type if name in ropes else getattr(self, name)  # type: ignore[union-attr]
            if not isinstance(value, str) or value not in allowed:
                raise ConfigError(
                    f"{name} must be one of {', '.join(allowed)}, got {shown(value, 40)}"
                )
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"{name} must be true or false, got {shown(getattr(self, name), 40)}"
                )
        for name in ("layer_types", "moe_layers", "rope_layers", "mtp_moe_layers", "layer_blocks"):
            if not isinstance(getattr(self, name), tuple):
                raise ConfigError(f"{name} must be a list, got {shown(getattr(self, name), 40)}")

    def _check_sizes(self) -> None:
        """Each size a positive (or, where 0 means none, non-negative) int within its limit,
        each float finite and in a sane range."""
        for name in _POSITIVE:
            check_size(name, getattr(self, name))
        for name in _NON_NEGATIVE:
            check_size(name, getattr(self, name), least=0)
        if self.sliding_window is not None:
            check_size("sliding_window", self.sliding_window)
        if self.attention_chunk_size is not None:
            check_size("attention_chunk_size", self.attention_chunk_size)
        check_size("temperature_floor_scale", self.temperature_floor_scale, least=0)
        check_number("temperature_attn_scale", self.temperature_attn_scale, -1e6, 1e6)
        check_number("rms_norm_eps", self.rms_norm_eps, 1e-30, 1.0)
        check_number("swiglu_alpha", self.swiglu_alpha, -1e6, 1e6)
        check_number("mamba_dt_min", self.mamba_dt_min, 0.0, 1e6)
        if self.swiglu_limit is not None:
            check_number("swiglu_limit", self.swiglu_limit, 1e-6, 1e6)
        check_number("rope.theta", self.rope.theta, 1.0, 1e15)
        if self.sliding_rope is not None:
            check_number("sliding_rope.theta", self.sliding_rope.theta, 1.0, 1e15)
        for name in (
            "norm_weight_offset",
            "embedding_multiplier",
            "routed_scaling_factor",
            "logits_multiplier",
            "residual_multiplier",
        ):
            check_number(name, getattr(self, name), -1e6, 1e6)
        if self.attention_scale is not None:
            check_number("attention_scale", self.attention_scale, 1e-6, 1e6)
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), 1e-6, 1e6)

    def _check_combinations(self) -> None:
        """Fields each valid alone that together would build another model than they say."""
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ConfigError(
                "layer_types has sliding_attention layers but sliding_window is unset"
            )
        if "chunked_attention" in self.layer_types and self.attention_chunk_size is None:
            raise ConfigError(
                "layer_types has chunked_attention layers but attention_chunk_size is unset"
            )
        if not isinstance(self.mlp_name, str) or not self.mlp_name:
            raise ConfigError(
                f"mlp_name must be a non-empty string, got {shown(self.mlp_name, 40)}"
            )
        # the q/k norms are the model's own kind: per head with its own weights for LayerNorm
        # (Cohere), shared by the heads or over the projection for RMSNorm (Qwen3, OLMo 2)
        if self.qk_norm and (self.qk_norm_scope == "each_head") != (self.norm_type == "layernorm"):
            raise ConfigError(
                f"qk_norm_scope {self.qk_norm_scope!r} is not modelled with norm_type "
                f"{self.norm_type!r} ('each_head' goes with 'layernorm')"
            )
        if self.norm_type != "rmsnorm" and (self.is_mla or self.norm_weight_offset):
            raise ConfigError(
                f"norm_type {self.norm_type!r} is not modelled with latent attention or a norm "
                "weight offset"
            )
        if any(self.moe_layers) and self.num_experts == 0:
            raise ConfigError("moe_layers marks MoE layers but num_experts is 0")
        h, kv = self.num_attention_heads, self.num_key_value_heads
        if kv and h % kv:
            raise ConfigError(f"{h} attention heads are not a multiple of {kv} key/value heads")
        self._check_rope()
        self._check_linear_attention()
        self._check_mamba()
        if self.mtp_moe_layers and len(self.mtp_moe_layers) != self.num_nextn_predict_layers:
            raise ConfigError(
                f"mtp_moe_layers has {len(self.mtp_moe_layers)} entries for "
                f"{self.num_nextn_predict_layers} multi-token-prediction layers"
            )

    def _check_rope(self) -> None:
        """The rotated channels, longrope's per-channel factors and a second (sliding) RoPE."""
        rot = self.rotary_dim or self.head_dim
        if self.rotary_dim and (self.rotary_dim % 2 or self.rotary_dim > self.head_dim):
            raise ConfigError(
                f"rotary_dim {self.rotary_dim} must be even and at most head_dim {self.head_dim}"
            )
        for where, rope in (("rope", self.rope), ("sliding_rope", self.sliding_rope)):
            if rope is None or rope.type != "longrope":
                continue
            for name in ("short_factor", "long_factor"):
                got = len(getattr(rope, name))
                if got != rot // 2:
                    raise ConfigError(
                        f"{where}.{name} has {got} entries; the {rot} rotated channels need "
                        f"{rot // 2}"
                    )
        if self.sliding_rope is not None and (self.is_mla or self.rope_layout != "half"):
            raise ConfigError(
                "sliding_rope is modelled with rotate-half RoPE and standard attention only"
            )

    def _check_linear_attention(self) -> None:
        """The heads, widths and convolution a linear_attention layer needs."""
        if "linear_attention" not in self.layer_types:
            return
        k, v = self.linear_num_key_heads, self.linear_num_value_heads
        widths = (self.linear_key_head_dim, self.linear_value_head_dim, self.conv_kernel)
        if not (k and v and all(widths)):
            raise ConfigError(
                "layer_types has linear_attention layers but the linear heads, their "
                "widths or conv_kernel are unset"
            )
        if v % k:
            raise ConfigError(f"{v} linear value heads are not a multiple of {k} key heads")

    def _check_mamba(self) -> None:
        """the Mamba2 sizes a mamba2 layer needs, and the names every layer reads."""
        for name in ("layers_prefix", "attention_name", "embedding_name", "final_norm_name"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(
                    f"{name} must be a non-empty string, got {shown(getattr(self, name), 40)}"
                )
        if "mamba2" not in self.layer_types:
            return
        sizes = ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "mamba_n_groups")
        missing = [k for k in (*sizes, "conv_kernel", "mamba_chunk_size") if not getattr(self, k)]
        if missing:
            raise ConfigError(f"layer_types has mamba2 layers but {', '.join(missing)} unset")
        if self.mamba_num_heads % self.mamba_n_groups:
            raise ConfigError(
                f"mamba_num_heads {self.mamba_num_heads} is not a multiple of n_groups "
                f"{self.mamba_n_groups}"
            )

    def layer_block(self, i: int) -> str:
        """What layer i holds: one of LAYER_BLOCKS (the MTP layers after the main model: both)."""
        if not self.layer_blocks or i >= self.num_hidden_layers:
            return LAYER_BLOCKS[0]
        return self.layer_blocks[i]

    @property
    def mamba_inner(self) -> int:
        """The Mamba2 mixer's width: its heads times their channels (transformers 5's
        intermediate_size; `expand` is not read)."""
        return self.mamba_num_heads * self.mamba_head_dim

    def with_layers(self, n: int) -> ModelConfig:
        """The same model cut to its first n layers (its per-layer fields cut with it)."""
        return replace(
            self,
            num_hidden_layers=n,
            layer_types=self.layer_types[:n],
            moe_layers=self.moe_layers[:n],
            rope_layers=self.rope_layers[:n],
            layer_blocks=self.layer_blocks[:n],
        )

    def rope_of(self, i: int) -> RopeConfig:
        """The RoPE layer i rotates with (a sliding layer's own where the model has one)."""
        if self.sliding_rope is not None and self.layer_type(i) == "sliding_attention":
            return self.sliding_rope
        return self.rope

    def rotates(self, i: int) -> bool:
        """Whether layer i's attention applies RoPE to q and k (False: a NoPE layer)."""
        return not self.rope_layers or i >= self.num_hidden_layers or self.rope_layers[i]

    def layer_type(self, i: int) -> str:
        """Layer i's attention (one of LAYER_TYPES). The multi-token-prediction layers after the
        main model (i >= num_hidden_layers) attend fully with RoPE, as the engines that run
        DeepSeek-V3's and GLM-4.5's MTP layers build them."""
        return self.layer_types[i] if i < self.num_hidden_layers else LAYER_TYPES[0]

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


MAX_NAME_CHARS = 256
_CHOICES = {
    "hidden_act": ("silu", "gelu_tanh", "relu2"),
    "scoring_func": ("softmax", "sigmoid"),
    "topk_method": ("greedy", "group_limited_greedy", "noaux_tc"),
    "rope_layout": ("half", "complex", "interleave"),
    "qk_norm_scope": ("head", "each_head", "projection"),
    "norm_type": ("rmsnorm", "layernorm"),
    "rope.type": ("default", "linear", "llama3", "yarn", "longrope"),
    "sliding_rope.type": ("default", "linear", "llama3", "yarn", "longrope"),
}
_FLAGS = (
    "tie_word_embeddings",
    "qkv_bias",
    "o_bias",
    "mlp_bias",
    "qk_norm",
    "fused_qkv",
    "fused_gate_up",
    "norm_topk_prob",
    "shared_expert_gate",
    "renorm_replaces_scaling",
    "qk_l2_norm",
    "moe_weights_input",
    "fused_experts",
    # gpt-oss
    "attention_sinks",
    "router_bias",
    "topk_then_score",
    "experts_stacked",
    # Qwen3-Next
    "attn_output_gate",
    # Nemotron-H
    "mlp_gated",
    "mamba_conv_bias",
    "mamba_proj_bias",
)
_POSITIVE = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "n_group",
    "topk_group",
    "linear_chunk_size",
)
_NON_NEGATIVE = (
    "intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "num_nextn_predict_layers",
    "rotary_dim",
    # linear-attention and Mamba layers
    "conv_kernel",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    # Nemotron-H's Mamba2 sizes (0: no mamba2 layer)
    "mamba_num_heads",
    "mamba_head_dim",
    "ssm_state_size",
    "mamba_n_groups",
    "mamba_chunk_size",
)


def config_from_fields(d: dict[str, Any]) -> ModelConfig:
    """A ModelConfig from `dataclasses.asdict`'s dict of it, read back from JSON (lists become
    tuples again, the nested records are rebuilt); an unknown, missing or mistyped field is a
    ConfigError."""
    if not isinstance(d, dict):
        raise ConfigError(f"config fields must be a mapping, got {shown(d, 40)}")
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted((k for k in d if k not in known), key=str)
    if unknown:
        raise ConfigError(
            f"unknown config field {shown(unknown[0])} (written by another graphllm?)"
        )
    required = [f.name for f in fields(ModelConfig) if f.default is f.default_factory is MISSING]
    missing = [k for k in required if k not in d]
    if missing:
        raise ConfigError(f"config field {missing[0]!r} is missing")
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
    for name, record in _RECORDS.items():
        if isinstance(kw.get(name), dict):
            kw[name] = _record(name, record, kw[name])
    if "quantization" in kw:
        kw["quantization"] = quantization_from_fields(d["quantization"])
    return ModelConfig(**kw)


def _record(name: str, record: type, values: dict) -> Any:
    """One nested record (rope, block, moe_names) from its fields."""
    allowed = {f.name for f in fields(record)}
    unknown = sorted((k for k in values if k not in allowed), key=str)
    if unknown:
        raise ConfigError(f"unknown config field {name}.{shown(unknown[0])}")
    # JSON gives lists where the record holds tuples (longrope's factors)
    return record(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})
