"""The one flat, normalised model config the builder reads.

`graphllm.models.config` turns HF config.json / YAML / presets into this; every derived field
(head_dim, the block's layout, the per-layer attention, RoPE and FFN kinds, the checkpoint's module
names) is resolved there, so the builder reads these fields and never a family's name.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, get_args, get_origin, get_type_hints

from graphllm.errors import ConfigError

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

# the attention a layer can have (ModelConfig.layer_types), each one the builder implements; a
# new kind (chunked, linear attention, a state-space layer) joins here and in the builder together,
# while NoPE is not a kind but a layer without RoPE (rope_layers)
LAYER_TYPES = ("full_attention", "sliding_attention")


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

    def __post_init__(self) -> None:
        names = [n for n in self.norms().values() if n is not None]
        for name in names:
            if not isinstance(name, str) or not name:
                raise ConfigError(f"block: a norm's name must be a non-empty string, got {name!r}")
        twice = next((n for n in names if names.count(n) > 1), None)
        if twice is not None:
            raise ConfigError(f"block: two norms are both named {twice!r}")

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


# ModelConfig's fields that are records of their own
_RECORDS = {"rope": RopeConfig, "block": BlockLayout, "moe_names": MoENames}


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
    # the softmax scale; None: head_dim ** -0.5 (MLA with yarn multiplies in mscale^2)
    attention_scale: float | None = None
    # DeepSeek-V3's multi-token-prediction layers, kept out of the main model unless the builder
    # is asked for them (build_graph(..., mtp=True)); True where MTP depth k's block is MoE
    num_nextn_predict_layers: int = 0
    mtp_moe_layers: tuple[bool, ...] = ()

    def __post_init__(self) -> None:
        for name, record in _RECORDS.items():
            value = getattr(self, name)
            if not isinstance(value, record):
                raise ConfigError(f"{name} must be a {record.__name__}, got {type(value).__name__}")
        n = self.num_hidden_layers
        for name, default in {"layer_types": LAYER_TYPES[0], "moe_layers": False}.items():
            if not getattr(self, name):  # frozen: filled once, at construction
                object.__setattr__(self, name, (default,) * n)
        for name in ("layer_types", "moe_layers", "rope_layers"):
            value = getattr(self, name)
            if value and len(value) != n:
                raise ConfigError(f"{name} has {len(value)} entries for {n} hidden layers")
        bad = [t for t in self.layer_types if t not in LAYER_TYPES]
        if bad:
            raise ConfigError(
                f"layer_types has {bad[0]!r}; graphllm models {', '.join(LAYER_TYPES)}"
            )
        if self.is_mla and not all(self.rope_layers):
            raise ConfigError("rope_layers: an MLA layer always rotates its RoPE part (no NoPE)")
        self._check_combinations()

    def _check_combinations(self) -> None:
        """Fields each valid alone that together would build another model than they say."""
        if "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise ConfigError(
                "layer_types has sliding_attention layers but sliding_window is unset"
            )
        if any(self.moe_layers) and self.num_experts == 0:
            raise ConfigError("moe_layers marks MoE layers but num_experts is 0")
        h, kv = self.num_attention_heads, self.num_key_value_heads
        if kv and h % kv:
            raise ConfigError(f"{h} attention heads are not a multiple of {kv} key/value heads")
        if self.mtp_moe_layers and len(self.mtp_moe_layers) != self.num_nextn_predict_layers:
            raise ConfigError(
                f"mtp_moe_layers has {len(self.mtp_moe_layers)} entries for "
                f"{self.num_nextn_predict_layers} multi-token-prediction layers"
            )

    def with_layers(self, n: int) -> ModelConfig:
        """The same model cut to its first n layers (its per-layer fields cut with it)."""
        return replace(
            self,
            num_hidden_layers=n,
            layer_types=self.layer_types[:n],
            moe_layers=self.moe_layers[:n],
            rope_layers=self.rope_layers[:n],
        )

    def rotates(self, i: int) -> bool:
        """Whether layer i's attention applies RoPE to q and k (False: a NoPE layer)."""
        return not self.rope_layers or self.rope_layers[i]

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


