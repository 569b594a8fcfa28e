"""What a model family is (`Family`: its fields, aliases, derived values, layer pattern, routing),
the multimodal wrapper of a text decoder, and the window and MoE layouts several families share.
The families themselves live in graphllm/models/families/, one module each."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from graphllm.errors import ConfigError
from graphllm.models.fields import Spec, malformed
from graphllm.models.model_config import BlockLayout, RopeConfig
from graphllm.models.rope import mscale

# the attention kinds a family's layer pattern resolves to (ModelConfig.layer_types)
FULL, SLIDING = "full_attention", "sliding_attention"
CHUNKED = "chunked_attention"  # Llama 4
LINEAR = "linear_attention"  # Qwen3-Next's Gated DeltaNet
SILU = {"silu": "silu", "swish": "silu"}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


# ---------------------------------------------------------------------------------------------
# Layouts several families share. Each takes the checked field values `v` (defaults filled in).


def attention_bias(v: dict) -> dict:
    return {"qkv_bias": v["attention_bias"], "o_bias": v["attention_bias"]}


def active_window(v: dict, on: bool) -> int | None:
    """The window when sliding attention is switched on, else None."""
    if not on or v["sliding_window"] is None:
        if on and "use_sliding_window" in v:
            raise ConfigError("use_sliding_window is true but sliding_window is null")
        return None
    if v["sliding_window"] < 1:
        raise malformed(
            "sliding_window", "positive when sliding attention is on", v["sliding_window"]
        )
    return v["sliding_window"]


def no_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    return (FULL,) * v["num_hidden_layers"], None


def every_layer_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # mistral, mixtral, phi3, qwen3_moe: one mask for all layers, sliding when a window is set
    w = active_window(v, v.get("use_sliding_window", True))
    return ((SLIDING if w else FULL),) * v["num_hidden_layers"], w


def every_layer_routes(v: dict) -> dict:
    """Mixtral's MoE layout, which gpt-oss keeps: every layer routes over num_local_experts
    experts as wide as intermediate_size, and no layer has a dense MLP."""
    return {
        "num_experts": v["num_local_experts"],
        "num_experts_per_tok": v["num_experts_per_tok"],
        "moe_intermediate_size": v["intermediate_size"],
        "intermediate_size": 0,
        "moe_layers": (True,) * v["num_hidden_layers"],
    }


def mla_attention_scale(rope: RopeConfig, qk_head_dim: int) -> float:
    """qk_head_dim ** -0.5, times yarn's mscale(factor, mscale_all_dim) squared (as
    transformers' yarn_apply_mscale does for any scaled RoPE)."""

    scale = qk_head_dim**-0.5
    if rope.type != "default" and rope.mscale_all_dim:
        scale *= mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


@dataclass(frozen=True)
class Family:
    """What one model_type accepts and how it maps onto ModelConfig."""

    fields: dict[str, Spec]
    # ModelConfig fields fixed by the family or derived from `v` (biases, norms, fused weights)
    derive: Callable[[dict], dict]
    windows: Callable[[dict], tuple[tuple[str, ...], int | None]] = no_window
    # whether the transformers model reads `layer_types` (else a given one must match the rule)
    reads_layer_types: bool = False
    moe: Callable[[dict], dict] | None = None
    acts: dict[str, str] = field(default_factory=lambda: dict(SILU))
    rope_types: tuple[str, ...] = ROPE_TYPES
    default_theta: float = 10000.0
    # other spellings of a field, mapped to the name in `fields`: transformers' attribute_map and
    # the legacy names published files still carry; a config giving two spellings of one field
    # loads when they agree and is refused naming both when they do not
    aliases: dict[str, str] = field(default_factory=dict)
    noop_only: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    # MLA families derive the attention shape themselves (head_dim = nope + rope widths)
    mla: bool = False
    # the block's norms and residuals (every family here: Llama's two pre-norms, sequential)
    block: BlockLayout = field(default_factory=BlockLayout)
    # whether the transformers model rotates only partial_rotary_factor of each head (phi3;
    # llama, qwen, mistral, gemma and deepseek ignore the field, so it is refused there)
    partial_rotary: bool = False
    # RoPE on the sliding-window layers only, the full-attention ones NoPE (Cohere 2)
    rope_on_sliding_only: bool = False
    # the config field the model reads its activation from (Gemma 2/3: hidden_activation)
    act_field: str = "hidden_act"
    # a RoPE per layer type (Gemma 3): transformers-5 rope_parameters keyed by full_attention /
    # sliding_attention, or rope_theta + rope_scaling for the full layers and
    # rope_local_base_freq for the sliding ones
    rope_by_layer_type: bool = False
    # the attention kinds a given `layer_types` may name (the ones transformers' model builds)
    layer_kinds: tuple[str, ...] = (FULL, SLIDING)
    # the features of a config, from its raw values, that graphllm does not model: each a
    # phrase joined into the one line that names every unmodelled field (Llama 4's MoE layers)
    unmodelled: Callable[[dict], list[str]] | None = None
    # why `--mtp` is refused for a family whose checkpoints hold MTP weights that
    # graphllm does not model yet (Qwen3-Next's mtp.*); empty: the generic reason
    mtp_refusal: str = ""
    # the partial_rotary_factor a config that gives none has (Qwen3NextConfig's 0.25)
    default_partial_rotary: float | None = None
    # the checked values normalised before anything reads them (Nemotron-H's layer
    # pattern, given as a string or a list, into the one list and the layer count)
    prepare: Callable[[dict], dict] | None = None
    # onnxruntime-genai's model type for this model_type (`--format genai` writes it into
    # genai_config.json), as its builder spells it; None: onnxruntime-genai 0.18 loads none (each
    # one given is checked: `Model(DIR)` takes it, an unknown one is refused "Unsupported
    # model_type"). Its types are decoder-only LLMs all run by one model class.
    genai_type: str | None = None


def global_every(
    mt: str, every: int | None = None, why: str = ""
) -> Callable[[dict], tuple[tuple[str, ...], int | None]]:
    """Windows for a family whose layers slide but every `every`-th (else the config's
    sliding_window_pattern-th) is global, as Gemma 2 (every 2nd, the even ones slide), Gemma 3,
    Cohere 2 (sliding_window_pattern) and gpt-oss (every 2nd) derive them without layer_types."""

    def windows(v: dict) -> tuple[tuple[str, ...], int | None]:
        if v["sliding_window"] is None:
            raise ConfigError(f"sliding_window null is not modelled for {mt}{why}")
        w = active_window(v, True)
        n, k = v["num_hidden_layers"], every or v["sliding_window_pattern"]
        return tuple(SLIDING if (i + 1) % k else FULL for i in range(n)), w

    return windows


@dataclass(frozen=True)
class Multimodal:
    """A multimodal model_type that loads as its text decoder (its text_config); the reports say
    that only the text decoder is modelled."""

    text: str  # the text decoder's model_type
    # the keys of the parts graphllm does not model: the vision tower, the projector, the image
    # tokens
    parts: frozenset[str]
    # where the checkpoint keeps those parts (transformers 5's and 4's spellings): a text-decoder
    # load knows these tensors and leaves them unread, and says so; a tensor in neither the text
    # decoder nor these is refused
    unused: tuple[str, ...]
