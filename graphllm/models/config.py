"""Load a model config (HF config.json, YAML, preset name or dict) into a normalised ModelConfig.

The semantics follow transformers 5.x's own config and modeling code for each family: which
biases exist, the defaults, how `layer_types` is derived, what a MoE layer is. Both the
transformers-4 spelling (`rope_theta` + `rope_scaling`, `torch_dtype`) and the transformers-5 one
(`rope_parameters`, `dtype`, `layer_types`) load to the same ModelConfig.
Each family's fields, aliases and rules are data in graphllm/models/families/, one module a
family; this module reads a config against them and never names a family.

Every problem raises ConfigError with one line naming the field. Nothing that changes the
computation is silently ignored: an unknown key, or a known feature graphllm does not model
(logit soft-capping, ...), is an error; all of a config's such fields are named in one line.
"""

from __future__ import annotations

import difflib
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from graphllm.echo import cut, shown, shown_path
from graphllm.errors import ConfigError
from graphllm.files import note_input
from graphllm.models.families import FAMILY_TABLE, MULTIMODAL
from graphllm.models.family import SLIDING, Family, mla_attention_scale
from graphllm.models.fields import REQUIRED, Spec, malformed, mapping, unknown_field
from graphllm.models.folder import folder_member
from graphllm.models.model_config import ModelConfig, RopeConfig
from graphllm.models.parse import describe, file_mode, read_mapping, show
from graphllm.models.quantization import Quantization, parse_quantization
from graphllm.models.rope_fields import (
    LAYER_TYPE_ROPES,
    partial_rotary,
    partial_rotary_refusal,
    read_rope,
    rope_type_refusal,
    ropes_by_layer_type,
    rotary_dim,
)
from graphllm.models.workload import Workload

PRESETS_DIR = Path(__file__).parent / "presets"

