"""Load a model config (HF config.json, YAML, preset name or dict) into a normalised ModelConfig.

The semantics follow transformers 5.x's own config and modeling code for each family: which
biases exist, the defaults, how `layer_types` is derived, what a MoE layer is. Both the
transformers-4 spelling (`rope_theta` + `rope_scaling`, `torch_dtype`) and the transformers-5 one
(`rope_parameters`, `dtype`, `layer_types`) load to the same ModelConfig.

Every problem raises ConfigError with one line naming the field. Nothing that changes the
computation is silently ignored: an unknown key, or a known feature graphllm does not model
(logit soft-capping, ...), is an error; all of a config's such fields are named in one line.
"""

from __future__ import annotations

import difflib
import json
import math
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from graphllm.echo import SHOWN_CHARS, cut, shown, shown_path
from graphllm.errors import ConfigError
from graphllm.files import note_input
from graphllm.models.folder import folder_member
from graphllm.models.model_config import (
    FAMILIES,
    BlockLayout,
    ModelConfig,
    MoENames,
    RopeConfig,
    check_number,
    check_size,
    size_limit,
)
from graphllm.models.parse import file_mode, read_mapping
from graphllm.models.quantization import Quantization, parse_quantization
from graphllm.models.rope import mscale
from graphllm.models.workload import Workload

PRESETS_DIR = Path(__file__).parent / "presets"
FULL, SLIDING = "full_attention", "sliding_attention"
CHUNKED = "chunked_attention"  # issue 16: Llama 4

# model_type of a multimodal model -> (its text decoder's model_type, the keys of its parts that
# graphllm does not model: the vision tower, the projector, the image tokens). Such a config
# loads as its text_config, and the reports say that only the text decoder is modelled
MULTIMODAL: dict[str, tuple[str, frozenset[str]]] = {
    "gemma3": (
        "gemma3_text",
        frozenset(
            {
                "vision_config", "mm_tokens_per_image", "boi_token_index", "eoi_token_index",
                "image_token_index", "image_token_id", "boi_token_id", "eoi_token_id",
            }
        ),
    ),
    # issue 18: Llama4Config (Llama-4-Scout/Maverick's published config.json): its text_config
    # is a Llama4ForCausalLM inside Llama4ForConditionalGeneration (language_model.*)
    "llama4": (
        "llama4_text",
        frozenset(
            {
                "vision_config", "boi_token_index", "eoi_token_index", "image_token_index",
                "image_token_id", "boi_token_id", "eoi_token_id",
            }
        ),
    ),
}  # fmt: skip

# model_type of a multimodal model -> where its checkpoint keeps the parts graphllm does not model
# (transformers 5's and 4's spellings): a text-decoder load knows these tensors and leaves them
# unread, and says so; a tensor in neither the text decoder nor these is refused
MULTIMODAL_UNUSED: dict[str, tuple[str, ...]] = {
    "gemma3": (
        "model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
        "multi_modal_projector.",
    ),
    # Llama4ForConditionalGeneration keeps vision_model and multi_modal_projector at the top
    # level (the Hub's Scout/Maverick index: vision_model.*, multi_modal_projector.linear_1.*)
    "llama4": (
        "vision_model.", "multi_modal_projector.", "model.vision_model.",
        "model.multi_modal_projector.",
    ),
}  # fmt: skip

NOT_SUPPORTED = {
    "deepseek": "DeepSeek-MoE v1 is not planned; DeepSeek-V2/V3 are on the roadmap",
    # issue 19: the other Mamba2 hybrids reuse Nemotron-H's mixer and come later
    "falcon_h1": "Falcon-H1 (attention and Mamba2 side by side in every layer) is not modelled "
    "yet; nemotron_h's Mamba2 layers are",
    "granitemoehybrid": "Granite 4.0's hybrid (Mamba2 with MoE) is not modelled yet; "
    "nemotron_h's Mamba2 layers are",
}

# Keys that never change the forward computation: provenance, token ids, training-only knobs
# (dropout, aux losses, router jitter), task heads, output flags and the generation defaults that
# transformers-4's `to_dict()` writes into every config. Their values are not inspected.
BOOKKEEPING = frozenset(
    {
        # provenance and storage
        "_name_or_path", "_commit_hash", "_attn_implementation", "_attn_implementation_autoset",
        "architectures", "auto_map", "transformers_version", "model_name", "dtype", "torch_dtype",
        "use_bfloat16", "quantization_config", "tokenizer_class", "torchscript", "tf_legacy_loss",
        # token ids
        "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
        # training only
        "initializer_range", "attention_dropout", "resid_pdrop", "embd_pdrop", "use_cache",
        "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
        # task heads and outputs
        "id2label", "label2id", "problem_type", "finetuning_task", "task_specific_params",
        "output_hidden_states", "output_attentions", "return_dict", "is_decoder",
        # splitting the FFN over the sequence is mathematically the same computation
        "chunk_size_feed_forward",
        # DeepSeek: training losses, and the expert-parallel degree they were trained with
        "aux_loss_alpha", "seq_aux", "ep_size",
        # graphllm's own notes in a preset file, so that a copy of one loads as a config
        "_source", "_note", "_aliases",
        # generation defaults
        "max_length", "min_length", "do_sample", "early_stopping", "num_beams", "num_beam_groups",
        "diversity_penalty", "temperature", "top_k", "top_p", "typical_p", "repetition_penalty",
        "length_penalty", "no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "bad_words_ids",
        "num_return_sequences", "output_scores", "return_dict_in_generate", "prefix",
        "forced_bos_token_id", "forced_eos_token_id", "remove_invalid_values",
        "exponential_decay_length_penalty", "suppress_tokens", "begin_suppress_tokens",
    }
)  # fmt: skip

# Features that change the computation: accepted only at their no-op value.
NOOP_ONLY: dict[str, tuple[Any, ...]] = {
    "pretraining_tp": (1, None),
    "partial_rotary_factor": (1.0, None),
    "attn_logit_softcapping": (None,),
    "final_logit_softcapping": (None,),
    "use_bidirectional_attention": (False, None),
    "use_mrope": (False,),
    "is_encoder_decoder": (False,),
    "add_cross_attention": (False,),
    "tie_encoder_decoder": (False,),
    "cross_attention_hidden_size": (None,),
    "pruned_heads": ({},),
}


# ---------------------------------------------------------------------------------------------
# Field kinds: each checks one value and returns it normalised, or raises naming the field.


def _describe(v: Any) -> str:
    return f"{shown(v, 40)} ({type(v).__name__})"


def _show(v: Any) -> str:
    """A value as the config file spells it (JSON), falling back to repr; shortened."""
    if isinstance(v, str):
        return cut(json.dumps(v[:SHOWN_CHARS]), SHOWN_CHARS) + (
            "..." if len(v) > SHOWN_CHARS else ""
        )
    if v is None or isinstance(v, (bool, float)) or (isinstance(v, int) and v.bit_length() < 64):
        return json.dumps(v)
    return shown(v)


def _bad(name: str, want: str, v: Any) -> ConfigError:
    return ConfigError(f"{name} must be {want}, got {_describe(v)}")


def _is_int(v: Any) -> bool:
    # bool is an int subclass in Python; `true` for a size is a mistake, not a 1
    return isinstance(v, int) and not isinstance(v, bool)


def _pos_int(name: str, v: Any) -> int:
    return check_size(name, v)


def _nonneg_int(name: str, v: Any) -> int:
    return check_size(name, v, least=0)


# the sane range of a float field (by its last dotted part); others take _FLOAT_RANGE
_FLOAT_RANGES = {
    "rms_norm_eps": (1e-30, 1.0),  # a guard against 0 / 0: above 1 it outweighs the activations
    "rope_theta": (1.0, 1e15),  # published bases are 1e4 to 1e8; below 1 no RoPE was trained
    "rope_local_base_freq": (1.0, 1e15),
}
_FLOAT_RANGE = (1e-6, 1e6)  # RoPE scaling factors, routing scales: published ones are 0.1 to 40


