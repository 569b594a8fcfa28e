"""A config's RoPE: transformers-4 `rope_theta` + `rope_scaling`, or transformers-5
`rope_parameters` (one section, or one per layer type as Gemma 3 keys it), read into RopeConfig
with transformers' defaults for each rope type; and the RoPE features a family does not model."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from graphllm.echo import SHOWN_CHARS, cut, shown
from graphllm.errors import ConfigError
from graphllm.models.family import FULL, SLIDING, Family
from graphllm.models.fields import (
    REQUIRED,
    flag,
    float_list,
    malformed,
    mapping,
    pos_float,
    pos_int,
    string,
    unknown_field,
)
from graphllm.models.model_config import RopeConfig

# per rope type: its keys and their checks; `REQUIRED` marks keys without a default
_ROPE_KEYS: dict[str, dict[str, tuple[Callable, Any]]] = {
    "default": {},
    "linear": {"factor": (pos_float, REQUIRED)},
    "llama3": {
        "factor": (pos_float, REQUIRED),
        "low_freq_factor": (pos_float, REQUIRED),
        "high_freq_factor": (pos_float, REQUIRED),
        "original_max_position_embeddings": (pos_int, None),
    },
    "yarn": {
        "factor": (pos_float, None),
        "original_max_position_embeddings": (pos_int, None),
        "attention_factor": (pos_float, None),
        "beta_fast": (pos_float, None),
        "beta_slow": (pos_float, None),
        "mscale": (pos_float, None),
        "mscale_all_dim": (pos_float, None),
        "truncate": (flag, None),
    },
    "longrope": {
        "short_factor": (float_list, REQUIRED),
        "long_factor": (float_list, REQUIRED),
        "factor": (pos_float, None),
        "attention_factor": (pos_float, None),
        "original_max_position_embeddings": (pos_int, None),
    },
}
_ROPE_ALL_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"} | {
    k for keys in _ROPE_KEYS.values() for k in keys
}


def read_rope(
    v: dict, fam: Family, model_type: str, section: tuple[str, dict | None] | None = None
) -> RopeConfig:
    """The RoPE of `v`'s rope fields; `section` is (its name, its fields) where one RoPE of
    several is read (a layer type's in Gemma 3's rope_parameters)."""
    if section is None:
        if v["rope_scaling"] is not None and v["rope_parameters"] is not None:
            raise ConfigError("give rope_parameters (transformers 5) or rope_scaling, not both")
        where = "rope_parameters" if v["rope_parameters"] is not None else "rope_scaling"
        section = (where, v[where])
    where, raw = section[0], dict(mapping(section[0], section[1] or {}))
    t4, t5 = raw.pop("type", None), raw.pop("rope_type", None)
    if t4 is not None and t5 is not None and t4 != t5:
        raise ConfigError(f"{where} has type {shown(t4)} and rope_type {shown(t5)}; give one")
    rtype = string(f"{where}.rope_type", t5 if t5 is not None else (t4 or "default"))
    if rtype not in fam.rope_types:
        raise ConfigError(rope_type_refusal(where, rtype, fam, model_type))
    theta = _rope_theta(raw.pop("rope_theta", None), v["rope_theta"], fam, where)
    prf = raw.pop("partial_rotary_factor", None)
    if not fam.partial_rotary:
        if partial_rotary(prf):
            raise ConfigError(partial_rotary_refusal(where, prf, model_type))
    elif prf is not None:
        prf = pos_float(f"{where}.partial_rotary_factor", prf)
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


LAYER_TYPE_ROPES = (FULL, SLIDING)


def rope_type_refusal(where: str, rtype: str, fam: Family, mt: str) -> str:
    known = ", ".join(fam.rope_types)
    return f"{where}: rope type {shown(rtype)} is not modelled for {mt} (modelled: {known})"


def partial_rotary(prf: Any) -> bool:
    """Whether a rope section's partial_rotary_factor rotates less than the whole head."""
    return prf is not None and (
        not isinstance(prf, (int, float)) or isinstance(prf, bool) or prf != 1
    )


def partial_rotary_refusal(where: str, prf: Any, mt: str) -> str:
    return (
        f"{where}.partial_rotary_factor={shown(prf)} is not modelled for {mt} "
        "(transformers rotates the whole head)"
    )


def ropes_by_layer_type(v: dict, fam: Family, mt: str) -> tuple[RopeConfig, RopeConfig]:
    """(the full layers' RoPE, the sliding layers') as Gemma3TextConfig reads them: from
    rope_parameters keyed by layer type (transformers 5), or rope_theta and rope_scaling for the
    full layers and rope_local_base_freq (default 10000, unscaled) for the sliding ones."""
    local = v["rope_local_base_freq"]
    params = v["rope_parameters"]
    if params is None:
        full = read_rope(v, fam, mt)
        theta = 10000.0 if local is None else local
        return full, RopeConfig(theta=theta)
    if v["rope_scaling"] is not None:
        raise ConfigError("give rope_parameters (transformers 5) or rope_scaling, not both")
    if not set(params) <= set(LAYER_TYPE_ROPES):
        bad = sorted((k for k in params if k not in LAYER_TYPE_ROPES), key=str)[0]
        raise ConfigError(
            f"rope_parameters.{cut(str(bad))}: {mt}'s rope_parameters holds one RoPE per layer "
            f"type ({', '.join(LAYER_TYPE_ROPES)})"
        )
    out = []
    for kind, top, default in ((FULL, v["rope_theta"], fam.default_theta), (SLIDING, local, 1e4)):
        inner = mapping(f"rope_parameters.{kind}", params.get(kind) or {})
        theta = inner.get("rope_theta", top if top is not None else default)
        if top is not None and inner.get("rope_theta") not in (None, top):
            name = "rope_theta" if kind == FULL else "rope_local_base_freq"
            raise ConfigError(
                f"{name} {top} disagrees with rope_parameters.{kind}.rope_theta "
                f"{shown(inner['rope_theta'])}"
            )
        section = (f"rope_parameters.{kind}", {**inner, "rope_theta": theta})
        out.append(read_rope(v | {"rope_theta": None}, fam, mt, section))
    return out[0], out[1]


def rotary_dim(v: dict, head_dim: int) -> int:
    """The channels of each head RoPE rotates (0: all): int(head_dim * partial_rotary_factor),
    as transformers' phi3 computes it."""
    prf = v.get("partial_rotary_factor")
    if prf is None or prf == 1:
        return 0
    if prf > 1:
        raise malformed("partial_rotary_factor", "at most 1", prf)
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
    theta = pos_float(f"{where}.rope_theta", inner)
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
            raise unknown_field(f"{where}.{k}", k, set(keys) | {"rope_type", "rope_theta"})
        if x is not None:
            got[k] = keys[k][0](f"{where}.{k}", x)
    missing = [k for k, (_, default) in keys.items() if default is REQUIRED and k not in got]
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
