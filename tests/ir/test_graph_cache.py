"""The cache is the graph outputs with the cache role (Graph.cache_outputs), whatever their names:
keys and values, or MLA's latent and RoPE key."""

import pytest

from graphllm import Workload, build_graph
from graphllm.errors import GraphError
from graphllm.ir import CACHE, Dim, Graph, Ref, TensorType
from graphllm.models.config import config_from_dict
from graphllm.passes import run
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from tests.support import tiny_configs


def _build(cfg, **wl):
    return build_graph(config_from_dict(cfg, "tiny"), Workload(**({"seq_len": 3} | wl)))


def _shapes(graph):
    return {k: graph.type_of(r).shape(graph.bindings) for k, r in graph.cache_outputs().items()}


@pytest.mark.parametrize("past", [0, 4])
def test_a_standard_model_caches_keys_and_values(past):
    g = _build(tiny_configs.LLAMA, past_len=past)
    s = past + 3
    want = {f"present.{i}.{kv}": (1, 2, s, 16) for i in range(2) for kv in ("key", "value")}
    assert _shapes(g) == want  # (B, kv heads, S, head_dim)
    assert "logits" not in g.cache_outputs()


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
def test_mla_caches_the_latent_and_the_rope_key(mla):
    g = build_graph(
        config_from_dict(tiny_configs.DEEPSEEK_V3, "ds"), Workload(seq_len=2, past_len=5), mla=mla
    )
    shapes = _shapes(g)
    assert shapes == {
        f"present.{i}.{part}": (1, 1, 7, width)
        for i in range(2)
        for part, width in (("key", 16), ("value", 4))  # kv_lora_rank, qk_rope_head_dim
    }


def test_the_cache_is_found_by_its_role_not_its_name():
    g = _build(tiny_configs.LLAMA, past_len=4)
    before = run(g, ["memory"])["memory"].kv_cache
    for k, r in list(g.cache_outputs().items()):
        del g.outputs[k]
        g.set_output(k.replace("present.", "carried."), r, CACHE)
    assert set(g.cache_outputs()) == {
        f"carried.{i}.{kv}" for i in range(2) for kv in ("key", "value")
    }
    assert run(g, ["memory"])["memory"].kv_cache == before > 0


def test_the_role_survives_partitioning():
    g = _build(tiny_configs.LLAMA, batch=2, past_len=4)
    for s in (Strategy(tp=2), Strategy(pp=2), Strategy(dp=2)):
        local = partition(g, s)
        assert set(local.cache_outputs()) == set(g.cache_outputs())
    rep = partition_report(partition(g, Strategy(pp=2))).to_dict()
    assert all(st["kv_cache_bytes"] > 0 for st in rep["stages"])  # each stage holds its layers'


def test_set_output_without_a_role_clears_it_and_an_unknown_role_fails():
    t = TensorType((Dim("n", "hidden", 2),), "fp32")
    g = Graph("g")
    g.input("x", t)
    g.set_output("y", Ref("x"), CACHE)
    assert g.output_role("y") == CACHE
    g.set_output("y", Ref("x"))
    assert g.output_role("y") is None and g.cache_outputs() == {}
    with pytest.raises(GraphError, match="unknown role"):
        g.set_output("z", Ref("x"), "kv")
