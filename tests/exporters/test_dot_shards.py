"""The block view's shard notes on a partitioned graph: read from each node's meta["sharding"] (the
splits the SPMD transform chose), so they say what the rank's program does, even where that is
not what the config and the strategy suggest."""

from __future__ import annotations

import re

from graphllm import Workload, build_graph, load_config
from graphllm.exporters.dot import view_dot
from graphllm.passes.parallel.partition import Strategy, partition

TINY = dict(
    model_type="llama",
    vocab_size=32,
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=24,
    max_position_embeddings=64,
)


def notes(cfg, layer: int = 0, **strategy) -> dict[str, list[str]]:
    """The lines of the block view's side-path boxes, by their first line (the scope's title)."""
    graph = partition(build_graph(cfg, Workload(seq_len=8)), Strategy(**strategy))
    text = view_dot(graph, "block", layer=layer)
    out = {}
    for label in re.findall(r'label="([^"]*)"', text):
        lines = label.split("\\n")
        if any(re.search(r"per (\w+ )?rank", x) for x in lines):
            out[lines[0]] = lines
    return out


def tiny(**over):
    return load_config({**TINY, **over})


def test_tensor_parallel_notes_name_each_ranks_heads_kv_heads_and_columns():
    got = notes(tiny(), tp=2)
    assert "h/2 per rank: rank r holds heads 2r..2r+1" in got["attention"]
    assert "and kv head r" in got["attention"]
    assert "ffn/2 per rank: rank r holds columns 12r..12r+11" in got["gated MLP"]


def test_kv_heads_fewer_than_ranks_are_shared_by_neighbouring_ranks():
    """2 kv heads over 4 ranks: the graph cuts the kv-head axis in 2 blocks, each on 2 ranks."""
    got = notes(tiny(), tp=4)
    assert "h/4 per rank: rank r holds head r" in got["attention"]
    assert "kv head r//2 (each on 2 ranks)" in got["attention"]


def test_context_parallel_splits_the_tokens():
    got = notes(tiny(), cp=2)
    assert "tokens T/2 per cp rank" in got["attention"]
    assert "tokens T/2 per cp rank" in got["gated MLP"]
    assert not any("heads" in x for x in got["attention"][3:])


def test_expert_parallel_splits_experts_and_the_tokens_outside_them():
    """Outside the experts the ep ranks hold different tokens (the SPMD layout, not a formula)."""
    cfg = tiny(model_type="mixtral", num_experts=4, num_experts_per_tok=2)
    got = notes(cfg, ep=2)
    assert "E/2 per rank: rank r holds experts 2r..2r+1" in got["MoE"]
    assert "tokens T/2 per ep rank" in got["MoE"]
    assert "tokens T/2 per ep rank" in got["attention"]
    got = notes(cfg, ep=2, tp=2)
    assert "each expert's ffn/2 per tp rank" in got["MoE"]


def test_the_notes_follow_the_graph_where_the_config_would_mislead():
    """DeepSeek-V2-Lite's MLA under tp: the query heads are split, the one latent kv head is held
    whole by every rank (its config says 16 kv heads). DeepSeek-V3's low-rank query projection is
    split instead and gathered, so every rank runs all its heads: no heads note at all."""
    lite = notes(load_config("deepseek-v2-lite"), layer=1, tp=2)["attention"]
    assert "h/2 per rank: rank r holds heads 8r..8r+7" in lite
    assert "kv head r//2 (each on 2 ranks)" in lite
    v3 = notes(load_config("deepseek-v3"), layer=5, tp=8)
    assert "attention" not in v3  # no shard note: the heads are whole on each rank
    assert "each expert's ffn/8 per tp rank" in v3["MoE"]