NOT_SUPPORTED = {
    "deepseek": "DeepSeek-MoE v1 is not planned; DeepSeek-V2/V3 are on the roadmap",
    # the other Mamba2 hybrids reuse Nemotron-H's mixer and come later
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


SUPPORTED = (*FAMILY_TABLE, *MULTIMODAL)  # the model_types a config may name
# where a command builds families only: the commands that read the model from transformers' code
TRACED_HINT = (
    " (graphllm builds no family for it; trace, render, export, report, partition, serving, "
    "verify tokens and verify partition read it from transformers' code)"
)

# every key some family or rope dict understands: to tell "wrong family" from "misspelt"
_ALL_FIELDS = frozenset(k for fam in FAMILY_TABLE.values() for k in (*fam.fields, *fam.aliases))


# ---------------------------------------------------------------------------------------------
# The dict -> ModelConfig conversion.


def _act_refusal(act: Any, fam: Family, mt: str) -> str:
    return (
        f"{fam.act_field} {shown(act)} is not modelled for {mt} (modelled: {', '.join(fam.acts)})"
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
            [(f"{where}.{k}", raw[k]) for k in LAYER_TYPE_ROPES if isinstance(raw.get(k), dict)]
            if by_type and raw and set(raw) <= set(LAYER_TYPE_ROPES)
            else [(where, raw)]
        )
        for name, section in sections:
            t4, t5 = section.get("type"), section.get("rope_type")
            rtype = t5 if t5 is not None else (t4 or "default")
            agree = t4 is None or t5 is None or t4 == t5  # else the later check names the clash
            if isinstance(rtype, str) and agree and rtype not in fam.rope_types:
                out.append(rope_type_refusal(name, rtype, fam, mt))
            prf = section.get("partial_rotary_factor")
            if not fam.partial_rotary and partial_rotary(prf):
                out.append(partial_rotary_refusal(name, prf, mt))
    return out


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
        raise malformed("model_type", "a string", mt)
    if mt in NOT_SUPPORTED:
        raise ConfigError(f"model_type {shown(mt)}: {NOT_SUPPORTED[mt]}{TRACED_HINT}")
    if mt not in FAMILY_TABLE:
        close = difflib.get_close_matches(mt, SUPPORTED, n=1, cutoff=0.6) if len(mt) < 40 else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(
            f"unknown model_type {shown(mt)}; {hint}supported: {', '.join(SUPPORTED)}{TRACED_HINT}"
        )
    return mt


def _same_value(spec: Spec, one: tuple[str, Any], other: tuple[str, Any]) -> None:
    """A field given under two spellings (a family's aliases: transformers' attribute_map, a
    published file's legacy name beside the modelled one) must say the same: null is "not given"
    unless null is a value of the field's own (sliding_window: null switches the window off)."""
    (key, value), (key2, value2) = one, other
    if value is None or value2 is None:
        same = not spec.nullable or value is value2
    else:
        same = spec.check(key, value) == spec.check(key2, value2)
    if not same:
        raise ConfigError(f"{key}={show(value)} disagrees with {key2}={show(value2)}")


def _collect(d: dict, fam: Family, mt: str) -> dict[str, Any]:
    """Check every key of `d` against the family's table; return field values with defaults."""
    given: dict[str, Any] = {}
    spelt: dict[str, str] = {}  # field name -> the key it was given under (aliases differ)
    # every field graphllm does not model, named together: fixing a config one refusal at a
    # time is what a user should not have to do
    unmodelled: list[str] = []
    for key, value in d.items():
        if not isinstance(key, str):
            raise ConfigError(f"field names must be strings, got {describe(key)}")
        if key == "model_type" or key in BOOKKEEPING:
            continue
        noop = fam.noop_only.get(key, NOOP_ONLY.get(key))
        if noop is not None and key not in fam.fields:  # a family's own field is read as one
            if not _is_noop(value, noop):
                ok = " or ".join(show(a) for a in noop)
                unmodelled.append(f"{key}={show(value)} is not modelled (only {ok})")
            continue
        name = fam.aliases.get(key, key)
        if name not in fam.fields:
            if key in _ALL_FIELDS:
                unmodelled.append(f"field {key!r} is not used by model_type {mt!r}")
                continue
            known = set(fam.fields) | set(fam.aliases) | set(NOOP_ONLY) | BOOKKEEPING
            unmodelled.append(str(unknown_field(key, key, known)))
            continue
        if name in given:
            _same_value(fam.fields[name], (key, value), (spelt[name], given[name]))
        if value is not None or name not in given:
            given[name], spelt[name] = value, key

    if fam.unmodelled is not None:
        unmodelled += fam.unmodelled(given)
    unmodelled += _unmodelled_features(given, fam, mt)
    if unmodelled:
        raise ConfigError("; ".join(unmodelled))
    _require(given, fam, mt)
    v: dict[str, Any] = {}
    for name, spec in fam.fields.items():
        value = given.get(name)
        if value is None and not (spec.nullable and name in given):
            value = spec.default
        v[name] = value if value is None else spec.check(name, value)
    return v


def _require(given: dict[str, Any], fam: Family, mt: str) -> None:
    """Every required field given, or one line naming all that are not (null or missing)."""
    required = [n for n, spec in fam.fields.items() if spec.default is REQUIRED]
    null = [n for n in required if n in given and given[n] is None]
    missing = [n for n in required if n not in given]
    problems = [f"required field {n!r} is null" for n in null]
    if missing:
        names = ", ".join(repr(n) for n in missing)
        field = "field" if len(missing) == 1 else "fields"
        problems.append(f"missing required {field} {names} for model_type {mt!r}")
    if problems:
        raise ConfigError("; ".join(problems))


def _attention_shape(v: dict, fam: Family) -> tuple[int, int]:
    """(num_key_value_heads, head_dim) checked against each other; MLA's is one K/V per query
    head, its query/key heads nope + rope wide."""
    if fam.mla:
        return v["num_attention_heads"], v["qk_nope_head_dim"] + v["qk_rope_head_dim"]
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
    text_mt, other_parts = MULTIMODAL[mt].text, MULTIMODAL[mt].parts
    own = {"model_type", "text_config", "tie_word_embeddings", "initializer_range"}
    unknown = [k for k in d if k not in own | other_parts | BOOKKEEPING]
    if unknown:
        known = own | other_parts | BOOKKEEPING
        wrapper = "; ".join(str(unknown_field(str(k), str(k), known)) for k in unknown)
        # text_config's own unmodelled fields join the line, so one fix round covers both
        try:
            if isinstance(d.get("text_config"), dict):
                _text_decoder({k: v for k, v in d.items() if k not in unknown}, mt, name)
        except ConfigError as e:
            raise ConfigError(f"{wrapper}; {e}") from None
        raise ConfigError(wrapper)
    text = d.get("text_config")
    text = dict(mapping("text_config", {} if text is None else text))
    inner = text.setdefault("model_type", text_mt)
    if inner != text_mt:
        raise ConfigError(
            f"text_config.model_type is {shown(inner)}; a {mt} config's text model is {text_mt}"
        )
    tie = d.get("tie_word_embeddings")
    if tie is not None:
        if text.get("tie_word_embeddings", tie) != tie:
            raise ConfigError(
                f"tie_word_embeddings {show(tie)} disagrees with text_config's "
                f"{show(text['tie_word_embeddings'])}"
            )
        text["tie_word_embeddings"] = tie
    try:
        cfg = config_from_dict(text, name)
    except ConfigError as e:
        raise ConfigError(f"text_config: {e}") from None
    quant = quantization_of(d)  # the top level's; a text_config's own was read with it
    if quant is not None:
        if cfg.quantization is not None and cfg.quantization != quant:
            raise ConfigError("quantization_config: the top level's and text_config's differ")
        cfg = replace(cfg, quantization=quant)
    return replace(cfg, text_decoder_of=mt)


def quantization_of(d: dict) -> Quantization | None:
    """The config's quantization_config, with its torch_dtype for the unquantized tensors."""
    section = d.get("quantization_config")
    if section is None:
        return None
    dt = d.get("dtype", d.get("torch_dtype")) or "bf16"
    try:
        dtype = Workload(dtype=dt).weight_dtype
    except ConfigError:
        raise ConfigError(f"torch_dtype {show(dt)} of a quantized checkpoint is unknown") from None
    return parse_quantization(section, dtype)


def _ffn(v: dict, fam: Family) -> dict[str, Any]:
    """The FFN fields: a dense MLP in every layer, or the family's MoE layout."""
    kw: dict[str, Any] = {
        "intermediate_size": v["intermediate_size"],
        "moe_layers": (False,) * v["num_hidden_layers"],
        "rms_norm_eps": v.get("rms_norm_eps"),  # a family naming it otherwise derives it
    }
    if fam.moe is None:
        return kw
    moe = kw | fam.moe(v)
    if moe["num_experts_per_tok"] > moe["num_experts"]:
        raise ConfigError(
            f"num_experts_per_tok {moe['num_experts_per_tok']} exceeds the "
            f"{moe['num_experts']} experts"
        )
    # no layer routes (decoder_sparse_step beyond the depth): a dense model
    return moe if any(moe["moe_layers"]) else {k: moe[k] for k in kw}


def _rope(
    v: dict, fam: Family, mt: str, types: tuple[str, ...], head_dim: int
) -> tuple[RopeConfig, dict[str, Any]]:
    """The RoPE of the (full-attention) layers, and the ModelConfig fields it decides: the
    sliding layers' own RoPE, the rotated channels, MLA's attention scale. Read after the
    family's derive, which may normalise partial_rotary_factor (MiniMax-M2's rotary_dim)."""
    kw: dict[str, Any] = {}
    if fam.rope_by_layer_type:
        rope, sliding = ropes_by_layer_type(v, fam, mt)
        # one RoPE for every layer where the sliding layers' is the same (or there are none)
        if sliding != rope and SLIDING in types:
            kw["sliding_rope"] = sliding
    else:
        rope = read_rope(v, fam, mt)
    if fam.partial_rotary:
        if v.get("partial_rotary_factor") is None:  # given neither at the top nor in the rope
            v["partial_rotary_factor"] = fam.default_partial_rotary
        kw["rotary_dim"] = rotary_dim(v, head_dim)
    if fam.mla:
        kw["attention_scale"] = mla_attention_scale(rope, head_dim)
    return rope, kw


def config_from_dict(d: dict, name: str) -> ModelConfig:
    """Validate a config dict (HF config.json field names) and normalise it to a ModelConfig."""
    if not isinstance(d, dict):
        raise ConfigError(f"a model config must be a mapping, got {describe(d)}")
    if isinstance(d.get("model_type"), str) and d["model_type"] in MULTIMODAL:
        return _text_decoder(d, d["model_type"], name)
    mt = _model_type(d)
    fam = FAMILY_TABLE[mt]
    v = _collect(d, fam, mt)
    if fam.prepare is not None:
        v = fam.prepare(v)

    kv, head_dim = _attention_shape(v, fam)
    act = fam.acts.get(v[fam.act_field])
    if act is None:
        raise ConfigError(_act_refusal(v[fam.act_field], fam, mt))
    types, window = _layer_types(v, fam, mt)
    n = v["num_hidden_layers"]
    kw = _ffn(v, fam)
    kw |= fam.derive(v)

    rope, rope_kw = _rope(v, fam, mt, types, head_dim)
    kw |= rope_kw
    rope_layers = kw.pop("rope_layers", ())  # a family's NoPE layers; else RoPE in every layer
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
        quantization=quantization_of(d),
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
    return config_from_dict(*read_config_source(source))


def read_config_source(source: str | Path | dict) -> tuple[dict, str]:
    """The fields of a config.json / YAML path, a folder, a preset name or a dict, and the
    model's name (its folder's, its preset's), before any family reads them."""
    if isinstance(source, dict):
        raw = source.get("_name_or_path")
        name = raw.rstrip("/").split("/")[-1] if isinstance(raw, str) and raw.strip("/") else ""
        return source, name or str(source.get("model_type", "config"))
    if isinstance(source, str) and not source.strip():
        raise ConfigError("empty config source; give a path, a preset name or a dict")
    if isinstance(source, str) and not _looks_like_path(source) and file_mode(source) is None:
        d, _ = _load_preset(source)
        return d, preset_name(source)
    if not isinstance(source, (str, Path)):
        raise ConfigError(
            f"a config source must be a path, preset name or dict, got {describe(source)}"
        )
    # the Hub's own spelling of a preset's model, where no such file exists here
    missing = isinstance(source, str) and file_mode(source) is None
    repo_preset = preset_of_repo_id(source) if missing else None
    if repo_preset is not None:
        d, _ = _load_preset(repo_preset)
        return d, repo_preset
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
    return d, _file_name(path)


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
            f"{shown_path(path)}: workload must be a mapping, got {describe(section)}"
        )
    for key, value in section.items():
        if key not in WORKLOAD_KEYS:
            raise unknown_field(f"workload.{cut(str(key))}", str(key), set(WORKLOAD_KEYS))
        if key.endswith("dtype") and value is not None and not isinstance(value, str):
            raise malformed(f"workload.{key}", "a dtype name", value)
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
