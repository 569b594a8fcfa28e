"""Field kinds: each checks one config value and returns it normalised, or raises a ConfigError
naming the field; and `Spec`, one accepted field of a family (its kind, default, nullability)."""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphllm.echo import shown
from graphllm.errors import ConfigError
from graphllm.models.model_config import check_number, check_size
from graphllm.models.parse import describe, json_float


def malformed(name: str, want: str, v: Any) -> ConfigError:
    return ConfigError(f"{name} must be {want}, got {describe(v)}")


def is_int(v: Any) -> bool:
    # bool is an int subclass in Python; `true` for a size is a mistake, not a 1
    return isinstance(v, int) and not isinstance(v, bool)


def pos_int(name: str, v: Any) -> int:
    return check_size(name, v)


def nonneg_int(name: str, v: Any) -> int:
    return check_size(name, v, least=0)


# the sane range of a float field (by its last dotted part); others take _FLOAT_RANGE
_FLOAT_RANGES = {
    "rms_norm_eps": (1e-30, 1.0),  # a guard against 0 / 0: above 1 it outweighs the activations
    "rope_theta": (1.0, 1e15),  # published bases are 1e4 to 1e8; below 1 no RoPE was trained
    "rope_local_base_freq": (1.0, 1e15),
}
_FLOAT_RANGE = (1e-6, 1e6)  # RoPE scaling factors, routing scales: published ones are 0.1 to 40


def pos_float(name: str, v: Any) -> float:
    if not (is_int(v) or isinstance(v, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise malformed(name, "a positive number", v)
    if v <= 0:
        raise malformed(name, "a positive number", v)
    low, high = _FLOAT_RANGES.get(name.rsplit(".", 1)[-1], _FLOAT_RANGE)
    return check_number(name, v, low, high)


def flag(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise malformed(name, "true or false", v)
    return v


def string(name: str, v: Any) -> str:
    if not isinstance(v, str):
        raise malformed(name, "a string", v)
    return v


def mapping(name: str, v: Any) -> dict:
    if not isinstance(v, dict):
        raise malformed(name, "a mapping", v)
    return v


def int_list(name: str, v: Any) -> list[int]:
    if not isinstance(v, list) or not all(is_int(x) and x >= 0 for x in v):
        raise malformed(name, "a list of non-negative integers", v)
    return v


def float_list(name: str, v: Any) -> tuple[float, ...]:
    if not isinstance(v, list) or not v:
        raise malformed(name, "a non-empty list of positive numbers", v)
    return tuple(pos_float(f"{name}[{i}]", x) for i, x in enumerate(v))


def dt_limit(name: str, v: Any) -> tuple[float, float]:
    """Mamba2's dt_limit: [low, high] with 0 <= low < high."""
    if isinstance(v, (list, tuple)):
        v = [json_float(x) for x in v]
    ok = isinstance(v, (list, tuple)) and len(v) == 2
    ok = ok and all(is_int(x) or isinstance(x, float) for x in v)
    if not ok or math.isnan(v[0]) or math.isnan(v[1]) or not 0 <= v[0] < v[1]:
        raise malformed(name, "[low, high] with 0 <= low < high", v)
    if math.isinf(v[0]):
        raise malformed(name, "[low, high] with a finite low", v)
    return float(v[0]), float(v[1])  # a finite high: _nemotron_unmodelled names it


def str_list(name: str, v: Any) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise malformed(name, "a list of strings", v)
    return v


REQUIRED = object()  # no default: the config must give the field


@dataclass(frozen=True)
class Spec:
    """One accepted config field: its check, its default, and whether null means something."""

    check: Callable[[str, Any], Any]
    default: Any = REQUIRED
    # null normally means "not given" (the default applies); for a nullable field null is a
    # value of its own (sliding_window: null switches the window off)
    nullable: bool = False


COMMON: dict[str, Spec] = {
    "vocab_size": Spec(pos_int),
    "hidden_size": Spec(pos_int),
    "num_hidden_layers": Spec(pos_int),
    "num_attention_heads": Spec(pos_int),
    "num_key_value_heads": Spec(pos_int),
    "intermediate_size": Spec(pos_int),
    "head_dim": Spec(pos_int, None),
    "hidden_act": Spec(string, "silu"),
    "rms_norm_eps": Spec(pos_float, 1e-6),
    "max_position_embeddings": Spec(pos_int, 2048),
    "tie_word_embeddings": Spec(flag, False),
    "rope_theta": Spec(pos_float, None),
    "rope_scaling": Spec(mapping, None),
    "rope_parameters": Spec(mapping, None),
    "layer_types": Spec(str_list, None),
}


def common_fields(**extra: Spec) -> dict[str, Spec]:
    return {**COMMON, **extra}


MHA = Spec(pos_int, None)  # llama, phi3: num_key_value_heads defaults to num_attention_heads


def any_value(name: str, v: Any) -> Any:
    return v  # read by transformers' initialisation only, or not at all: any value


def unknown_field(label: str, key: str, known: set[str] | frozenset[str]) -> ConfigError:
    # a key far longer than any field is no misspelling of one (and difflib would take long)
    short = len(key) <= 2 * max(map(len, known), default=0)
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75) if short else []
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ConfigError(f"unknown field {shown(label)}{hint}")
