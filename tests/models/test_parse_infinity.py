"""A config.json's bare Infinity, as Python's json (and so transformers 4) writes it: published
Nemotron-H configs carry `"time_step_limit": [0.0, Infinity]`."""

import json
from dataclasses import replace

import pytest

from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
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