def _pos_float(name: str, v: Any) -> float:
    if not (_is_int(v) or isinstance(v, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise _bad(name, "a positive number", v)
    if v <= 0:
        raise _bad(name, "a positive number", v)
    low, high = _FLOAT_RANGES.get(name.rsplit(".", 1)[-1], _FLOAT_RANGE)
    return check_number(name, v, low, high)


def _bool(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise _bad(name, "true or false", v)
    return v


def _str(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise _bad(name, "a string", v)
    return v


def _mapping(name: str, v: Any) -> dict:
    if not isinstance(v, dict):
        raise _bad(name, "a mapping", v)
    return v


def _int_list(name: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not all(_is_int(x) and x >= 0 for x in v):
        raise _bad(name, "a list of non-negative integers", v)
    return v


def _float_list(name: str, v: Any) -> tuple[float, ...]:
    if not isinstance(v, list) or not v:
        raise _bad(name, "a non-empty list of positive numbers", v)
    return tuple(_pos_float(f"{name}[{i}]", x) for i, x in enumerate(v))


def _json_float(x: Any) -> Any:
    """transformers >= 5 writes a non-finite float of a config as {"__float__": "Infinity"}
    (JSON has no Infinity); the plain number otherwise."""
    if (
        isinstance(x, dict)
        and set(x) == {"__float__"}
        and x["__float__"] in ("Infinity", "-Infinity")
    ):
        return float(x["__float__"].replace("Infinity", "inf"))
    return x


def _dt_limit(name: str, v: Any) -> tuple[float, float]:
    """Mamba2's dt_limit: [low, high] with 0 <= low < high."""
    if isinstance(v, (list, tuple)):
        v = [_json_float(x) for x in v]
    ok = isinstance(v, (list, tuple)) and len(v) == 2
    ok = ok and all(_is_int(x) or isinstance(x, float) for x in v)
    if not ok or math.isnan(v[0]) or math.isnan(v[1]) or not 0 <= v[0] < v[1]:
        raise _bad(name, "[low, high] with 0 <= low < high", v)
    if math.isinf(v[0]):
        raise _bad(name, "[low, high] with a finite low", v)
    return float(v[0]), float(v[1])  # a finite high: _nemotron_unmodelled names it


def _str_list(name: str, v: Any) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise _bad(name, "a list of strings", v)
    return v


_REQUIRED = object()  # no default: the config must give the field


@dataclass(frozen=True)
class Spec:
    """One accepted config field: its check, its default, and whether null means something."""

    check: Callable[[str, Any], Any]
    default: Any = _REQUIRED
    # null normally means "not given" (the default applies); for a nullable field null is a
    # value of its own (sliding_window: null switches the window off)
    nullable: bool = False


_COMMON: dict[str, Spec] = {
    "vocab_size": Spec(_pos_int),
    "hidden_size": Spec(_pos_int),
    "num_hidden_layers": Spec(_pos_int),
    "num_attention_heads": Spec(_pos_int),
    "num_key_value_heads": Spec(_pos_int),
    "intermediate_size": Spec(_pos_int),
    "head_dim": Spec(_pos_int, None),
    "hidden_act": Spec(_str, "silu"),
    "rms_norm_eps": Spec(_pos_float, 1e-6),
    "max_position_embeddings": Spec(_pos_int, 2048),
    "tie_word_embeddings": Spec(_bool, False),
    "rope_theta": Spec(_pos_float, None),
    "rope_scaling": Spec(_mapping, None),
    "rope_parameters": Spec(_mapping, None),
    "layer_types": Spec(_str_list, None),
}
_QWEN_WINDOW = {
    "use_sliding_window": Spec(_bool, False),
    "sliding_window": Spec(_nonneg_int, 4096, nullable=True),
    "max_window_layers": Spec(_nonneg_int, 28),
}
_QWEN_MOE = {
    "num_experts": Spec(_pos_int),
    "num_experts_per_tok": Spec(_pos_int),
    "moe_intermediate_size": Spec(_pos_int),
    "norm_topk_prob": Spec(_bool, False),
    "decoder_sparse_step": Spec(_pos_int, 1),
    "mlp_only_layers": Spec(_int_list, []),
    # only the dense layers (mlp_only_layers, decoder_sparse_step) read it
    "intermediate_size": Spec(_pos_int, None),
}

_SILU = {"silu": "silu", "swish": "silu"}
# Gemma's published `gelu` means the tanh approximation (transformers rewrites it so)
_GEMMA_ACTS = {**_SILU, "gelu": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
# Gemma 2/3 read hidden_activation through ACT2FN, where `gelu` is the exact GELU (only Gemma 1's
# config rewrites it to the tanh form): the tanh one is what graphllm models
_GEMMA2_ACTS = {"gelu_pytorch_tanh": "gelu_tanh"}
_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


# ---------------------------------------------------------------------------------------------
# Per-family rules. Each takes the checked field values `v` (defaults filled in).


def _attention_bias(v: dict) -> dict:
    return {"qkv_bias": v["attention_bias"], "o_bias": v["attention_bias"]}


def _gemma(v: dict) -> dict:
    # transformers 4.4x read `hidden_activation` and 5.x reads `hidden_act`: they must agree
    act = v["hidden_activation"]
    if act is not None and _GEMMA_ACTS.get(act) != _GEMMA_ACTS.get(v["hidden_act"]):
        raise ConfigError(
            f"hidden_activation {shown(act)} disagrees with hidden_act {shown(v['hidden_act'])}; "
            "give one gelu-tanh activation"
        )
    return _attention_bias(v) | {
        "norm_weight_offset": 1.0,  # RMSNorm scales by (1 + w)
        "embedding_multiplier": v["hidden_size"] ** 0.5,
    }


def _active_window(v: dict, on: bool) -> int | None:
    """The window when sliding attention is switched on, else None."""
    if not on or v["sliding_window"] is None:
        if on and "use_sliding_window" in v:
            raise ConfigError("use_sliding_window is true but sliding_window is null")
        return None
    if v["sliding_window"] < 1:
        raise _bad("sliding_window", "positive when sliding attention is on", v["sliding_window"])
    return v["sliding_window"]


def _no_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    return (FULL,) * v["num_hidden_layers"], None


def _every_layer_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # mistral, mixtral, phi3, qwen3_moe: one mask for all layers, sliding when a window is set
    w = _active_window(v, v.get("use_sliding_window", True))
    return ((SLIDING if w else FULL),) * v["num_hidden_layers"], w


def _qwen2_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # qwen2 / qwen3: the layers from max_window_layers on slide
    w = _active_window(v, v["use_sliding_window"])
    n, first = v["num_hidden_layers"], v["max_window_layers"]
    return tuple(SLIDING if w and i >= first else FULL for i in range(n)), w


def _qwen2_moe_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # qwen2_moe (transformers 5): every other layer below max_window_layers slides
    w = _active_window(v, v["use_sliding_window"])
    n, last = v["num_hidden_layers"], v["max_window_layers"]
    return tuple(SLIDING if w and (i + 1) % 2 and i < last else FULL for i in range(n)), w


def _every_layer_routes(v: dict) -> dict:
    """Mixtral's MoE layout, which gpt-oss keeps: every layer routes over num_local_experts
    experts as wide as intermediate_size, and no layer has a dense MLP."""
    return {
        "num_experts": v["num_local_experts"],
        "num_experts_per_tok": v["num_experts_per_tok"],
        "moe_intermediate_size": v["intermediate_size"],
        "intermediate_size": 0,
        "moe_layers": (True,) * v["num_hidden_layers"],
    }


def _mixtral_moe(v: dict) -> dict:
    # every layer routes, and the top-k weights are always renormalised to sum to 1
    return _every_layer_routes(v) | {
        "norm_topk_prob": True,
        "moe_names": MoENames(
            block="block_sparse_moe", expert_gate="w1", expert_up="w3", expert_down="w2"
        ),
    }


def _qwen_moe(v: dict) -> dict:
    n, only, step = v["num_hidden_layers"], v["mlp_only_layers"], v["decoder_sparse_step"]
    if any(i >= n for i in only):
        bad = next(i for i in only if i >= n)
        raise ConfigError(f"mlp_only_layers names layer {bad} but num_hidden_layers is {n}")
    # the rule in Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer
    only = set(only)  # a long list scanned once per layer would take quadratic time
    moe = tuple(i not in only and (i + 1) % step == 0 for i in range(n))
    dense = [i for i, m in enumerate(moe) if not m]
    if dense and v["intermediate_size"] is None:
        raise ConfigError(f"intermediate_size is required: layers {dense[:4]} use a dense MLP")
    shared = v.get("shared_expert_intermediate_size", 0)
    return {
        "num_experts": v["num_experts"],
        "num_experts_per_tok": v["num_experts_per_tok"],
        "moe_intermediate_size": v["moe_intermediate_size"],
        "intermediate_size": v["intermediate_size"] if dense else 0,
        "norm_topk_prob": v["norm_topk_prob"],
        "shared_expert_intermediate_size": shared,
        "shared_expert_gate": shared > 0,  # a sigmoid(Linear(d, 1)) gate on the shared expert
        "moe_layers": moe,
    }


def _deepseek_fields(version: int) -> dict[str, Spec]:
    """DeepSeek-V2/V3 fields with transformers' defaults for each version."""
    v3 = version == 3
    return {
        "num_key_value_heads": Spec(_pos_int, None),  # MLA: one K/V per query head
        "head_dim": Spec(_pos_int, None),  # transformers writes qk_rope_head_dim here
        "qk_head_dim": Spec(_pos_int, None),  # transformers writes nope + rope here
        "max_position_embeddings": Spec(_pos_int, 4096 if v3 else 2048),
        "q_lora_rank": Spec(_pos_int, 1536, nullable=True),  # null: one q_proj
        "kv_lora_rank": Spec(_pos_int, 512),
        "qk_nope_head_dim": Spec(_pos_int, 128),
        "qk_rope_head_dim": Spec(_pos_int, 64),
        "v_head_dim": Spec(_pos_int, 128),
        "n_routed_experts": Spec(_pos_int, 256 if v3 else 64),
        "n_shared_experts": Spec(_nonneg_int, 1 if v3 else 2),
        "num_experts_per_tok": Spec(_pos_int, 8 if v3 else None),
        "moe_intermediate_size": Spec(_pos_int, 2048 if v3 else 1407),
        "first_k_dense_replace": Spec(_nonneg_int, 3 if v3 else 0),
        "moe_layer_freq": Spec(_pos_int, 1),
        "n_group": Spec(_pos_int, 8 if v3 else None),
        "topk_group": Spec(_pos_int, 4 if v3 else None),
        "topk_method": Spec(_str, "noaux_tc" if v3 else "greedy"),
        "scoring_func": Spec(_str, "sigmoid" if v3 else "softmax"),
        "routed_scaling_factor": Spec(_pos_float, 2.5 if v3 else 1.0),
        "norm_topk_prob": Spec(_bool, v3),
        **({"rope_interleave": Spec(_bool, True)} if v3 else {}),
        **({"num_nextn_predict_layers": Spec(_nonneg_int, 1)} if v3 else {}),
    }


# per version: (scoring_func, topk methods) as transformers' DeepseekV2/V3TopkRouter compute them
_DEEPSEEK_ROUTING = {
    2: ("softmax", ("greedy", "group_limited_greedy")),
    3: ("sigmoid", ("noaux_tc",)),
}


def _mla(v: dict, version: int) -> dict:
    """MLA attention fields; head_dim is the query/key head width nope + rope."""
    nope, rope, heads = v["qk_nope_head_dim"], v["qk_rope_head_dim"], v["num_attention_heads"]
    if v["num_key_value_heads"] not in (None, heads):
        raise ConfigError(
            f"num_key_value_heads {v['num_key_value_heads']} must equal num_attention_heads "
            f"{heads}: MLA expands one key and value per query head"
        )
    if v["head_dim"] not in (None, rope):
        raise ConfigError(f"head_dim {v['head_dim']} must equal qk_rope_head_dim {rope} (MLA)")
    if v["qk_head_dim"] not in (None, nope + rope):
        raise ConfigError(
            f"qk_head_dim {v['qk_head_dim']} must be qk_nope + qk_rope = {nope + rope}"
        )
    if rope % 2:
        raise ConfigError(f"qk_rope_head_dim {rope} must be even: RoPE rotates pairs of channels")
    layout = "complex" if version == 2 else ("interleave" if v["rope_interleave"] else "half")
    return {
        "q_lora_rank": v["q_lora_rank"] or 0,
        "kv_lora_rank": v["kv_lora_rank"],
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": v["v_head_dim"],
        "rope_layout": layout,
        "num_nextn_predict_layers": v.get("num_nextn_predict_layers", 0),
    }


def mla_attention_scale(rope: RopeConfig, qk_head_dim: int) -> float:
    """qk_head_dim ** -0.5, times yarn's mscale(factor, mscale_all_dim) squared (as
    transformers' yarn_apply_mscale does for any scaled RoPE)."""

    scale = qk_head_dim**-0.5
    if rope.type != "default" and rope.mscale_all_dim:
        scale *= mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


def _deepseek_moe(v: dict) -> dict:
    n, first, freq = v["num_hidden_layers"], v["first_k_dense_replace"], v["moe_layer_freq"]
    version = 3 if "rope_interleave" in v else 2
    scoring, methods = _DEEPSEEK_ROUTING[version]
    if v["scoring_func"] != scoring:
        raise ConfigError(
            f"scoring_func {shown(v['scoring_func'])} is not modelled for deepseek_v{version} "
            f"(transformers computes {scoring!r})"
        )
    method = v["topk_method"]
    if method not in methods:
        raise ConfigError(
            f"topk_method {shown(method)} is not modelled for deepseek_v{version} "
            f"(modelled: {', '.join(methods)})"
        )
    e, k = v["n_routed_experts"], v["num_experts_per_tok"]
    if k is None:
        raise ConfigError("missing required field 'num_experts_per_tok'")
    groups, top_groups = v["n_group"] or 1, v["topk_group"] or 1
    if method != "greedy":
        if v["n_group"] is None or v["topk_group"] is None:
            raise ConfigError(f"topk_method {method!r} needs n_group and topk_group")
        if e % groups:
            raise ConfigError(f"n_routed_experts {e} is not divisible by n_group {groups}")
        if top_groups > groups:
            raise ConfigError(f"topk_group {top_groups} exceeds n_group {groups}")
        if top_groups * (e // groups) < k:
            raise ConfigError(
                f"topk_group {top_groups} groups of {e // groups} experts hold fewer than "
                f"num_experts_per_tok {k}"
            )
        if method == "noaux_tc" and e // groups < 2:
            raise ConfigError("noaux_tc ranks groups by their two best experts: n_group too large")
    # DeepSeek's rule (transformers reads first_k_dense_replace alone; the same when freq is 1);
    # the multi-token-prediction layers n, n+1, ... follow it too (vLLM's DeepseekV2DecoderLayer)
    rule = [i >= first and i % freq == 0 for i in range(n + v.get("num_nextn_predict_layers", 0))]
    moe = tuple(rule[:n])
    # DeepSeek-V2's own MoEGate renormalises only top-k > 1 weights, and then does not scale them
    renorm = v.get("norm_topk_prob", False) and (version == 3 or k > 1)
    return {
        "num_experts": e,
        "num_experts_per_tok": k,
        "moe_intermediate_size": v["moe_intermediate_size"],
        "intermediate_size": v["intermediate_size"] if not all(moe) else 0,
        "norm_topk_prob": renorm,
        "shared_expert_intermediate_size": v["n_shared_experts"] * v["moe_intermediate_size"],
        "moe_layers": moe,
        "mtp_moe_layers": tuple(rule[n:]),
        "moe_names": MoENames(shared="shared_experts"),  # n_shared_experts fused into one MLP
        "renorm_replaces_scaling": version == 2,
        "scoring_func": scoring,
        "topk_method": method,
        "n_group": groups if method != "greedy" else 1,
        "topk_group": top_groups if method != "greedy" else 1,
        "routed_scaling_factor": v["routed_scaling_factor"],
    }


def _granite(v: dict) -> dict:
    # muP (GraniteModel / GraniteForCausalLM): the embeddings times embedding_multiplier, scores
    # times attention_multiplier (in place of 1/sqrt(d_h)), each sub-layer's output times
    # residual_multiplier, the logits divided by logits_scaling
    return _attention_bias(v) | {
        "mlp_bias": v["mlp_bias"],
        "embedding_multiplier": float(v["embedding_multiplier"]),
        "attention_scale": float(v["attention_multiplier"]),
        "residual_multiplier": float(v["residual_multiplier"]),
        "logits_multiplier": 1.0 / v["logits_scaling"],
    }


def _smollm3_rope_layers(v: dict) -> tuple[bool, ...]:
    """Per layer whether it rotates q and k, as SmolLM3Config says: no_rope_layers[i] is 1 for
    a RoPE layer and 0 for a NoPE one (at least one entry a layer; transformers reads the first
    num_hidden_layers), else every no_rope_layer_interval-th layer is NoPE."""
    n, given = v["num_hidden_layers"], v["no_rope_layers"]
    if given is None:
        step = v["no_rope_layer_interval"]
        return tuple((i + 1) % step != 0 for i in range(n))
    if len(given) < n:
        raise ConfigError(f"no_rope_layers has {len(given)} entries for {n} hidden layers")
    bad = next((x for x in given if x not in (0, 1)), None)
    if bad is not None:
        raise _bad("no_rope_layers", "a list of 0 (NoPE) and 1 (RoPE) per layer", bad)
    return tuple(x == 1 for x in given[:n])


def _smollm3_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # SmolLM3Config: with use_sliding_window, the NoPE layers slide and the RoPE ones attend fully
    w = _active_window(v, v["use_sliding_window"])
    rope = _smollm3_rope_layers(v)
    return tuple(SLIDING if w and not r else FULL for r in rope), w


def _smollm3(v: dict) -> dict:
    return _attention_bias(v) | {"mlp_bias": v["mlp_bias"], "rope_layers": _smollm3_rope_layers(v)}


@dataclass(frozen=True)
class Family:
    """What one model_type accepts and how it maps onto ModelConfig."""

    fields: dict[str, Spec]
    # ModelConfig fields fixed by the family or derived from `v` (biases, norms, fused weights)
    derive: Callable[[dict], dict]
    windows: Callable[[dict], tuple[tuple[str, ...], int | None]] = _no_window
    # whether the transformers model reads `layer_types` (else a given one must match the rule)
    reads_layer_types: bool = False
    moe: Callable[[dict], dict] | None = None
    acts: dict[str, str] = field(default_factory=lambda: dict(_SILU))
    rope_types: tuple[str, ...] = _ROPE_TYPES
    default_theta: float = 10000.0
    # other spellings of a field (transformers' attribute_map), mapped to the name in `fields`
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
    # issue 19: why `--mtp` is refused for a family whose checkpoints hold MTP weights that
    # graphllm does not model yet (Qwen3-Next's mtp.*); empty: the generic reason
    mtp_refusal: str = ""
    # issue 19: the partial_rotary_factor a config that gives none has (Qwen3NextConfig's 0.25)
    default_partial_rotary: float | None = None
    # issue 19: the checked values normalised before anything reads them (Nemotron-H's layer
    # pattern, given as a string or a list, into the one list and the layer count)
    prepare: Callable[[dict], dict] | None = None


def _fields(**extra: Spec) -> dict[str, Spec]:
    return {**_COMMON, **extra}


_MHA = Spec(_pos_int, None)  # llama, phi3: num_key_value_heads defaults to num_attention_heads

FAMILY_TABLE: dict[str, Family] = {
    "llama": Family(
        _fields(
            num_key_value_heads=_MHA, attention_bias=Spec(_bool, False), mlp_bias=Spec(_bool, False)
        ),
        derive=lambda v: _attention_bias(v) | {"mlp_bias": v["mlp_bias"]},
    ),
    "mistral": Family(
        _fields(
            max_position_embeddings=Spec(_pos_int, 131072),
            sliding_window=Spec(_nonneg_int, 4096, nullable=True),
        ),
        derive=lambda v: {},
        windows=_every_layer_window,
    ),
    "mixtral": Family(
        _fields(
            max_position_embeddings=Spec(_pos_int, 131072),
            rms_norm_eps=Spec(_pos_float, 1e-5),
            sliding_window=Spec(_nonneg_int, None, nullable=True),
            num_local_experts=Spec(_pos_int),
            num_experts_per_tok=Spec(_pos_int),
        ),
        derive=lambda v: {},
        windows=_every_layer_window,
        moe=_mixtral_moe,
        default_theta=1e6,
        aliases={"num_experts": "num_local_experts"},
    ),
    "qwen2": Family(
        _fields(max_position_embeddings=Spec(_pos_int, 32768), **_QWEN_WINDOW),
        derive=lambda v: {"qkv_bias": True},  # q/k/v always carry a bias, o_proj never
        windows=_qwen2_window,
        reads_layer_types=True,
    ),
    "qwen2_moe": Family(
        _fields(
            max_position_embeddings=Spec(_pos_int, 32768),
            qkv_bias=Spec(_bool, True),  # transformers 5 field; 4.x configs lack it and have bias
            shared_expert_intermediate_size=Spec(_pos_int),
            **_QWEN_WINDOW,
            **_QWEN_MOE,
        ),
        derive=lambda v: {"qkv_bias": v["qkv_bias"]},
        windows=_qwen2_moe_window,
        reads_layer_types=True,
        moe=_qwen_moe,
    ),
    "qwen3": Family(
        _fields(
            max_position_embeddings=Spec(_pos_int, 32768),
            head_dim=Spec(_pos_int, 128),
            attention_bias=Spec(_bool, False),
            **_QWEN_WINDOW,
        ),
        derive=lambda v: _attention_bias(v) | {"qk_norm": True},
        windows=_qwen2_window,
        reads_layer_types=True,
    ),
    "qwen3_moe": Family(
        _fields(
            max_position_embeddings=Spec(_pos_int, 32768),
            attention_bias=Spec(_bool, False),
            **_QWEN_WINDOW,
            **_QWEN_MOE,
        ),
        # max_window_layers is written by Qwen3-MoE checkpoints but transformers 5 ignores it
        derive=lambda v: _attention_bias(v) | {"qk_norm": True},
        windows=_every_layer_window,
        moe=_qwen_moe,
        aliases={"num_local_experts": "num_experts"},  # transformers 5 writes this spelling
    ),
    "gemma": Family(
        _fields(
            max_position_embeddings=Spec(_pos_int, 8192),
            head_dim=Spec(_pos_int, 256),
            hidden_act=Spec(_str, "gelu_pytorch_tanh"),
            hidden_activation=Spec(_str, None),
            tie_word_embeddings=Spec(_bool, True),
            attention_bias=Spec(_bool, False),
        ),
        derive=_gemma,
        acts=_GEMMA_ACTS,
    ),
    "deepseek_v2": Family(
        _fields(**_deepseek_fields(2)),
        derive=lambda v: _mla(v, 2),
        moe=_deepseek_moe,
        aliases={"num_experts": "n_routed_experts"},
        noop_only={"attention_bias": (False,), "mlp_bias": (False,)},
        mla=True,
    ),
    "deepseek_v3": Family(
        _fields(**_deepseek_fields(3)),
        derive=lambda v: _mla(v, 3),
        moe=_deepseek_moe,
        aliases={
            "num_local_experts": "n_routed_experts",
            "num_mtp_layers": "num_nextn_predict_layers",
        },
        noop_only={"attention_bias": (False,)},
        mla=True,
    ),
    "phi3": Family(
        _fields(
            num_key_value_heads=_MHA,
            max_position_embeddings=Spec(_pos_int, 4096),
            rms_norm_eps=Spec(_pos_float, 1e-5),
            sliding_window=Spec(_nonneg_int, None, nullable=True),
            # longrope's pre-scaling context (transformers prefers it to the rope section's)
            original_max_position_embeddings=Spec(_pos_int, 4096),
            partial_rotary_factor=Spec(_pos_float, None),  # Phi-4-mini: 0.75
        ),
        derive=lambda v: {"fused_qkv": True, "fused_gate_up": True},
        windows=_every_layer_window,
        rope_types=("default", "longrope"),  # transformers' phi3 knows only these
        partial_rotary=True,
        noop_only={
            "attention_bias": (False,),  # published 4.x configs carry it; never a bias
            # Phi-4-mini's config carries these at the values transformers' Phi3 computes:
            # no bias in the MLP or on the LM head, every layer full attention
            # (full_attn_mod 1), no position interpolation (interpolate_factor 1)
            "mlp_bias": (False,),
            "lm_head_bias": (False,),
            "full_attn_mod": (1,),
            "interpolate_factor": (1,),
        },
    ),
    "granite": Family(
        _fields(
            num_key_value_heads=_MHA,
            attention_bias=Spec(_bool, False),
            mlp_bias=Spec(_bool, False),
            embedding_multiplier=Spec(_pos_float, 1.0),
            attention_multiplier=Spec(_pos_float, 1.0),
            residual_multiplier=Spec(_pos_float, 1.0),
            logits_scaling=Spec(_pos_float, 1.0),
        ),
        derive=_granite,
    ),
    "smollm3": Family(
        _fields(
            # missing: SmolLM3Config's 4; null: one K/V head per query head
            num_key_value_heads=Spec(_pos_int, 4, nullable=True),
            max_position_embeddings=Spec(_pos_int, 32768),
            tie_word_embeddings=Spec(_bool, True),
            attention_bias=Spec(_bool, False),
            mlp_bias=Spec(_bool, False),
            use_sliding_window=Spec(_bool, False),
            sliding_window=Spec(_nonneg_int, None, nullable=True),
            no_rope_layers=Spec(_int_list, None),
            no_rope_layer_interval=Spec(_pos_int, 4),
            # the published SmolLM3-3B config.json carries both; SmolLM3Config defines neither
            # and the model reads neither (pretraining_tp=2 there changes nothing)
            max_window_layers=Spec(_nonneg_int, None),
            pretraining_tp=Spec(_pos_int, None),
        ),
        derive=_smollm3,
        windows=_smollm3_window,
        reads_layer_types=True,
        default_theta=2e6,
    ),
}
# issue 16: OLMo 2 (transformers' olmo2: Olmo2Config, Olmo2Attention, Olmo2DecoderLayer)
FAMILY_TABLE["olmo2"] = Family(
    _fields(
        num_key_value_heads=_MHA,
        rms_norm_eps=Spec(_pos_float, 1e-5),
        attention_bias=Spec(_bool, False),
    ),
    derive=lambda v: _attention_bias(v) | {"qk_norm": True, "qk_norm_scope": "projection"},
    # each sub-layer's output normalised before its residual add; nothing normalises its input
    block=BlockLayout(
        attention_pre=None,
        attention_post="post_attention_layernorm",
        ffn_pre=None,
        ffn_post="post_feedforward_layernorm",
    ),
)
# issue 16: Cohere (transformers' cohere: CohereConfig, CohereLayerNorm, CohereDecoderLayer)
FAMILY_TABLE["cohere"] = Family(
    {
        **{k: s for k, s in _fields().items() if k != "rms_norm_eps"},  # it has layer_norm_eps
        "num_key_value_heads": _MHA,
        "max_position_embeddings": Spec(_pos_int, 8192),
        "tie_word_embeddings": Spec(_bool, True),
        "layer_norm_eps": Spec(_pos_float, 1e-5),
        "logit_scale": Spec(_pos_float, 0.0625),
        "attention_bias": Spec(_bool, False),
        "use_qk_norm": Spec(_bool, False),
    },
    derive=lambda v: (
        _attention_bias(v)
        | {
            "norm_type": "layernorm",
            "rms_norm_eps": v["layer_norm_eps"],
            "qk_norm": v["use_qk_norm"],
            "qk_norm_scope": "each_head",
            "logits_multiplier": v["logit_scale"],
            # rotate_half pairs adjacent channels (x_2i, x_2i+1), written back interleaved
            "rope_layout": "complex",
        }
    ),
    # attention and MLP side by side, both reading the one input_layernorm
    block=BlockLayout(ffn_pre=None, parallel=True),
)


def _global_every(
    mt: str, every: int | None = None, why: str = ""
) -> Callable[[dict], tuple[tuple[str, ...], int | None]]:
    """Windows for a family whose layers slide but every `every`-th (else the config's
    sliding_window_pattern-th) is global, as Gemma 2 (every 2nd, the even ones slide), Gemma 3,
    Cohere 2 (sliding_window_pattern) and gpt-oss (every 2nd) derive them without layer_types."""

    def windows(v: dict) -> tuple[tuple[str, ...], int | None]:
        if v["sliding_window"] is None:
            raise ConfigError(f"sliding_window null is not modelled for {mt}{why}")
        w = _active_window(v, True)
        n, k = v["num_hidden_layers"], every or v["sliding_window_pattern"]
        return tuple(SLIDING if (i + 1) % k else FULL for i in range(n)), w

    return windows


def _cohere2(v: dict) -> dict:
    # Cohere2Config sets head_dim to hidden_size // num_attention_heads whatever the file says
    heads, hidden = v["num_attention_heads"], v["hidden_size"]
    if v["head_dim"] is not None and v["head_dim"] * heads != hidden:
        raise ConfigError(
            f"head_dim {v['head_dim']} is not hidden_size // num_attention_heads "
            f"({hidden // heads}), which transformers' cohere2 always uses"
        )
    return FAMILY_TABLE["cohere"].derive(v | {"use_qk_norm": False})


# issue 16: Cohere 2 (transformers' cohere2): Cohere's block, sliding-window layers with a global
# one every few, the global ones without RoPE
FAMILY_TABLE["cohere2"] = Family(
    {
        **{k: s for k, s in FAMILY_TABLE["cohere"].fields.items() if k != "use_qk_norm"},
        "sliding_window": Spec(_nonneg_int, 4096, nullable=True),
        "sliding_window_pattern": Spec(_pos_int, 4),
    },
    derive=_cohere2,
    windows=_global_every("cohere2", why=" (no layer would rotate)"),
    reads_layer_types=True,
    # the published files' own names for what transformers' cohere2 always builds: accepted at
    # that value, refused at any other
    noop_only={
        "use_qk_norm": (False, None),
        "use_parallel_block": (True,),
        "use_gated_activation": (True,),
        "use_embedding_sharing": (True,),
        "use_parallel_embedding": (True, False),  # how a TP run shards the table: same values
        "position_embedding_type": ("rope_gptj",),
        "rotary_pct": (1.0,),
        "order_of_interleaved_layers": ("local_attn_first",),
        "cache_implementation": ("hybrid", None),
    },
    block=BlockLayout(ffn_pre=None, parallel=True),
    rope_on_sliding_only=True,
)


def _gemma2(v: dict) -> dict:
    # Gemma 2 and 3 read hidden_activation alone (Family.act_field); a hidden_act that says
    # otherwise is refused all the same, as a config at odds with itself
    return _gemma(v) | {
        "attention_scale": v["query_pre_attn_scalar"] ** -0.5,
        "attn_logit_softcapping": v["attn_logit_softcapping"],
        "final_logit_softcapping": v["final_logit_softcapping"],
    }


# issue 16: Gemma 2 (transformers' gemma2: Gemma2Config, Gemma2Attention, Gemma2DecoderLayer):
# Gemma's norms, activation and embedding scale, a pre- and a post-norm around each sub-layer,
# soft-capped attention scores and logits, every other layer a sliding window
FAMILY_TABLE["gemma2"] = Family(
    {
        **FAMILY_TABLE["gemma"].fields,
        # transformers 5 reads hidden_activation alone; the published files carry both names
        "hidden_activation": Spec(_str, "gelu_pytorch_tanh"),
        "query_pre_attn_scalar": Spec(_pos_float, 256.0),
        "sliding_window": Spec(_nonneg_int, 4096, nullable=True),
        # null: no cap
        "attn_logit_softcapping": Spec(_pos_float, 50.0, nullable=True),
        "final_logit_softcapping": Spec(_pos_float, 30.0, nullable=True),
    },
    derive=_gemma2,
    windows=_global_every("gemma2", 2),
    reads_layer_types=True,
    acts=_GEMMA2_ACTS,
    act_field="hidden_activation",
    # the published files' cache kind: transformers builds the same model whatever it says
    noop_only={"cache_implementation": ("hybrid", None)},
    block=BlockLayout(
        attention_pre="input_layernorm",
        attention_post="post_attention_layernorm",
        ffn_pre="pre_feedforward_layernorm",
        ffn_post="post_feedforward_layernorm",
    ),
)


# issue 16: Gemma 3's text decoder (transformers' gemma3: Gemma3TextConfig, Gemma3Attention,
# Gemma3DecoderLayer, Gemma3ForCausalLM): Gemma 2's block, per-head q/k RMSNorms, five local
# layers to one global, the local ones with their own RoPE base; soft-capping off by default.
# Its defaults are Gemma3TextConfig's, which a `gemma3` checkpoint's sparse text_config relies on
FAMILY_TABLE["gemma3_text"] = Family(
    {
        **FAMILY_TABLE["gemma2"].fields,
        "vocab_size": Spec(_pos_int, 262208),
        "hidden_size": Spec(_pos_int, 2304),
        "intermediate_size": Spec(_pos_int, 9216),
        "num_hidden_layers": Spec(_pos_int, 26),
        "num_attention_heads": Spec(_pos_int, 8),
        "num_key_value_heads": Spec(_pos_int, 4),
        "max_position_embeddings": Spec(_pos_int, 131072),
        "attn_logit_softcapping": Spec(_pos_float, None, nullable=True),
        "final_logit_softcapping": Spec(_pos_float, None, nullable=True),
        "rope_local_base_freq": Spec(_pos_float, None),
        "sliding_window_pattern": Spec(_pos_int, 6),
    },
    derive=lambda v: _gemma2(v) | {"qk_norm": True},
    windows=_global_every("gemma3_text"),
    reads_layer_types=True,
    acts=_GEMMA2_ACTS,
    act_field="hidden_activation",
    default_theta=1e6,
    # transformers 4.5x's spelling of the pattern
    aliases={"_sliding_window_pattern": "sliding_window_pattern"},
    noop_only={"cache_implementation": ("hybrid", None)},
    block=FAMILY_TABLE["gemma2"].block,
    rope_by_layer_type=True,
)


# issue 16: Llama 4's text decoder (transformers' llama4: Llama4TextConfig, Llama4TextAttention,
# Llama4TextDecoderLayer), its attention and dense FFN; the MoE layers come with issue 18
def _llama4_moe_layers(given: dict) -> list[int] | None:
    """The MoE layers Llama4TextConfig derives (`moe_layers`, else every
    interleave_moe_layer_step-th layer from step - 1), those below num_hidden_layers (the
    decoder layer asks `layer_idx in moe_layers`); None where a value is malformed, for the
    field checks to name."""
    n, step, given_layers = (
        given.get("num_hidden_layers"),
        given.get("interleave_moe_layer_step"),
        given.get("moe_layers"),
    )
    step = 1 if step is None else step
    if not _is_int(n) or not 1 <= n <= size_limit("num_hidden_layers")[0] or not _is_int(step):
        return None
    if given_layers is not None:
        if not isinstance(given_layers, list) or not all(_is_int(x) for x in given_layers):
            return None
        return sorted({x for x in given_layers if 0 <= x < n})
    return list(range(step - 1, n, step)) if step >= 1 else None


def _flag_or_count(name: str, v: Any) -> bool:
    """true/false, or a non-negative integer read as its truth (0: false)."""
    if isinstance(v, bool):
        return v
    return _nonneg_int(name, v) > 0


def _llama4_moe(v: dict) -> dict:
    """issue 18: Llama4TextMoe on the layers in moe_layers: Llama4Router (a bias-free Linear,
    top-k of its logits, sigmoid of those) scales each chosen expert's input; the experts stored
    fused (Llama4TextExperts); a shared expert as wide as a routed one, always on."""
    n = v["num_hidden_layers"]
    moe = set(_llama4_moe_layers(v) or ())
    layers = tuple(i in moe for i in range(n))
    if not moe:
        return {"moe_layers": layers}
    if v["num_experts_per_tok"] > v["num_local_experts"]:
        raise ConfigError(
            f"num_experts_per_tok {v['num_experts_per_tok']} exceeds num_local_experts "
            f"{v['num_local_experts']}"
        )
    return {
        "num_experts": v["num_local_experts"],
        "num_experts_per_tok": v["num_experts_per_tok"],
        "moe_intermediate_size": v["intermediate_size"],
        "shared_expert_intermediate_size": v["intermediate_size"],
        "scoring_func": "sigmoid",
        "moe_weights_input": True,
        "fused_experts": True,
        "moe_layers": layers,
        "moe_names": MoENames(block="feed_forward", router="router", shared="shared_expert"),
        # the dense layers' width; 0 where every layer routes (Scout)
        "intermediate_size": v["intermediate_size_mlp"] if len(moe) < n else 0,
    }


def _llama4_rope_layers(v: dict) -> tuple[bool, ...]:
    # Llama4TextConfig: an empty no_rope_layers is falsy and takes the default, as None does
    return _smollm3_rope_layers(v | {"no_rope_layers": v["no_rope_layers"] or None})


def _llama4_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # Llama4TextConfig: without layer_types, the RoPE layers are chunked (when a chunk size is
    # set) and the NoPE ones attend to everything
    chunk = v["attention_chunk_size"] is not None
    return tuple(CHUNKED if r and chunk else FULL for r in _llama4_rope_layers(v)), None


def _llama4(v: dict) -> dict:
    return (
        _attention_bias(v)
        | {
            "intermediate_size": v["intermediate_size_mlp"],
            "mlp_name": "feed_forward",
            "rope_layers": _llama4_rope_layers(v),
            "rope_layout": "complex",  # apply_rotary_emb: (x_2i, x_2i+1) as one complex number
            "attention_chunk_size": v["attention_chunk_size"],
            "qk_l2_norm": v["use_qk_norm"],
            "temperature_floor_scale": v["floor_scale"] if v["attn_temperature_tuning"] else 0,
            "temperature_attn_scale": v["attn_scale"] if v["attn_temperature_tuning"] else 0.0,
        }
        | _llama4_moe(v)
    )


FAMILY_TABLE["llama4_text"] = Family(
    _fields(
        vocab_size=Spec(_pos_int, 202048),
        hidden_size=Spec(_pos_int, 5120),
        # the routed (and shared) experts' width
        intermediate_size=Spec(_pos_int, 8192),
        intermediate_size_mlp=Spec(_pos_int, 16384),
        num_hidden_layers=Spec(_pos_int, 48),
        num_attention_heads=Spec(_pos_int, 40),
        num_key_value_heads=Spec(_pos_int, 8, nullable=True),  # null: one per query head
        head_dim=Spec(_pos_int, 128),
        max_position_embeddings=Spec(_pos_int, 4096 * 32),
        rms_norm_eps=Spec(_pos_float, 1e-5),
        attention_bias=Spec(_bool, False),
        num_experts_per_tok=Spec(_pos_int, 1),
        num_local_experts=Spec(_pos_int, 16),
        moe_layers=Spec(_int_list, None),
        interleave_moe_layer_step=Spec(_pos_int, 1),
        use_qk_norm=Spec(_bool, True),
        no_rope_layers=Spec(_int_list, None),
        no_rope_layer_interval=Spec(_pos_int, 4),
        attention_chunk_size=Spec(_pos_int, 8192, nullable=True),  # null: no chunked layer
        # Scout's published file writes 4, which transformers 4.5x's model reads as true (`if
        # self.attn_temperature_tuning`; transformers 5's strict config refuses the int)
        attn_temperature_tuning=Spec(_flag_or_count, True),
        floor_scale=Spec(_pos_int, 8192),
        attn_scale=Spec(_pos_float, 0.1),
    ),
    derive=_llama4,
    windows=_llama4_window,
    reads_layer_types=True,
    default_theta=500000.0,
    layer_kinds=(FULL, CHUNKED),
    noop_only={
        # the published files' cache kind: transformers builds the same model whatever it says
        "cache_implementation": ("hybrid", None),
        # Scout's published file: a quantisation tool's switch, false in the checkpoint
        "for_llm_compressor": (False,),
    },
)


# issue 18: Kimi-K2 (moonshotai/Kimi-K2-*) is DeepSeek-V3's architecture under a model_type of
# its own. transformers has no kimi_k2 class (its kimi_k25 rewrites a kimi_k2 text_config to
# deepseek_v3, and Moonshot's README says to do the same), so it reads as deepseek_v3 from the
# same fields with the same defaults
FAMILY_TABLE["kimi_k2"] = FAMILY_TABLE["deepseek_v3"]


def _glm4_moe(v: dict) -> dict:
    # Glm4MoeTopkRouter is DeepSeek-V3's (sigmoid, correction bias, groups ranked by their two
    # best, renormalised, scaled) and Glm4MoeDecoderLayer routes from first_k_dense_replace on;
    # the MTP layers n, n+1, ... follow the rule too (vLLM's glm4_moe_mtp.py: MoE blocks)
    rule = {"moe_layer_freq": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid"}
    return _deepseek_moe(v | rule | {"rope_interleave": False})


def _glm4_moe_attention(v: dict) -> dict:
    # Glm4MoeAttention: q/k/v biased by attention_bias, o_proj never; with use_qk_norm an
    # RMSNorm over each head's head_dim, one weight for all heads, before RoPE (Qwen3's)
    return {
        "qkv_bias": v["attention_bias"],
        "qk_norm": v["use_qk_norm"],
        "num_nextn_predict_layers": v["num_nextn_predict_layers"],
    }


# issue 18: GLM-4.5 / GLM-4.5-Air (transformers' glm4_moe: Glm4MoeConfig, Glm4MoeAttention,
# Glm4MoeTopkRouter, Glm4MoeDecoderLayer = DeepseekV3DecoderLayer): GQA with partial rotate-half
# RoPE (partial_rotary_factor, 0.5 by default), QKV bias, optional per-head QK-norm; DeepSeek-V3's
# MoE (sigmoid routing with correction bias, grouped top-k, shared experts, dense first layers);
# num_nextn_predict_layers MTP layers kept out of the main model
FAMILY_TABLE["glm4_moe"] = Family(
    _fields(
        max_position_embeddings=Spec(_pos_int, 131072),
        rms_norm_eps=Spec(_pos_float, 1e-5),
        attention_bias=Spec(_bool, False),
        use_qk_norm=Spec(_bool, False),
        partial_rotary_factor=Spec(_pos_float, 0.5),  # Glm4MoeConfig's default
        # only the dense first layers read it
        intermediate_size=Spec(_pos_int, None),
        moe_intermediate_size=Spec(_pos_int, 1408),
        num_experts_per_tok=Spec(_pos_int, 8),
        n_shared_experts=Spec(_nonneg_int, 1),
        n_routed_experts=Spec(_pos_int, 128),
        routed_scaling_factor=Spec(_pos_float, 1.0),
        n_group=Spec(_pos_int, 1),
        topk_group=Spec(_pos_int, 1),
        first_k_dense_replace=Spec(_nonneg_int, 1),
        norm_topk_prob=Spec(_bool, True),
        num_nextn_predict_layers=Spec(_nonneg_int, 1),
    ),
    derive=_glm4_moe_attention,
    moe=_glm4_moe,
    partial_rotary=True,
    aliases={
        "num_local_experts": "n_routed_experts",
        "num_mtp_layers": "num_nextn_predict_layers",
    },
    # the routing Glm4MoeTopkRouter always computes, as some exported configs spell it
    noop_only={"scoring_func": ("sigmoid",), "topk_method": ("noaux_tc",)},
)


def _minimax_m2_moe(v: dict) -> dict:
    # MiniMaxM2SparseMoeBlock: Mixtral's block with sigmoid scores, the block's
    # e_score_correction_bias added to choose the top-k, the unbiased scores of the chosen ones
    # renormalised to weight them; every layer routes, no shared expert
    names = MoENames(
        block="block_sparse_moe",
        expert_gate="w1",
        expert_up="w3",
        expert_down="w2",
        correction_bias="e_score_correction_bias",
    )
    return _mixtral_moe(v) | {
        "moe_names": names,
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
    }


def _minimax_m2_unmodelled(given: dict) -> list[str]:
    # a layer of another attention type (0: MiniMax-Text-01's lightning attention) is a feature,
    # named with the config's other unmodelled fields
    types = given.get("attn_type_list")
    # a value of the wrong kind is the field check's to refuse
    bad = sorted({t for t in types if type(t) is int and t != 1}) if isinstance(types, list) else []
    if bad:
        return [
            f"attn_type_list has {_show(bad[0])}: MiniMax-M2 is modelled with full attention (1) "
            "in every layer, as transformers' minimax_m2 builds it"
        ]
    return []


def _minimax_m2(v: dict) -> dict:
    if v["attn_type_list"] is not None and len(v["attn_type_list"]) != v["num_hidden_layers"]:
        raise ConfigError(
            f"attn_type_list has {len(v['attn_type_list'])} entries for "
            f"{v['num_hidden_layers']} hidden layers"
        )
    rot = v["rotary_dim"]
    if rot is not None:
        # MiniMaxM2Config.convert_rope_params_to_dict: the released checkpoints' rotary_dim is
        # partial_rotary_factor = rotary_dim / head_dim
        prf = rot / v["head_dim"]
        if v["partial_rotary_factor"] not in (None, prf):
            raise ConfigError(
                f"rotary_dim {rot} disagrees with partial_rotary_factor {v['partial_rotary_factor']}"
            )
        v["partial_rotary_factor"] = prf
    # MiniMaxM2Attention (FlexOlmo's): RMSNorms over the whole q and k projections before the
    # head split, no biases
    return {"qk_norm": True, "qk_norm_scope": "projection"}


# issue 18: MiniMax-M2 (transformers' minimax_m2: MiniMaxM2Config, MiniMaxM2Attention,
# MiniMaxM2SparseMoeBlock): GQA with QK-norm over the full projection width, partial rotate-half
# RoPE (rotary_dim), sigmoid routing with a correction bias over 256 experts. The published
# config's MTP modules (use_mtp, num_mtp_modules, mtp_transformer_layers) are not part of the main
# model, and transformers has no module for them: they are accepted and left out
FAMILY_TABLE["minimax_m2"] = Family(
    _fields(
        head_dim=Spec(_pos_int, 128),
        max_position_embeddings=Spec(_pos_int, 196608),
        num_local_experts=Spec(_pos_int, 256),
        num_experts_per_tok=Spec(_pos_int, 8),
        rotary_dim=Spec(_pos_int, None),
        partial_rotary_factor=Spec(_pos_float, None),
        attn_type_list=Spec(_int_list, None),
        # the published file's width of a dense MLP that no MiniMax-M2 layer has
        mlp_intermediate_size=Spec(_pos_int, None),
        use_mtp=Spec(_bool, False),
        num_mtp_modules=Spec(_nonneg_int, 0),
        mtp_transformer_layers=Spec(_nonneg_int, 1),
    ),
    derive=_minimax_m2,
    moe=_minimax_m2_moe,
    unmodelled=_minimax_m2_unmodelled,
    partial_rotary=True,
    default_theta=5e6,
    aliases={"num_experts": "num_local_experts"},
    # the published file's names for what transformers' minimax_m2 always computes
    noop_only={
        "scoring_func": ("sigmoid",),
        "use_routing_bias": (True,),
        "use_qk_norm": (True,),
        "qk_norm_type": ("per_layer",),
        "shared_intermediate_size": (0,),
        "shared_moe_mode": ("sigmoid",),
        "sliding_window": (None,),
        "attention_bias": (False,),
        "layernorm_full_attention_beta": (1.0,),
        "layernorm_linear_attention_beta": (1.0,),
        "layernorm_mlp_beta": (1.0,),
    },
)


def _gpt_oss_moe(v: dict) -> dict:
    # GptOssMLP: every layer routes; GptOssTopKRouter takes the top-k of the biased router
    # logits and softmaxes the k chosen; GptOssExperts keeps each projection stacked for all
    # experts (E, in, out) with biases, gate and up interleaved, through a clamped SwiGLU
    return _every_layer_routes(v) | {
        "moe_names": MoENames(
            router="router", expert_gate="gate_up_proj", expert_up="gate_up_proj"
        ),
        "router_bias": True,
        "topk_then_score": True,
        "experts_stacked": True,
        "swiglu_limit": v["swiglu_limit"],
        "swiglu_alpha": v["swiglu_alpha"],
    }


def _gpt_oss(v: dict) -> dict:
    if v["experts_per_token"] not in (None, v["num_experts_per_tok"]):
        raise ConfigError(
            f"experts_per_token {v['experts_per_token']} disagrees with num_experts_per_tok "
            f"{v['num_experts_per_tok']}"
        )
    # GptOssAttention: q/k/v/o all biased by attention_bias, and a learned sink per head
    return _attention_bias(v) | {"attention_sinks": True}


# issue 18: gpt-oss (transformers' gpt_oss: GptOssConfig, GptOssAttention, GptOssTopKRouter,
# GptOssExperts): GQA with attention sinks and biases, every other layer a 128-token window,
# YaRN RoPE, a biased top-4 router softmaxed over its choice, 32 or 128 experts with biases and a
# clamped SwiGLU. The published config.json's experts_per_token and initial_context_length are
# the original release's names (the first must equal num_experts_per_tok; the second is
# rope_scaling's original_max_position_embeddings)
FAMILY_TABLE["gpt_oss"] = Family(
    _fields(
        head_dim=Spec(_pos_int, 64),
        rms_norm_eps=Spec(_pos_float, 1e-5),
        max_position_embeddings=Spec(_pos_int, 131072),
        sliding_window=Spec(_nonneg_int, 128, nullable=True),
        attention_bias=Spec(_bool, True),
        num_local_experts=Spec(_pos_int, 128),
        num_experts_per_tok=Spec(_pos_int, 4),
        experts_per_token=Spec(_pos_int, None),
        initial_context_length=Spec(_pos_int, None),
        swiglu_limit=Spec(_pos_float, 7.0),
        swiglu_alpha=Spec(_pos_float, 1.702),
    ),
    derive=_gpt_oss,
    windows=_global_every("gpt_oss", 2),
    reads_layer_types=True,
    moe=_gpt_oss_moe,
    default_theta=150000.0,
    aliases={"num_experts": "num_local_experts"},
)
# -- issue 19: Qwen3-Next (transformers' qwen3_next: Qwen3NextConfig, Qwen3NextGatedDeltaNet,
# Qwen3NextAttention with its output gate, Qwen3NextRMSNorm's x * (1 + w), Qwen3NextSparseMoeBlock)
LINEAR = "linear_attention"


def _qwen3_next_layers(v: dict) -> tuple[tuple[str, ...], int | None]:
    # Qwen3NextConfig: every full_attention_interval-th layer attends, the others are linear
    n, every = v["num_hidden_layers"], v["full_attention_interval"]
    return tuple(LINEAR if (i + 1) % every else FULL for i in range(n)), None


def _qwen3_next(v: dict) -> dict:
    return _attention_bias(v) | {
        "qk_norm": True,  # per head, Qwen3NextRMSNorm like every norm of the model
        "norm_weight_offset": 1.0,  # zero-centred: x * (1 + w), as Gemma's
        "attn_output_gate": True,
        "conv_kernel": v["linear_conv_kernel_dim"],
        "linear_num_key_heads": v["linear_num_key_heads"],
        "linear_num_value_heads": v["linear_num_value_heads"],
        "linear_key_head_dim": v["linear_key_head_dim"],
        "linear_value_head_dim": v["linear_value_head_dim"],
        # the checkpoint's one MTP layer, mtp.layers.0 (the config does not declare it; vLLM's
        # qwen3_next_mtp.py reads num_nextn_predict_layers with a default of 1): a full-attention
        # layer whose MLP follows layer 0's rule (its prefix's index 0 in Qwen3NextDecoderLayer)
        "num_nextn_predict_layers": 1,
        "mtp_moe_layers": (
            0 not in v["mlp_only_layers"]
            and v["num_experts"] > 0
            and v["decoder_sparse_step"] == 1,
        ),
        "mtp_layout": "mtp",
    }


FAMILY_TABLE["qwen3_next"] = Family(
    _fields(
        max_position_embeddings=Spec(_pos_int, 32768),
        head_dim=Spec(_pos_int, 256),
        attention_bias=Spec(_bool, False),
        partial_rotary_factor=Spec(_pos_float, None),
        full_attention_interval=Spec(_pos_int, 4),
        linear_conv_kernel_dim=Spec(_pos_int, 4),
        linear_key_head_dim=Spec(_pos_int, 128),
        linear_value_head_dim=Spec(_pos_int, 128),
        linear_num_key_heads=Spec(_pos_int, 16),
        linear_num_value_heads=Spec(_pos_int, 32),
        shared_expert_intermediate_size=Spec(_pos_int, 512),
        **{
            **_QWEN_MOE,
            "num_experts": Spec(_pos_int, 512),
            "num_experts_per_tok": Spec(_pos_int, 10),
            "moe_intermediate_size": Spec(_pos_int, 512),
            "norm_topk_prob": Spec(_bool, True),
            "intermediate_size": Spec(_pos_int, 5632),
        },
    ),
    derive=_qwen3_next,
    windows=_qwen3_next_layers,
    reads_layer_types=True,
    layer_kinds=(FULL, LINEAR),
    moe=_qwen_moe,
    partial_rotary=True,
    # the published config.json writes these at the values the model has anyway
    noop_only={"use_sliding_window": (False,), "sliding_window": (None,)},
    default_partial_rotary=0.25,
)


# issue 19: Nemotron-H and Nemotron-3-Nano (transformers' nemotron_h: NemotronHConfig,
# NemotronHBlock, NemotronHMamba2Mixer, NemotronHAttention, NemotronHMLP, NemotronHMoE). Each
# layer is ONE mixer behind its own RMSNorm and residual: Mamba2 (M), attention without RoPE (*),
# a relu^2 MLP (-) or an MoE of relu^2 experts with a shared one (E), as the published
# `hybrid_override_pattern` string or transformers 5's `layers_block_type` list
# ("linear_attention" there is a Mamba2 layer) gives them.
_NEMOTRON_PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
_NEMOTRON_LAYER = {  # layers_block_type -> (layer_types entry, layer_blocks entry)
    "linear_attention": ("mamba2", "mixer"),
    "full_attention": (FULL, "mixer"),
    # an FFN layer has no mixer; its layer_types entry is not read
    "mlp": (FULL, "ffn"),
    "moe": (FULL, "ffn"),
}
_NEMOTRON_MTP = ("num_nextn_predict_layers", "mtp_layers_block_type", "mtp_hybrid_override_pattern")


def _nemotron_prepare(v: dict) -> dict:
    pattern, listed = v["hybrid_override_pattern"], v["layers_block_type"]
    if pattern is not None:
        bad = sorted(set(pattern) - set(_NEMOTRON_PATTERN))
        if bad:
            raise ConfigError(
                f"hybrid_override_pattern has {shown(bad[0])}; Nemotron-H's layers are "
                "M (Mamba2), * (attention), - (MLP) and E (MoE)"
            )
        from_pattern = [_NEMOTRON_PATTERN[ch] for ch in pattern]
        if listed is not None and list(listed) != from_pattern:
            raise ConfigError("layers_block_type disagrees with hybrid_override_pattern")
        listed = from_pattern
    if listed is None:
        listed = ["linear_attention", "moe", "full_attention", "mlp"]  # NemotronHConfig's
    bad = [t for t in listed if t not in _NEMOTRON_LAYER]
    if bad:
        raise ConfigError(
            f"layers_block_type has {shown(bad[0])}; Nemotron-H's layers are "
            f"{', '.join(map(repr, _NEMOTRON_LAYER))}"
        )
    if not listed:
        raise ConfigError("layers_block_type is empty")
    n = v["num_hidden_layers"]
    if n is not None and n != len(listed):
        raise ConfigError(
            f"num_hidden_layers {n} disagrees with the {len(listed)} layers of the layer pattern"
        )
    check_size("num_hidden_layers", len(listed))
    # Nemotron-H-8B's config names the head width attention_head_dim (NVIDIA's remote code reads
    # it; transformers 5 reads head_dim, 128 by default): one width, or the two models differ
    width = v["attention_head_dim"]
    if width is not None and width != v["head_dim"]:
        raise ConfigError(
            f"attention_head_dim {width} disagrees with head_dim {v['head_dim']} "
            "(transformers reads head_dim, NVIDIA's remote code attention_head_dim)"
        )
    return v | {"layers_block_type": listed, "num_hidden_layers": len(listed)}


def _nemotron_unmodelled(given: dict) -> list[str]:
    out = []
    mtp = given.get("num_nextn_predict_layers")
    if isinstance(mtp, int) and not isinstance(mtp, bool) and mtp > 0:
        # the MTP layers' fields are transformers' defaults (it writes them) unless MTP is on
        named = [k for k in _NEMOTRON_MTP if given.get(k) is not None]
        out.append(f"Nemotron-H's MTP layers ({', '.join(named)}) are not modelled")
    if given.get("moe_latent_size") is not None:
        out.append(
            f"moe_latent_size={_show(given['moe_latent_size'])} is not modelled (only null: "
            "the latent MoE projections fc1/fc2_latent_proj)"
        )
    limit = given.get("time_step_limit")
    if isinstance(limit, (list, tuple)):
        limit = [_json_float(x) for x in limit]
    high = limit[1] if isinstance(limit, list) and len(limit) == 2 else None
    if isinstance(high, (int, float)) and not isinstance(high, bool) and math.isfinite(high):
        out.append(
            f"time_step_limit={_show(list(limit))} is not modelled (a finite upper bound on "
            "dt; only [low, Infinity])"
        )
    act = given.get("mamba_hidden_act")
    if act is not None and act != "silu":
        out.append(f"mamba_hidden_act={_show(act)} is not modelled (only 'silu')")
    return out


def _nemotron_layers(v: dict) -> tuple[tuple[str, ...], int | None]:
    return tuple(_NEMOTRON_LAYER[t][0] for t in v["layers_block_type"]), None


def _nemotron_moe(v: dict) -> dict:
    # NemotronHTopkRouter: DeepSeek-V3's noaux_tc (sigmoid scores, the stored correction bias
    # chooses, groups ranked by their two best), renormalised and scaled; NemotronHExperts: up
    # and down only (mlp_gated False), stored one tensor per expert; one shared MLP of moe_shared_expert_intermediate_size
    # whatever n_shared_experts says (transformers builds one)
    e, groups, top = v["n_routed_experts"], v["n_group"], v["topk_group"]
    if e % groups:
        raise ConfigError(f"n_routed_experts {e} is not divisible by n_group {groups}")
    if top > groups:
        raise ConfigError(f"topk_group {top} exceeds n_group {groups}")
    if groups > 1 and e // groups < 2:
        raise ConfigError("noaux_tc ranks groups by their two best experts: n_group too large")
    moe = tuple(t == "moe" for t in v["layers_block_type"])
    return {
        "num_experts": e,
        "num_experts_per_tok": v["num_experts_per_tok"],
        "moe_intermediate_size": v["moe_intermediate_size"],
        "norm_topk_prob": v["norm_topk_prob"],
        "shared_expert_intermediate_size": v["moe_shared_expert_intermediate_size"],
        "moe_layers": moe,
        "moe_names": MoENames(block="mixer", expert_up="up_proj", shared="shared_experts"),
        "scoring_func": "sigmoid",
        "topk_method": "noaux_tc",
        "n_group": groups,
        "topk_group": top,
        "routed_scaling_factor": v["routed_scaling_factor"],
    }


def _nemotron_h(v: dict) -> dict:
    types = v["layers_block_type"]
    n = len(types)
    dense = v["intermediate_size"] if "mlp" in types else 0  # only NemotronHMLP reads it
    return {
        "intermediate_size": dense,
        "mlp_bias": v["mlp_bias"],
        "rms_norm_eps": v["layer_norm_epsilon"],
        "layer_blocks": tuple(_NEMOTRON_LAYER[t][1] for t in types),
        "rope_layers": (False,) * n,  # NemotronHAttention has no rotary embedding
        # NVIDIA's checkpoints' names, which transformers 5's save_pretrained writes back
        "layers_prefix": "backbone.layers",
        "attention_name": "mixer",
        "mlp_name": "mixer",
        "embedding_name": "backbone.embeddings",
        "final_norm_name": "backbone.norm_f",
        "mlp_gated": False,
        "mamba_num_heads": v["mamba_num_heads"],
        "mamba_head_dim": v["mamba_head_dim"],
        "ssm_state_size": v["ssm_state_size"],
        "mamba_n_groups": v["n_groups"],
        "conv_kernel": v["conv_kernel"],
        "mamba_chunk_size": v["chunk_size"],
        "mamba_conv_bias": v["use_conv_bias"],
        "mamba_proj_bias": v["use_bias"],
        # transformers >= 5.25's NemotronHMamba2Mixer clamps dt at the config's time_step_limit
        # in its chunked scan (mamba_ssm's dt_limit), not in its recurrent step; before 5.25 it
        # took (time_step_min, inf) whatever the config said. time_step_min only initialises
        "mamba_dt_min": v["time_step_limit"][0],
    }


def _any(name: str, v: Any) -> Any:
    return v  # read by transformers' initialisation only, or not at all: any value


FAMILY_TABLE["nemotron_h"] = Family(
    {
        **{k: s for k, s in _COMMON.items() if k not in ("layer_types", "rms_norm_eps")},
        "vocab_size": Spec(_pos_int, 131072),
        "hidden_size": Spec(_pos_int, 4096),
        "num_hidden_layers": Spec(_pos_int, None),
        "num_attention_heads": Spec(_pos_int, 32),
        "num_key_value_heads": Spec(_pos_int, 8),
        "head_dim": Spec(_pos_int, 128),
        "attention_head_dim": Spec(_pos_int, None),
        "intermediate_size": Spec(_pos_int, 21504),
        "max_position_embeddings": Spec(_pos_int, 4096),
        "hybrid_override_pattern": Spec(_str, None),
        "layers_block_type": Spec(_str_list, None),
        "layer_norm_epsilon": Spec(_pos_float, 1e-5),
        "mlp_hidden_act": Spec(_str, "relu2"),
        "mlp_bias": Spec(_bool, False),
        "use_bias": Spec(_bool, False),
        "mamba_num_heads": Spec(_pos_int, 128),
        "mamba_head_dim": Spec(_pos_int, 64),
        "ssm_state_size": Spec(_pos_int, 128),
        "n_groups": Spec(_pos_int, 8),
        "conv_kernel": Spec(_pos_int, 4),
        "chunk_size": Spec(_pos_int, 128),
        "use_conv_bias": Spec(_bool, True),
        "mamba_hidden_act": Spec(_str, "silu"),
        "time_step_limit": Spec(_dt_limit, (0.0, math.inf)),
        "n_routed_experts": Spec(_pos_int, 8),
        "num_experts_per_tok": Spec(_pos_int, 2),
        "moe_intermediate_size": Spec(_pos_int, 7688),
        "moe_shared_expert_intermediate_size": Spec(_pos_int, 7688),
        "norm_topk_prob": Spec(_bool, True),
        "routed_scaling_factor": Spec(_pos_float, 1.0),
        "n_group": Spec(_pos_int, 1),
        "topk_group": Spec(_pos_int, 1),
        "moe_latent_size": Spec(_pos_int, None),
        "num_nextn_predict_layers": Spec(_nonneg_int, 0),
        "mtp_layers_block_type": Spec(_str_list, None),
        "mtp_hybrid_override_pattern": Spec(_str, None),
        # not read by NemotronHForCausalLM (initialisation, kernels, the bf16 residual dtype,
        # a derived width that mamba_num_heads * mamba_head_dim replaces, a count the one shared
        # MLP ignores, the published configs' second spelling of the norm's epsilon)
        **{
            k: Spec(_any, None)
            for k in (
                "expand",
                "time_step_min",
                "time_step_max",
                "time_step_floor",
                "use_mamba_kernels",
                "mamba_ssm_cache_dtype",
                "residual_in_fp32",
                "rescale_prenorm_residual",
                "hidden_dropout",
                "num_logits_to_keep",
                "n_shared_experts",
                "moe_shared_expert_overlap",
                "norm_eps",
                "rms_norm_eps",
            )
        },
    },
    derive=_nemotron_h,
    windows=_nemotron_layers,
    moe=_nemotron_moe,
    acts={"relu2": "relu2"},
    act_field="mlp_hidden_act",
    layer_kinds=(),
    aliases={
        "layer_types": "layers_block_type",
        "num_local_experts": "n_routed_experts",
        # NemotronHConfig's older spellings (its __post_init__ renames them)
        "mamba_n_groups": "n_groups",
        "mamba_d_conv": "conv_kernel",
        "mamba_expand": "expand",
        "mamba_dt_min": "time_step_min",
        "mamba_dt_max": "time_step_max",
        "mamba_dt_limit": "time_step_limit",
        "mamba_dt_init_floor": "time_step_floor",
        "mamba_conv_bias": "use_conv_bias",
        "mamba_chunk_size": "chunk_size",
    },
    noop_only={
        # NemotronHAttention builds q/k/v/o without biases whatever attention_bias says, and
        # the mixer reads use_bias, not mamba_proj_bias: accepted where they agree
        "attention_bias": (False,),
        "mamba_proj_bias": (False,),
        "sliding_window": (None,),
    },
    unmodelled=_nemotron_unmodelled,
    prepare=_nemotron_prepare,
    block=BlockLayout(attention_pre="norm", ffn_pre="norm", one_sublayer=True),
)
assert set(FAMILY_TABLE) == set(FAMILIES)

SUPPORTED = (*FAMILIES, *MULTIMODAL)  # the model_types a config may name

# every key some family or rope dict understands: to tell "wrong family" from "misspelt"
_ALL_FIELDS = frozenset(k for fam in FAMILY_TABLE.values() for k in (*fam.fields, *fam.aliases))


# ---------------------------------------------------------------------------------------------
# RoPE: transformers-4 `rope_theta` + `rope_scaling`, or transformers-5 `rope_parameters`.

# per rope type: its keys and their checks; `_REQUIRED` marks keys without a default
_ROPE_KEYS: dict[str, dict[str, tuple[Callable, Any]]] = {
    "default": {},
    "linear": {"factor": (_pos_float, _REQUIRED)},
    "llama3": {
        "factor": (_pos_float, _REQUIRED),
        "low_freq_factor": (_pos_float, _REQUIRED),
        "high_freq_factor": (_pos_float, _REQUIRED),
        "original_max_position_embeddings": (_pos_int, None),
    },
    "yarn": {
        "factor": (_pos_float, None),
        "original_max_position_embeddings": (_pos_int, None),
        "attention_factor": (_pos_float, None),
        "beta_fast": (_pos_float, None),
        "beta_slow": (_pos_float, None),
        "mscale": (_pos_float, None),
        "mscale_all_dim": (_pos_float, None),
        "truncate": (_bool, None),
    },
    "longrope": {
        "short_factor": (_float_list, _REQUIRED),
        "long_factor": (_float_list, _REQUIRED),
        "factor": (_pos_float, None),
        "attention_factor": (_pos_float, None),
        "original_max_position_embeddings": (_pos_int, None),
    },
}
_ROPE_ALL_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"} | {
    k for keys in _ROPE_KEYS.values() for k in keys
}


def _rope(
    v: dict, fam: Family, model_type: str, section: tuple[str, dict | None] | None = None
) -> RopeConfig:
    """The RoPE of `v`'s rope fields; `section` is (its name, its fields) where one RoPE of
    several is read (a layer type's in Gemma 3's rope_parameters)."""
    if section is None:
        if v["rope_scaling"] is not None and v["rope_parameters"] is not None:
            raise ConfigError("give rope_parameters (transformers 5) or rope_scaling, not both")
        where = "rope_parameters" if v["rope_parameters"] is not None else "rope_scaling"
        section = (where, v[where])
    where, raw = section[0], dict(_mapping(section[0], section[1] or {}))
    t4, t5 = raw.pop("type", None), raw.pop("rope_type", None)
    if t4 is not None and t5 is not None and t4 != t5:
        raise ConfigError(f"{where} has type {shown(t4)} and rope_type {shown(t5)}; give one")
    rtype = _str(f"{where}.rope_type", t5 if t5 is not None else (t4 or "default"))
    if rtype not in fam.rope_types:
        raise ConfigError(_rope_type_refusal(where, rtype, fam, model_type))
    theta = _rope_theta(raw.pop("rope_theta", None), v["rope_theta"], fam, where)
    prf = raw.pop("partial_rotary_factor", None)
    if not fam.partial_rotary:
        if _partial_rotary(prf):
            raise ConfigError(_partial_rotary_refusal(where, prf, model_type))
    elif prf is not None:
        prf = _pos_float(f"{where}.partial_rotary_factor", prf)
        top = v.get("partial_rotary_factor")
        if top is not None and top != prf:
            raise ConfigError(
                f"partial_rotary_factor {top} disagrees with {where}.partial_rotary_factor {prf}"
            )
        v["partial_rotary_factor"] = prf
    got = _rope_fields(raw, rtype, where)
    max_pos = v["max_position_embeddings"]
    if rtype == "longrope":
        return RopeConfig(**_longrope(v, got, where), theta=theta)
    return RopeConfig(**_rope_scaling(got, rtype, where, max_pos), theta=theta)


_LAYER_TYPE_ROPES = (FULL, SLIDING)


def _act_refusal(act: Any, fam: Family, mt: str) -> str:
    return (
        f"{fam.act_field} {shown(act)} is not modelled for {mt} (modelled: {', '.join(fam.acts)})"
    )


def _rope_type_refusal(where: str, rtype: str, fam: Family, mt: str) -> str:
    known = ", ".join(fam.rope_types)
    return f"{where}: rope type {shown(rtype)} is not modelled for {mt} (modelled: {known})"


def _partial_rotary(prf: Any) -> bool:
    """Whether a rope section's partial_rotary_factor rotates less than the whole head."""
    return prf is not None and (
        not isinstance(prf, (int, float)) or isinstance(prf, bool) or prf != 1
    )


def _partial_rotary_refusal(where: str, prf: Any, mt: str) -> str:
    return (
        f"{where}.partial_rotary_factor={shown(prf)} is not modelled for {mt} "
        "(transformers rotates the whole head)"
    )


def _unmodelled_features(given: dict, fam: Family, mt: str) -> list[str]:
    """The activation and RoPE features of the raw values that graphllm does not model, worded
    as the later checks word them, so that one line names them beside the refused fields
    (Phi-4-mini's path: one refusal at a time is what a user should not meet)."""
    out = []
    act = given.get(fam.act_field)
    if isinstance(act, str) and act not in fam.acts:
        out.append(_act_refusal(act, fam, mt))
    for where in ("rope_scaling", "rope_parameters"):
        raw = given.get(where)
        if not isinstance(raw, dict):
            continue
        by_type = fam.rope_by_layer_type and where == "rope_parameters"
        sections = (
            [(f"{where}.{k}", raw[k]) for k in _LAYER_TYPE_ROPES if isinstance(raw.get(k), dict)]
            if by_type and raw and set(raw) <= set(_LAYER_TYPE_ROPES)
            else [(where, raw)]
        )
        for name, section in sections:
            t4, t5 = section.get("type"), section.get("rope_type")
            rtype = t5 if t5 is not None else (t4 or "default")
            agree = t4 is None or t5 is None or t4 == t5  # else the later check names the clash
            if isinstance(rtype, str) and agree and rtype not in fam.rope_types:
                out.append(_rope_type_refusal(name, rtype, fam, mt))
            prf = section.get("partial_rotary_factor")
            if not fam.partial_rotary and _partial_rotary(prf):
                out.append(_partial_rotary_refusal(name, prf, mt))
    return out


def _ropes_by_layer_type(v: dict, fam: Family, mt: str) -> tuple[RopeConfig, RopeConfig]:
    """(the full layers' RoPE, the sliding layers') as Gemma3TextConfig reads them: from
    rope_parameters keyed by layer type (transformers 5), or rope_theta and rope_scaling for the
    full layers and rope_local_base_freq (default 10000, unscaled) for the sliding ones."""
    local = v["rope_local_base_freq"]
    params = v["rope_parameters"]
    if params is None:
        full = _rope(v, fam, mt)
        theta = 10000.0 if local is None else local
        return full, RopeConfig(theta=theta)
    if v["rope_scaling"] is not None:
        raise ConfigError("give rope_parameters (transformers 5) or rope_scaling, not both")
    if not set(params) <= set(_LAYER_TYPE_ROPES):
        bad = sorted((k for k in params if k not in _LAYER_TYPE_ROPES), key=str)[0]
        raise ConfigError(
            f"rope_parameters.{cut(str(bad))}: {mt}'s rope_parameters holds one RoPE per layer "
            f"type ({', '.join(_LAYER_TYPE_ROPES)})"
        )
    out = []
    for kind, top, default in ((FULL, v["rope_theta"], fam.default_theta), (SLIDING, local, 1e4)):
        inner = _mapping(f"rope_parameters.{kind}", params.get(kind) or {})
        theta = inner.get("rope_theta", top if top is not None else default)
        if top is not None and inner.get("rope_theta") not in (None, top):
            name = "rope_theta" if kind == FULL else "rope_local_base_freq"
            raise ConfigError(
                f"{name} {top} disagrees with rope_parameters.{kind}.rope_theta "
                f"{shown(inner['rope_theta'])}"
            )
        section = (f"rope_parameters.{kind}", {**inner, "rope_theta": theta})
        out.append(_rope(v | {"rope_theta": None}, fam, mt, section))
    return out[0], out[1]


def rotary_dim(v: dict, head_dim: int) -> int:
    """The channels of each head RoPE rotates (0: all): int(head_dim * partial_rotary_factor),
    as transformers' phi3 computes it."""
    prf = v.get("partial_rotary_factor")
    if prf is None or prf == 1:
        return 0
    if prf > 1:
        raise _bad("partial_rotary_factor", "at most 1", prf)
    rot = int(head_dim * prf)
    if rot < 2 or rot % 2:
        raise ConfigError(
            f"partial_rotary_factor {prf} rotates {rot} of {head_dim} channels; RoPE needs a "
            "positive even number"
        )
    return rot


def _longrope(v: dict, got: dict[str, Any], where: str) -> dict[str, Any]:
    """longrope's fields as transformers' _compute_longrope_parameters reads them: the
    config's top-level original_max_position_embeddings wins over the rope section's, factor
    defaults to the context's growth and the attention factor to sqrt(1 + ln f / ln L)."""
    inner = got.get("original_max_position_embeddings")
    orig = v.get("original_max_position_embeddings") or inner
    if orig is None:
        raise ConfigError(f"{where} of type 'longrope' needs original_max_position_embeddings")
    factor = got.get("factor", v["max_position_embeddings"] / orig)
    attention = got.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(orig))
    return {
        "type": "longrope",
        "factor": factor,
        "original_max_position_embeddings": orig,
        "attention_factor": attention,
        "short_factor": got["short_factor"],
        "long_factor": got["long_factor"],
    }


def _rope_theta(inner: Any, top: Any, fam: Family, where: str) -> float:
    """rope_theta from the rope section, the config's top level (they must agree), or the
    family's default."""
    if inner is None:
        return top if top is not None else fam.default_theta
    theta = _pos_float(f"{where}.rope_theta", inner)
    if top is not None and theta != top:
        raise ConfigError(f"rope_theta {top} disagrees with {where}.rope_theta {theta}")
    return theta


def _rope_fields(raw: dict, rtype: str, where: str) -> dict[str, Any]:
    """The rope section's fields for `rtype`, each checked by its reader; a field of another type,
    an unknown one or a missing required one is a ConfigError."""
    keys = _ROPE_KEYS[rtype]
    got: dict[str, Any] = {}
    for k, x in raw.items():
        if k not in keys:
            k = k if isinstance(k, str) and len(k) <= SHOWN_CHARS else shown(k)
            if k in _ROPE_ALL_KEYS:
                raise ConfigError(f"{where}.{k} does not apply to rope type {rtype!r}")
            raise _unknown(f"{where}.{k}", k, set(keys) | {"rope_type", "rope_theta"})
        if x is not None:
            got[k] = keys[k][0](f"{where}.{k}", x)
    missing = [k for k, (_, default) in keys.items() if default is _REQUIRED and k not in got]
    if missing:
        raise ConfigError(f"{where} of type {rtype!r} needs {missing[0]!r}")
    return got


def _rope_scaling(got: dict[str, Any], rtype: str, where: str, max_pos: int) -> dict[str, Any]:
    """RopeConfig's scaling fields for `rtype`, with transformers' defaults."""
    kw: dict[str, Any] = {"type": rtype}
    if "factor" in got:
        kw["factor"] = got["factor"]
    if rtype in ("llama3", "yarn"):
        # transformers fills the pre-scaling context length from max_position_embeddings
        kw["original_max_position_embeddings"] = got.get(
            "original_max_position_embeddings", max_pos
        )
    if rtype == "llama3":
        lo, hi = got["low_freq_factor"], got["high_freq_factor"]
        # equal factors (Llama 4 Scout's 1 and 1) leave no band between the two: transformers
        # warns and scales every wavelength past the low one, as _llama3 does
        if hi < lo:
            raise ConfigError(
                f"{where}: high_freq_factor {hi} must be at least low_freq_factor {lo}"
            )
        kw |= {"low_freq_factor": lo, "high_freq_factor": hi}
    if rtype == "yarn":
        if "factor" not in got:  # as _compute_yarn_parameters does
            kw["factor"] = max_pos / kw["original_max_position_embeddings"]
        kw |= {k: got[k] for k in ("beta_fast", "beta_slow", "truncate") if k in got}
        kw |= {k: got.get(k) for k in ("mscale", "mscale_all_dim", "attention_factor")}
    return kw


# ---------------------------------------------------------------------------------------------
# The dict -> ModelConfig conversion.


def _unknown(label: str, key: str, known: set[str] | frozenset[str]) -> ConfigError:
    # a key far longer than any field is no misspelling of one (and difflib would take long)
    short = len(key) <= 2 * max(map(len, known), default=0)
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75) if short else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown field {shown(label)}{hint}")


def _is_noop(value: Any, allowed: tuple[Any, ...]) -> bool:
    def same(a: Any) -> bool:
        # compare with types, so that `true` does not pass as 1 nor `1` as `true`
        if a is None or value is None or isinstance(a, bool) or isinstance(value, bool):
            return value is a
        if isinstance(a, (int, float)) and isinstance(value, (int, float)):
            return value == a
        return type(value) is type(a) and value == a

    return any(same(a) for a in allowed)


def _model_type(d: dict) -> str:
    if "model_type" not in d or d["model_type"] is None:
        raise ConfigError(f"missing required field 'model_type'; supported: {', '.join(SUPPORTED)}")
    mt = d["model_type"]
    if not isinstance(mt, str):
        raise _bad("model_type", "a string", mt)
    if mt in NOT_SUPPORTED:
        raise ConfigError(f"model_type {shown(mt)}: {NOT_SUPPORTED[mt]}")
    if mt not in FAMILY_TABLE:
        close = difflib.get_close_matches(mt, SUPPORTED, n=1, cutoff=0.6) if len(mt) < 40 else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"unknown model_type {shown(mt)}; {hint}supported: {', '.join(SUPPORTED)}"
        )
    return mt


def _collect(d: dict, fam: Family, mt: str) -> dict[str, Any]:
    """Check every key of `d` against the family's table; return field values with defaults."""
    given: dict[str, Any] = {}
    spelt: dict[str, str] = {}  # field name -> the key it was given under (aliases differ)
    # every field graphllm does not model, named together: fixing a config one refusal at a
    # time is what a user should not have to do
    unmodelled: list[str] = []
    for key, value in d.items():
        if not isinstance(key, str):
            raise ConfigError(f"field names must be strings, got {_describe(key)}")
        if key == "model_type" or key in BOOKKEEPING:
            continue
        noop = fam.noop_only.get(key, NOOP_ONLY.get(key))
        if noop is not None and key not in fam.fields:  # a family's own field is read as one
            if not _is_noop(value, noop):
                ok = " or ".join(_show(a) for a in noop)
                unmodelled.append(f"{key}={_show(value)} is not modelled (only {ok})")
            continue
        name = fam.aliases.get(key, key)
        if name not in fam.fields:
            if key in _ALL_FIELDS:
                unmodelled.append(f"field {key!r} is not used by model_type {mt!r}")
                continue
            known = set(fam.fields) | set(fam.aliases) | set(NOOP_ONLY) | BOOKKEEPING
            unmodelled.append(str(_unknown(key, key, known)))
            continue
        if given.get(name) is not None and value is not None:
            # both spellings given (num_experts and num_local_experts): they must agree
            check = fam.fields[name].check
            if check(key, value) != check(spelt[name], given[name]):
                raise ConfigError(
                    f"{key}={shown(value)} disagrees with {spelt[name]}={shown(given[name])}"
                )
        if value is not None or name not in given:
            given[name], spelt[name] = value, key

    if fam.unmodelled is not None:
        unmodelled += fam.unmodelled(given)
    unmodelled += _unmodelled_features(given, fam, mt)
    if unmodelled:
        raise ConfigError("; ".join(unmodelled))
    v: dict[str, Any] = {}
    for name, spec in fam.fields.items():
        value = given.get(name)
        if value is None and not (spec.nullable and name in given):
            if spec.default is _REQUIRED:
                if name in given:
                    raise ConfigError(f"required field {name!r} is null")
                raise ConfigError(f"missing required field {name!r} for model_type {mt!r}")
            value = spec.default
        v[name] = value if value is None else spec.check(name, value)
    return v


def _attention_shape(v: dict) -> tuple[int, int]:
    """(num_key_value_heads, head_dim) checked against each other."""
    heads, hidden = v["num_attention_heads"], v["hidden_size"]
    kv = v["num_key_value_heads"] or heads
    if heads % kv:
        raise ConfigError(
            f"num_attention_heads {heads} is not divisible by num_key_value_heads {kv}"
        )
    head_dim = v["head_dim"]
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(
                f"hidden_size {hidden} is not divisible by num_attention_heads {heads} "
                "(give head_dim explicitly if that is intended)"
            )
        head_dim = hidden // heads
    if head_dim % 2:
        raise ConfigError(f"head_dim {head_dim} must be even: RoPE rotates pairs of channels")
    return kv, head_dim


def _layer_types(v: dict, fam: Family, mt: str) -> tuple[tuple[str, ...], int | None]:
    derived, window = fam.windows(v)
    given, n = v.get("layer_types"), v["num_hidden_layers"]
    if given is None:
        types = derived
    else:
        bad = [t for t in given if t not in fam.layer_kinds]
        if bad:
            kinds = " and ".join(repr(k) for k in fam.layer_kinds)
            raise ConfigError(f"layer_types has {shown(bad[0])}; graphllm models {kinds} for {mt}")
        if len(given) != n:
            raise ConfigError(f"layer_types has {len(given)} entries for {n} hidden layers")
        types = tuple(given)
        if not fam.reads_layer_types and types != derived:
            raise ConfigError(
                f"layer_types disagrees with the window fields, and transformers' {mt} "
                "ignores layer_types; set sliding_window instead"
            )
        if SLIDING in types and window is None:
            raise ConfigError(
                "layer_types has sliding_attention layers but no sliding window is on "
                "(use_sliding_window / sliding_window)"
            )
    return types, (window if SLIDING in types else None)


def _text_decoder(d: dict, mt: str, name: str) -> ModelConfig:
    """A multimodal config (gemma3) as its text decoder: text_config (Gemma3Config's default
    text model where it has none), with the top level's tie_word_embeddings."""
    text_mt, other_parts = MULTIMODAL[mt]
    own = {"model_type", "text_config", "tie_word_embeddings", "initializer_range"}
    unknown = [k for k in d if k not in own | other_parts | BOOKKEEPING]
    if unknown:
        known = own | other_parts | BOOKKEEPING
        wrapper = "; ".join(str(_unknown(str(k), str(k), known)) for k in unknown)
        # text_config's own unmodelled fields join the line, so one fix round covers both
        try:
            if isinstance(d.get("text_config"), dict):
                _text_decoder({k: v for k, v in d.items() if k not in unknown}, mt, name)
        except ConfigError as e:
            raise ConfigError(f"{wrapper}; {e}") from None
        raise ConfigError(wrapper)
    text = d.get("text_config")
    text = dict(_mapping("text_config", {} if text is None else text))
    inner = text.setdefault("model_type", text_mt)
    if inner != text_mt:
        raise ConfigError(
            f"text_config.model_type is {shown(inner)}; a {mt} config's text model is {text_mt}"
        )
    tie = d.get("tie_word_embeddings")
    if tie is not None:
        if text.get("tie_word_embeddings", tie) != tie:
            raise ConfigError(
                f"tie_word_embeddings {_show(tie)} disagrees with text_config's "
                f"{_show(text['tie_word_embeddings'])}"
            )
        text["tie_word_embeddings"] = tie
    try:
        cfg = config_from_dict(text, name)
    except ConfigError as e:
        raise ConfigError(f"text_config: {e}") from None
    quant = _quantization(d)  # the top level's; a text_config's own was read with it
    if quant is not None:
        if cfg.quantization is not None and cfg.quantization != quant:
            raise ConfigError("quantization_config: the top level's and text_config's differ")
        cfg = replace(cfg, quantization=quant)
    return replace(cfg, text_decoder_of=mt)


def _quantization(d: dict) -> Quantization | None:
    """The config's quantization_config, with its torch_dtype for the unquantized tensors."""
    section = d.get("quantization_config")
    if section is None:
        return None
    dt = d.get("dtype", d.get("torch_dtype")) or "bf16"
    try:
        dtype = Workload(dtype=dt).weight_dtype
    except ConfigError:
        raise ConfigError(f"torch_dtype {_show(dt)} of a quantized checkpoint is unknown") from None
    return parse_quantization(section, dtype)


def config_from_dict(d: dict, name: str) -> ModelConfig:
    """Validate a config dict (HF config.json field names) and normalise it to a ModelConfig."""
    if not isinstance(d, dict):
        raise ConfigError(f"a model config must be a mapping, got {_describe(d)}")
    if isinstance(d.get("model_type"), str) and d["model_type"] in MULTIMODAL:
        return _text_decoder(d, d["model_type"], name)
    mt = _model_type(d)
    fam = FAMILY_TABLE[mt]
    v = _collect(d, fam, mt)
    if fam.prepare is not None:
        v = fam.prepare(v)

    if fam.mla:
        kv, head_dim = v["num_attention_heads"], v["qk_nope_head_dim"] + v["qk_rope_head_dim"]
    else:
        kv, head_dim = _attention_shape(v)
    act = fam.acts.get(v[fam.act_field])
    if act is None:
        raise ConfigError(_act_refusal(v[fam.act_field], fam, mt))
    types, window = _layer_types(v, fam, mt)
    n = v["num_hidden_layers"]
    kw: dict[str, Any] = {
        "intermediate_size": v["intermediate_size"],
        "moe_layers": (False,) * n,
        "rms_norm_eps": v.get("rms_norm_eps"),  # a family naming it otherwise derives it
    }
    if fam.moe is not None:
        kw |= fam.moe(v)
        if kw["num_experts_per_tok"] > kw["num_experts"]:
            raise ConfigError(
                f"num_experts_per_tok {kw['num_experts_per_tok']} exceeds the "
                f"{kw['num_experts']} experts"
            )
        if not any(kw["moe_layers"]):
            # no layer routes (decoder_sparse_step beyond the depth): a dense model
            kw = {k: kw[k] for k in ("intermediate_size", "moe_layers", "rms_norm_eps")}
    kw |= fam.derive(v)

    if fam.rope_by_layer_type:
        rope, sliding = _ropes_by_layer_type(v, fam, mt)
        # one RoPE for every layer where the sliding layers' is the same (or there are none)
        if sliding != rope and SLIDING in types:
            kw["sliding_rope"] = sliding
    else:
        rope = _rope(v, fam, mt)
    if fam.partial_rotary:
        if v.get("partial_rotary_factor") is None:  # given neither at the top nor in the rope
            v["partial_rotary_factor"] = fam.default_partial_rotary
        kw["rotary_dim"] = rotary_dim(v, head_dim)
    rope_layers = kw.pop("rope_layers", ())  # a family's NoPE layers; else RoPE in every layer
    if fam.mla:
        kw["attention_scale"] = mla_attention_scale(rope, head_dim)
    return ModelConfig(
        name=name,
        model_type=mt,
        vocab_size=v["vocab_size"],
        hidden_size=v["hidden_size"],
        num_hidden_layers=n,
        num_attention_heads=v["num_attention_heads"],
        num_key_value_heads=kv,
        head_dim=head_dim,
        hidden_act=act,
        rope=rope,
        max_position_embeddings=v["max_position_embeddings"],
        tie_word_embeddings=v["tie_word_embeddings"],
        block=fam.block,
        layer_types=types,
        # a family's NoPE layers, or (Cohere 2) RoPE in the sliding-window layers alone
        rope_layers=tuple(t == SLIDING for t in types) if fam.rope_on_sliding_only else rope_layers,
        sliding_window=window,
        quantization=_quantization(d),
        **kw,
    )


# ---------------------------------------------------------------------------------------------
# Files, presets and the workload section.


def _read(path: Path) -> dict:
    """Parse a .json or .yaml file into a dict; every failure is one ConfigError line."""
    return read_mapping(path)


def _preset_path(name: str) -> Path:
    return PRESETS_DIR / f"{name}.json"


def preset_names() -> list[str]:
    """Names of the packaged presets, sorted."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.json"))


def preset_aliases() -> dict[str, str]:
    """The presets' other names (the Hub's spellings, each preset file's `_aliases`) -> the
    preset each names."""
    out: dict[str, str] = {}
    for name in preset_names():
        for alias in _read(_preset_path(name)).get("_aliases", []):
            out[alias] = name
    return out


def preset_name(name: str) -> str:
    """The preset `name` names: itself, or the one it is an alias of (any letter case, as the
    Hub's own names are case-insensitive)."""
    names = preset_names()
    if name in names or len(name) >= 256:
        return name
    # a preset's own name in the Hub's letter case (MiniMax-M2) is that preset too
    folded = {n.lower(): n for n in names}
    folded |= {alias.lower(): preset for alias, preset in preset_aliases().items()}
    return folded.get(name.lower(), name)


def preset_of_repo_id(repo_id: str) -> str | None:
    """The preset a Hub repo id names (`google/gemma-2-9b`): the one published under it, or an
    alias of a preset published by the same owner (`google/gemma-3-1b-pt`); None for any
    other, so that a fine-tune under another owner is never read as the base model's preset."""
    owner, _, repo = repo_id.partition("/")
    if not owner or not repo or "/" in repo or len(repo_id) >= 256:
        return None
    aliases = {a.lower(): p for a, p in preset_aliases().items()}
    for name in preset_names():
        source = str(_read(_preset_path(name)).get("_source", ""))
        if source.lower() == repo_id.lower():
            return name
        same_owner = source.lower().partition("/")[0] == owner.lower()
        if same_owner and aliases.get(repo.lower(), repo.lower()) == name:
            return name
    return None


def _load_preset(name: str) -> tuple[dict, str]:
    """A preset's published config.json (without the `_` notes) and its HF repo id."""
    name = preset_name(name)
    path = _preset_path(name)
    if name not in preset_names():  # not a stat of the name: it may be 5000 characters long
        names = preset_names()
        close = difflib.get_close_matches(name, names, n=3, cutoff=0.5) if len(name) < 64 else []
        hint = f"did you mean {', '.join(close)}? " if close else ""
        # the list, not the names: it grows with every family and would not fit on a line
        raise ConfigError(
            f"unknown preset {shown(name)}; {hint}`graphllm presets` lists the {len(names)} "
            "presets and their aliases"
        )
    d = _read(path)
    source = str(d.pop("_source", ""))
    d.pop("_note", None)
    d.pop("_aliases", None)
    return d, source


def _looks_like_path(s: str) -> bool:
    return "/" in s or "\\" in s or s.lower().endswith((".json", ".yaml", ".yml"))


def _file_name(path: Path) -> str:
    # checkpoints keep config.json in a folder named after the model
    if path.name == "config.json":
        return path.resolve().parent.name or "config"
    return path.stem


def load_config(source: str | Path | dict) -> ModelConfig:
    """Load a ModelConfig from a config.json / YAML path, a folder, a preset name or a dict."""
    if isinstance(source, dict):
        raw = source.get("_name_or_path")
        name = raw.rstrip("/").split("/")[-1] if isinstance(raw, str) and raw.strip("/") else ""
        return config_from_dict(source, name or str(source.get("model_type", "config")))
    if isinstance(source, str) and not source.strip():
        raise ConfigError("empty config source; give a path, a preset name or a dict")
    if isinstance(source, str) and not _looks_like_path(source) and file_mode(source) is None:
        d, _ = _load_preset(source)
        return config_from_dict(d, preset_name(source))
    if not isinstance(source, (str, Path)):
        raise ConfigError(
            f"a config source must be a path, preset name or dict, got {_describe(source)}"
        )
    # the Hub's own spelling of a preset's model, where no such file exists here
    missing = isinstance(source, str) and file_mode(source) is None
    repo_preset = preset_of_repo_id(source) if missing else None
    if repo_preset is not None:
        d, _ = _load_preset(repo_preset)
        return config_from_dict(d, repo_preset)
    path = Path(source)
    mode = file_mode(path)
    if mode is not None and stat.S_ISDIR(mode):
        folder, path = path, path / "config.json"
        if file_mode(path) is None and not path.is_symlink():  # one there but no file: read says
            raise ConfigError(f"{shown_path(folder)}: folder has no config.json")
        if path.is_symlink():  # a checkpoint's config.json may be one: it must stay inside
            folder_member(folder, "config.json", shown_path(folder), ConfigError)
        note_input(folder)  # a checkpoint: no output of this run may replace a file in it
    d = _read(path)
    if path.suffix.lower() in (".yaml", ".yml"):
        d.pop("workload", None)
    return config_from_dict(d, _file_name(path))


WORKLOAD_KEYS = (
    "batch",
    "seq_len",
    "past_len",
    "dtype",
    "weight_dtype",
    "act_dtype",
    "kv_dtype",
    "logits",
)


def load_workload_section(path: str | Path) -> dict:
    """The YAML file's `workload:` section, validated; {} when there is none or not a YAML file."""
    path = Path(path)
    if path.suffix.lower() not in (".yaml", ".yml") or not path.is_file():
        return {}
    section = _read(path).get("workload")
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError(
            f"{shown_path(path)}: workload must be a mapping, got {_describe(section)}"
        )
    for key, value in section.items():
        if key not in WORKLOAD_KEYS:
            raise _unknown(f"workload.{cut(str(key))}", str(key), set(WORKLOAD_KEYS))
        if key.endswith("dtype") and value is not None and not isinstance(value, str):
            raise _bad(f"workload.{key}", "a dtype name", value)
    Workload.with_dtype(**section)  # raises ConfigError naming the bad value
    return dict(section)


def list_presets() -> list[tuple[str, str]]:
    """(name, one-line description with the HF repo id) for every packaged preset, then
    (alias, the preset it names) for each alias."""
    out = []
    for name in preset_names():
        also = _read(_preset_path(name)).get("_aliases", ())
        d, source = _load_preset(name)
        c = config_from_dict(d, name)
        moe = f", {c.num_experts} experts top-{c.num_experts_per_tok}" if c.is_moe else ""
        aliases = f"; also {', '.join(also)}" if also else ""
        out.append(
            (
                name,
                f"{source}: {c.model_type}"
                + (f" (the text decoder of {c.text_decoder_of})" if c.text_decoder_of else "")
                + f", {c.num_hidden_layers} layers, d={c.hidden_size}, "
                f"{c.num_attention_heads}/{c.num_key_value_heads} heads{moe}{aliases}",
            )
        )
    for alias, name in sorted(preset_aliases().items()):
        out.append((alias, f"alias of {name}"))
    return out
