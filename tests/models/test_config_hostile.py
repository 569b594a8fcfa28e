"""Configs mutated as a careless or hostile user would: load_config returns a ModelConfig or
raises ConfigError, quickly, and nothing else escapes. Plus the pieces that make it so: the
reader's checks on the file it opens, and the shortening of values echoed in errors."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graphllm.echo import cut, shown, shown_path
from graphllm.errors import ConfigError
from graphllm.models import parse
from graphllm.models.config import PRESETS_DIR, load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.model_config import config_from_fields
from graphllm.models.parse import read_mapping
from tests.support.paths import EXAMPLES
from tests.support.tiny_configs import MODEL_CONFIG_FIELDS


def _bases() -> list[dict]:
    out = []
    for path in [*sorted(PRESETS_DIR.glob("*.json")), *sorted(EXAMPLES.glob("*.yaml"))]:
        d = read_mapping(path)
        for key in ("_source", "_note", "_aliases", "workload"):
            d.pop(key, None)
        out.append(d)
    return out


BASES = _bases()
SECONDS = 2.0  # a refusal or a load takes milliseconds; this catches a build or a hang

extreme_ints = st.sampled_from(
    [0, -1, 1, 2, 3, 1023, 1024, 1025, 2**27, 2**31, 2**63, 10**8, 10**19, 10**200, -(10**30)]
)
extreme_floats = st.sampled_from(
    [0.0, -0.0, 5e-324, 1e-310, 1e-30, 0.5, 1.0, 2.0, 1e20, 1e308, math.inf, -math.inf, math.nan]
)
strings = st.one_of(
    st.sampled_from(["", "silu", "gelu", "llama", "full_attention", "yarn", "default"]),
    st.text(max_size=20),
    st.integers(1, 200_000).map(lambda n: "x" * n),
)
scalars = st.one_of(
    st.none(), st.booleans(), extreme_ints, st.integers(), extreme_floats, st.floats(), strings
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated_configs(draw) -> dict:
    d = dict(draw(st.sampled_from(BASES)))
    keys = sorted(d)
    for _ in range(draw(st.integers(1, 4))):
        action = draw(st.sampled_from(["drop", "set", "set", "set", "add", "nest"]))
        key = draw(st.sampled_from(keys))
        if action == "drop":
            d.pop(key, None)
        elif action == "set":
            d[key] = draw(values)
        elif action == "add":
            d[draw(st.text(max_size=30))] = draw(values)
        elif isinstance(d.get(key), dict) and d[key]:
            inner = dict(d[key])
            inner[draw(st.sampled_from(sorted(inner)))] = draw(values)
            d[key] = inner
    return d


def _load_or_refuse(d: dict) -> None:
    start = time.monotonic()
    try:
        load_config(d)
    except ConfigError as e:
        message = str(e)
        assert "\n" not in message and len(message) < 400, message[:500]
    assert time.monotonic() - start < SECONDS


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_configs())
def test_a_mutated_config_loads_or_is_refused_in_one_line(d):
    _load_or_refuse(d)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(BASES), st.sampled_from(sorted({k for b in BASES for k in b})), values)
def test_any_value_in_any_field(base, key, value):
    _load_or_refuse({**base, key: value})


@settings(max_examples=80, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([".json", ".yaml"]))
def test_random_bytes_parse_or_are_refused(tmp_path_factory, data, suffix):
    path = tmp_path_factory.mktemp("bytes") / f"c{suffix}"
    path.write_bytes(data)
    try:
        assert isinstance(read_mapping(path), dict)
    except ConfigError as e:
        assert "\n" not in str(e)


@pytest.mark.parametrize(
    "fields",
    [
        {"num_hidden_layers": 10**8},  # would fill per-layer tuples of 10**8 entries
        {"num_hidden_layers": True},
        {"num_key_value_heads": 0},
        {"hidden_size": 2.0},
        {"rms_norm_eps": math.nan},
        {"vocab_size": 10**5000},
    ],
)
def test_model_config_fields_from_metadata_are_checked(fields):
    # ONNX metadata reaches ModelConfig through config_from_fields, not through load_config
    d = dict(MODEL_CONFIG_FIELDS)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=next(iter(fields))):
        config_from_fields(d | fields)
    assert time.monotonic() - start < 1


def test_every_preset_and_example_is_within_the_limits():
    for d in BASES:
        load_config(d)


def test_a_fifo_swapped_in_after_the_stat_is_refused_on_the_open_file(tmp_path, monkeypatch):
    regular, swapped = tmp_path / "regular.json", tmp_path / "c.json"
    regular.write_text("{}")
    os.mkfifo(swapped)
    real_stat = os.stat
    # the stat saw a regular file; by the open, a FIFO is there: the open must not block
    monkeypatch.setattr(parse.os, "stat", lambda p: real_stat(regular if p == swapped else p))
    with pytest.raises(ConfigError, match="is a FIFO"):
        read_mapping(swapped)


def test_a_file_grown_after_the_stat_is_read_no_further_than_the_cap(tmp_path):
    path = tmp_path / "c.json"
    path.write_text("{}" + " " * 100)
    with pytest.raises(ConfigError, match="too large"):
        parse.read_bytes(path, cap=10)


def test_a_spec_file_is_read_as_carefully_as_a_config(tmp_path):
    os.mkfifo(tmp_path / "hw.yaml")
    with pytest.raises(ConfigError, match="is a FIFO"):
        load_hardware(tmp_path / "hw.yaml")


def test_a_checkpoint_folder_whose_config_is_a_fifo_says_so(tmp_path):
    os.mkfifo(tmp_path / "config.json")
    with pytest.raises(ConfigError, match=r"config\.json: is a FIFO"):
        load_config(tmp_path)
    assert stat.S_ISFIFO(os.stat(tmp_path / "config.json").st_mode)


@pytest.mark.parametrize(
    "value",
    ["x" * 10**7, 10**5000, -(10**400), [[[[[[1]]]]]] * 1000, {"k" * 10**6: 1}, b"\x00" * 10**6],
    ids=["100-mb-string", "5000-digit-int", "negative-int", "nested-list", "long-key", "bytes"],
)
def test_shown_values_are_short(value):
    assert len(shown(value)) <= 60


def test_shown_keeps_short_values_as_repr():
    assert shown("silu") == "'silu'" and shown(3) == "3" and shown(None) == "None"
    assert "5001-digit" in shown(
        10**5000
    )  # repr() itself refuses past sys.get_int_max_str_digits()


def test_deep_nesting_is_shown_without_recursing():
    deep: list = []
    for _ in range(sys.getrecursionlimit() * 2):
        deep = [deep]
    assert len(shown(deep)) <= 60


def test_cut_and_shown_path():
    assert cut("a\nb") == "a b" and cut("x" * 100, 10) == "xxxxxxx..."
    long = Path("/" + "d" * 500) / "config.json"
    assert len(shown_path(long)) <= 160 and shown_path(long).endswith("config.json")
    assert shown_path("two\nlines.json") == "two\\nlines.json"  # the error stays one line


@pytest.mark.parametrize("source", ["a\x00b.json", "x" * 5000 + ".json", "x" * 5000])
def test_names_no_file_can_have_are_one_line(source):
    for load in (load_config, load_hardware):
        with pytest.raises(ConfigError) as e:
            load(source)
        assert len(str(e.value)) < 400 and "\n" not in str(e.value)


FIELD_DICTS = [dataclasses.asdict(load_config(d)) for d in BASES]


@st.composite
def mutated_fields(draw) -> dict:
    """A ModelConfig's fields as an ONNX file's metadata carries them, then tampered with."""
    d = json.loads(json.dumps(draw(st.sampled_from(FIELD_DICTS))))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(sorted(d)))
        action = draw(st.sampled_from(["drop", "set", "set", "nested"]))
        if action == "drop":
            d.pop(key, None)
        elif action == "nested" and isinstance(d.get(key), dict) and d[key]:
            d[key][draw(st.sampled_from([*sorted(d[key]), "bogus"]))] = draw(values)
        else:
            d[key] = draw(values)
    return d


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_fields())
def test_tampered_metadata_fields_build_a_config_or_are_refused(d):
    start = time.monotonic()
    try:
        config_from_fields(d)
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) < 400
    assert time.monotonic() - start < SECONDS
