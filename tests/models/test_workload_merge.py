"""merge_workload (models/workload_merge.py): the fields given over a config file's workload
section over T=2048, a dtype given resetting the file's per-kind dtypes, and a named weight
dtype dropping a quantized checkpoint's stored format (only where the storage is modelled)."""

from __future__ import annotations

import pytest

from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.workload import Workload
from graphllm.models.workload_merge import DEFAULT_SEQ_LEN, merge_workload

SECTION = {"batch": 2, "seq_len": 8, "dtype": "fp32", "kv_dtype": "fp8"}


@pytest.fixture(scope="module")
def dense():
    return load_config("llama3.2-1b")


@pytest.fixture(scope="module")
def fp8():
    config = load_config("deepseek-v3")
    assert config.quantization is not None and config.quantization.method == "fp8"
    return config


def test_nothing_given_is_t_2048_at_the_defaults(dense) -> None:
    got = merge_workload(dense, {}, {})
    assert got.workloads == (Workload(seq_len=DEFAULT_SEQ_LEN),) and DEFAULT_SEQ_LEN == 2048
    assert got.config is dense and got.dropped_quantization is None


def test_given_over_the_section_over_the_defaults(dense) -> None:
    (wl,) = merge_workload(dense, SECTION, {"batch": 3, "past_len": None}).workloads
    assert (wl.batch, wl.seq_len, wl.past_len) == (3, 8, 0)
    assert (wl.weight_dtype, wl.act_dtype, wl.kv_dtype) == ("fp32", "fp32", "fp8")
    # None is "not given", 0 is a value
    (wl,) = merge_workload(dense, {"past_len": 5}, {"past_len": 0, "seq_len": None}).workloads
    assert (wl.seq_len, wl.past_len) == (DEFAULT_SEQ_LEN, 0)


def test_a_dtype_given_resets_the_sections_per_kind_dtypes(dense) -> None:
    (wl,) = merge_workload(dense, SECTION, {"dtype": "bf16"}).workloads
    assert (wl.weight_dtype, wl.act_dtype, wl.kv_dtype) == ("bf16", "bf16", "bf16")
    # a per-kind dtype given beside it still wins
    (wl,) = merge_workload(dense, SECTION, {"dtype": "bf16", "kv_dtype": "fp8"}).workloads
    assert (wl.weight_dtype, wl.kv_dtype) == ("bf16", "fp8")


def test_a_sweep_is_one_workload_per_seq_len(dense) -> None:
    got = merge_workload(dense, SECTION, {"batch": 4}, seq_lens=[16, 32])
    assert [(w.batch, w.seq_len) for w in got.workloads] == [(4, 16), (4, 32)]


def test_a_weight_dtype_named_drops_the_stored_format(fp8) -> None:
    got = merge_workload(fp8, {}, {"dtype": "bf16"})
    assert got.config.quantization is None and got.config.name == fp8.name
    assert (got.dropped_quantization, got.overridden_by) == ("fp8", "dtype")
    got = merge_workload(fp8, {}, {"dtype": "bf16", "weight_dtype": "int4"})
    assert got.overridden_by == "weight_dtype" and got.workloads[0].weight_dtype == "int4"
    # named by the file's section: dropped, by no field given
    got = merge_workload(fp8, {"weight_dtype": "bf16"}, {"batch": 2})
    assert (got.dropped_quantization, got.overridden_by) == ("fp8", None)


def test_the_stored_format_stays_unless_named_or_modelled(fp8) -> None:
    assert merge_workload(fp8, {}, {"batch": 2}).config is fp8  # nothing named
    assert merge_workload(fp8, {}, {"act_dtype": "fp8"}).config is fp8  # not a weight dtype
    kept = merge_workload(fp8, {}, {"dtype": "bf16"}, stored=False)  # an export
    assert kept.config is fp8 and kept.dropped_quantization is None


def test_an_unknown_field_is_a_config_error(dense) -> None:
    with pytest.raises(ConfigError, match="unknown workload field 'tokens'; known: batch"):
        merge_workload(dense, {}, {"tokens": 4})
    with pytest.raises(ConfigError, match="workload batch must be a positive integer"):
        merge_workload(dense, {}, {"batch": 0})
