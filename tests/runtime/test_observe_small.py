"""`small_instance` with a strategy: every split the strategy makes of the model it makes of the
small instance too, which then partitions and runs rank by rank as the model would."""

from __future__ import annotations

import time

import pytest

from graphllm.build.builder import build_graph
from graphllm.errors import ConfigError
from graphllm.models.config import load_config, preset_names
from graphllm.models.workload import Workload
from graphllm.passes.parallel.partition import Strategy, validate
from graphllm.passes.parallel.partition import partition as partition_graph
from graphllm.runtime.observe import small_instance
from graphllm.runtime.spmd import check_partition

CASES = [
    ("llama3-70b", Strategy(tp=8), 12, 1),
    ("llama3-70b", Strategy(tp=16), 12, 1),  # more ranks than KV heads: each replicated
    ("llama3-70b", Strategy(tp=8, sp=True), 16, 1),
    ("llama3-70b", Strategy(pp=8), 12, 1),
    ("deepseek-v3", Strategy(tp=8, ep=16), 16, 1),  # 256 experts, MLA, grouped routing
    ("qwen3-next-80b-a3b", Strategy(tp=4, ep=16), 12, 16),  # linear attention, 512 experts
    ("gpt-oss-120b", Strategy(tp=8, ep=8, pp=2), 16, 1),
    ("nemotron-h-8b", Strategy(tp=2), 12, 1),  # Mamba2: 128 heads in 8 groups
    ("nemotron-h-8b", Strategy(tp=8), 12, 1),  # a group per rank
]


@pytest.mark.parametrize(("preset", "strategy", "seq_len", "batch"), CASES)
def test_the_small_instance_partitions_as_the_model_does(preset, strategy, seq_len, batch):
    cfg = load_config(preset)
    wl = Workload.with_dtype(batch=batch, seq_len=seq_len, dtype="fp32")
    validate(cfg, wl, strategy)  # the model takes the strategy
    start = time.perf_counter()
    small = small_instance(cfg, seq_len, strategy)
    validate(small, wl, strategy)  # and so does its small instance
    graph = build_graph(small, wl)
    check = check_partition(graph, partition_graph(graph, strategy))
    assert check.agrees(), check.max_diff
    # a few seconds here, the point of a small one; the bound leaves room for a loaded CI runner
    assert time.perf_counter() - start < 120


def test_without_the_strategy_the_small_instance_need_not_take_it():
    wl = Workload.with_dtype(seq_len=12, dtype="fp32")
    with pytest.raises(ConfigError, match="does not divide the 4 attention heads"):
        validate(small_instance(load_config("llama3-70b"), 12), wl, Strategy(tp=8))


def test_divisibility_is_kept_size_by_size():
    small = small_instance(load_config("llama3-70b"), 12, Strategy(tp=8))
    # a KV head per rank, four query heads to each as in the model (64 over 8)
    assert (small.num_attention_heads, small.num_key_value_heads) == (32, 8)
    assert small.intermediate_size % 8 == 0 and small.vocab_size % 8 == 0
    whole = small_instance(load_config("llama3-70b"), 12, Strategy(tp=8, whole_vocab=True))
    assert whole.vocab_size == 97  # the vocabulary is not split: the prime toy size stays
    assert small_instance(load_config("deepseek-v3"), 12, Strategy(ep=32)).num_experts == 32
    assert small_instance(load_config("llama3-70b"), 12, Strategy(pp=6)).num_hidden_layers == 6
    # a split the model does not take is not made one the small instance takes
    assert small_instance(load_config("llama3-8b"), 12, Strategy(tp=3)).num_attention_heads == 4


def test_mamba_groups_split_as_the_models_do():
    # tp=8 splits Nemotron-H-8B's 8 groups: the small instance's must split too, not replicate
    nemotron = load_config("nemotron-h-8b")
    for tp, groups in ((1, 2), (2, 2), (4, 4), (8, 8)):
        small = small_instance(nemotron, 12, Strategy(tp=tp))
        assert small.mamba_n_groups == groups
        assert small.mamba_num_heads % groups == 0 and small.mamba_num_heads % tp == 0


def test_a_one_device_strategy_changes_nothing():
    for name in preset_names():
        cfg = load_config(name)
        assert small_instance(cfg, 12, Strategy()) == small_instance(cfg, 12)
