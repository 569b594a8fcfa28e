"""A config.json's bare Infinity, as Python's json (and so transformers 4) writes it: published
Nemotron-H configs carry `"time_step_limit": [0.0, Infinity]`."""

import json
from dataclasses import replace

import pytest

from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.parse import describe, show
from tests.support.nemotron_configs import NANO_30B_A3B


def _write(path, cfg: dict, limit: str) -> None:
    path.write_text(json.dumps(cfg | {"time_step_limit": "@"}).replace('"@"', limit))


def test_bare_infinity_loads_as_transformers_5s_spelling(tmp_path):
    bare, spelt = tmp_path / "bare.json", tmp_path / "spelt.json"
    _write(bare, NANO_30B_A3B, "[0.001, Infinity]")
    _write(spelt, NANO_30B_A3B, '[0.001, {"__float__": "Infinity"}]')
    assert replace(load_config(bare), name="x") == replace(load_config(spelt), name="x")
    assert load_config(bare).mamba_dt_min == 0.001


def test_infinity_where_a_finite_number_is_needed_is_refused(tmp_path):
    bad = tmp_path / "bad.json"
    _write(bad, NANO_30B_A3B, "[-Infinity, 0.1]")
    with pytest.raises(ConfigError, match="time_step_limit"):
        load_config(bad)
    nan = tmp_path / "nan.json"
    _write(nan, NANO_30B_A3B, "[0.0, NaN]")
    with pytest.raises(ConfigError, match="NaN is not a JSON number"):
        load_config(nan)


def test_a_hardware_spec_refuses_infinity(tmp_path):
    spec = tmp_path / "hw.json"
    spec.write_text('{"memory_bytes": Infinity}')
    with pytest.raises(ConfigError, match="Infinity is not a finite number"):
        load_hardware(str(spec))


LLAMA = {
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 16,
}


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("rope_theta", "Infinity", "rope_theta must be a positive number, got Infinity"),
        ("rope_theta", "-Infinity", "rope_theta must be a positive number, got -Infinity"),
        (
            "rope_theta",
            '{"__float__": "Infinity"}',
            "rope_theta must be a positive number, got Infinity",
        ),
        ("hidden_act", "Infinity", "hidden_act must be a string, got Infinity"),
        (
            "tie_word_embeddings",
            "Infinity",
            "tie_word_embeddings must be true or false, got Infinity",
        ),
        ("max_position_embeddings", "Infinity", "must be a positive integer, got Infinity"),
        (
            "layer_types",
            "[Infinity]",
            "layer_types must be a list of strings, got [Infinity] (list)",
        ),
        (
            "rope_scaling",
            '{"rope_type": "linear", "factor": Infinity}',
            "rope_scaling.factor must be a positive number, got Infinity",
        ),
    ],
)
def test_a_refused_infinity_is_named_as_the_file_spells_it(tmp_path, field, value, message):
    path = tmp_path / "config.json"
    _write(path, {k: v for k, v in LLAMA.items() if k != field}, "0")
    path.write_text(path.read_text().replace('"time_step_limit": 0', f'"{field}": {value}'))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value).endswith(message)
    assert "__float__" not in str(e.value)


def test_nemotron_h_names_a_finite_time_step_limit_as_the_file_spells_it(tmp_path):
    bad = tmp_path / "bad.json"
    _write(bad, NANO_30B_A3B, "[-Infinity, 0.1]")
    with pytest.raises(ConfigError, match=r"time_step_limit=\[-Infinity, 0\.1\] is not modelled"):
        load_config(bad)


def test_values_are_shown_with_infinity_spelt_out():
    inf = {"__float__": "Infinity"}
    assert describe(inf) == describe(float("inf")) == "Infinity"
    assert describe({"__float__": "-Infinity"}) == "-Infinity"
    assert describe(2.5) == "2.5 (float)"  # a finite number keeps its type
    assert describe({"__float__": "NaN"}) == "{'__float__': 'NaN'} (dict)"  # no spelling of ours
    assert show(inf) == show(float("inf")) == "Infinity"
    assert show([0.0, inf]) == "[0.0, Infinity]"
    assert show({"b": [inf], "a": 1}) == "{'a': 1, 'b': [Infinity]}"
    assert show((float("-inf"),)) == "(-Infinity,)"


class _Untouchable(dict):
    def __len__(self) -> int:
        raise AssertionError("an item past what is shown was read")


def test_showing_a_huge_value_reads_only_what_is_shown():
    inf = {"__float__": "Infinity"}
    assert show([inf] * 7 + [_Untouchable()] * 10_000).startswith("[Infinity, Infinity, ")
    deep: list = [inf]
    for _ in range(100):
        deep = [deep]
    assert show(deep) == "[[[[...]]]]"