def config_from_fields(d: Any) -> ModelConfig:
    """A ModelConfig from `dataclasses.asdict`'s dict of it, read back from JSON (lists become
    tuples again, the nested records are rebuilt). Every field is checked against its type, and
    sizes against their range, since the dict comes from a file graphllm did not necessarily
    write: an unknown, missing or mistyped field is a ConfigError naming it."""
    kw = _typed_fields(ModelConfig, d, "config")
    for name in _POSITIVE:
        if kw[name] < 1:
            raise ConfigError(f"config {name} must be a positive integer, got {kw[name]}")
    return ModelConfig(**kw)


# sizes a model cannot have zero of (num_key_value_heads 0 would divide by zero in the builder)
_POSITIVE = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)


def _typed_fields(record: type, d: Any, where: str) -> dict[str, Any]:
    """`record`'s constructor arguments from `d`, each checked against its annotation."""
    if not isinstance(d, dict):
        raise ConfigError(f"{where} must be a mapping, got {_kind(d)}")
    hints = get_type_hints(record)
    known = {f.name: f for f in fields(record)}
    unknown = sorted(set(d) - set(known), key=str)
    if unknown:
        raise ConfigError(
            f"unknown {where} field {_short(unknown[0])} (written by another graphllm?)"
        )
    missing = [n for n, f in known.items() if n not in d and _required(f)]
    if missing:
        raise ConfigError(f"{where} has no field {missing[0]!r}")
    return {k: _typed(f"{where} {k}", v, hints[k]) for k, v in d.items()}


def _required(f: Any) -> bool:
    return f.default is MISSING and f.default_factory is MISSING


def _typed(where: str, v: Any, hint: Any) -> Any:
    """`v` as a value of type `hint` (a JSON list for a tuple, a mapping for a record)."""
    if hint in _RECORDS.values():
        return hint(**_typed_fields(hint, v, where))
    args = get_args(hint)
    if type(None) in args:  # X | None
        return None if v is None else _typed(where, v, next(a for a in args if a is not None))
    if get_origin(hint) is tuple:
        if not isinstance(v, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {_kind(v)}")
        return tuple(_typed(f"{where}[{i}]", x, args[0]) for i, x in enumerate(v))
    if hint is str and isinstance(v, str) and len(v) > MAX_STRING:
        raise ConfigError(f"{where} is a string of {len(v):,} characters (at most {MAX_STRING:,})")
    if _is_a(v, hint):
        return float(v) if hint is float else v
    raise ConfigError(f"{where} must be {_NAMES.get(hint, str(hint))}, got {_kind(v)}")


MAX_STRING = 1024  # a name or a norm's module name; far more is a hostile file, not a model
_NAMES = {int: "a non-negative integer", float: "a finite number", bool: "true or false"}
_NAMES[str] = "a string"


def _is_a(v: Any, hint: Any) -> bool:
    if hint is bool or isinstance(v, bool):  # bool is an int: `true` for a size is a mistake
        return hint is bool and isinstance(v, bool)
    if hint is int:
        return isinstance(v, int) and v >= 0
    if hint is float:
        return isinstance(v, (int, float)) and math.isfinite(v)
    return hint is str and isinstance(v, str)


def _kind(v: Any) -> str:
    return f"{_short(v)} ({type(v).__name__})"


def _short(v: Any, limit: int = 40) -> str:
    """repr(v) cut to `limit` characters: a hostile value is never echoed whole."""
    if isinstance(v, (dict, list, tuple)):
        text = f"a {type(v).__name__} of {len(v)}"
    elif isinstance(v, int) and abs(v) > 10**30:
        text = "an integer of {} digits".format(len(str(abs(v))) if abs(v) < 10**4000 else "4000+")
    else:
        text = repr(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."
