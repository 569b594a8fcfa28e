"""Position axes declare the absolute positions they index (Dim.positions); passes read them,
not the builder's dim names."""

from dataclasses import replace

import pytest

from graphllm import Workload, build_graph
from graphllm.errors import GraphError
from graphllm.ir import TOKEN_ROLES, Dim, Graph, TensorType
from graphllm.models.config import config_from_dict
from graphllm.passes import run
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.passes.tokens import sequence
from tests.support import tiny_configs


def _llama(**cfg):
    return replace(config_from_dict(tiny_configs.LLAMA, "tiny"), **cfg)


def _ranges(graph):
    """Dim name -> the positions it indexes, over every position axis of the graph."""
    dims = {d for n in graph.nodes() for t in n.outputs for d in t.dims if d.role in TOKEN_ROLES}
    return {d.name: d.position_range(graph.bindings) for d in dims}


def test_decode_positions_follow_the_past():
    g = build_graph(_llama(), Workload(batch=2, seq_len=3, past_len=5))
    r = _ranges(g)
    assert r["T"] == (5, 8)  # the new tokens
    assert r["P"] == (0, 5)  # the cache read back
    assert r["S"] == (0, 8)  # every key position
    assert sequence(g) == (5, 8)


def test_logits_for_the_last_position_index_it_alone():
    g = build_graph(_llama(), Workload(seq_len=4, past_len=2, logits="last"))
    assert _ranges(g)["T_last"] == (5, 6)
    assert sequence(g) == (2, 6)  # the queries still start after the past


def test_moe_slots_hold_the_new_tokens():
    cfg = {
        **tiny_configs.LLAMA,
        "model_type": "mixtral",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
    g = build_graph(config_from_dict(cfg, "m"), Workload(seq_len=3, past_len=4))
    assert _ranges(g)["C"] == (4, 7)


def test_a_rolling_window_cache_holds_the_last_positions():
    w = 4
    cfg = _llama(sliding_window=w, layer_types=("sliding_attention", "full_attention"))
    g = build_graph(cfg, Workload(seq_len=2, past_len=9))
    r = _ranges(g)
    assert r["P_w"] == (9 - (w - 1), 9)  # the last W-1 past positions
    assert r["S_w"] == (9 - (w - 1), 11)
    assert r["P"] == (0, 9) and r["S"] == (0, 11)  # the full-attention layer's cache
    # the pass places the window layer's cache where it lies: layer 0 reaches back W positions
    rep = run(g, ["tokens"])["tokens"]
    assert rep.per_layer[0] == {"layer": 0, "reach": w, "first": 11 - w}


def test_the_tokens_pass_does_not_know_the_builders_names():
    # the same positions under other names: 3 past positions, 2 new ones
    new = Dim("new", "token", positions=("past", "past+new"))
    g = Graph("x", {"b": 1, "new": 2, "past": 3})
    g.input("ids", TensorType((Dim("b", "batch"), new), "int64"))
    assert sequence(g) == (3, 5)


def test_a_dim_without_positions_indexes_from_zero():
    assert Dim("T", "token").position_range({"T": 4}) == (0, 4)
    assert Dim("k", "key_token", 6).position_range({}) == (0, 6)


def test_positions_are_part_of_what_a_dim_is():
    a = Dim("T", "token", positions=("P", "P+T"))
    assert a != Dim("T", "token") and hash(a) != hash(Dim("T", "token"))
    assert a == Dim("T", "token", positions=("P", "P+T"))


@pytest.mark.parametrize("positions", [("P", "P+"), ("P T", "P"), ("", "P"), ("P*T", "P"), ("P",)])
def test_a_malformed_rule_fails_where_the_dim_is_declared(positions):
    with pytest.raises(GraphError, match="position"):
        Dim("T", "token", positions=positions)


def test_only_position_axes_have_positions():
    with pytest.raises(GraphError, match="position axis"):
        Dim("d", "hidden", 8, positions=("0", "8"))


def test_an_unbound_name_is_an_error():
    with pytest.raises(GraphError, match="Q is not bound"):
        Dim("T", "token", positions=("Q", "Q+T")).position_range({"T": 2})


def test_a_shard_keeps_the_range_of_its_whole_axis():
    g = build_graph(_llama(), Workload(batch=1, seq_len=4, past_len=2))
    local = partition(g, Strategy(cp=2))
    dims = {d.name: d for n in local.nodes() for t in n.outputs for d in t.dims}
    assert dims["T/2"].positions == dims["T"].positions == ("P", "P+T")
    assert dims["T/2"].position_range(local.bindings) == (2, 6)
