"""A device's memory under partition, plan and serving holds the conv and recurrent states of the
linear-attention and Mamba2 layers beside the KV cache (issue 19's states, issue 20's serving):
each figure is checked against the memory pass's own count of the states (passes/memory.py), a
separate reading of the same graph outputs."""

import math

import pytest

from graphllm import Workload, build_graph
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.passes.parallel.plan import plan
from graphllm.passes.registry import run
from graphllm.report.serving import serving_report

H100 = load_hardware("h100")
STEP = Workload(seq_len=1, past_len=1279, logits="last")


def _memory(model: str, wl: Workload = STEP):
    return run(build_graph(load_config(model), wl), ["memory"])["memory"]


def _stages(model: str, s: Strategy, wl: Workload = STEP) -> list[dict]:
    graph = partition(build_graph(load_config(model), wl), s, H100)
    return partition_report(graph, H100).to_dict()["stages"]


@pytest.mark.parametrize("model", ["nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_one_device_holds_the_states_the_memory_pass_counts(model):
    mem = _memory(model)
    assert mem.state > 0
    (st,) = _stages(model, Strategy())
    assert st["state_bytes"] == pytest.approx(mem.state)
    assert st["kv_cache_bytes"] == pytest.approx(mem.kv_cache)
    parts = ("weight_bytes", "kv_cache_bytes", "state_bytes", "activation_bytes")
    assert st["memory_bytes"] == pytest.approx(sum(st[k] for k in parts))


def test_pipeline_stages_split_the_states_and_tp_cuts_them():
    whole = _memory("nemotron-h-8b").state
    stages = _stages("nemotron-h-8b", Strategy(pp=2))
    assert sum(s["state_bytes"] for s in stages) == pytest.approx(whole)
    assert all(s["state_bytes"] > 0 for s in stages)
    # tp splits the Mamba2 heads (and so their conv channels and SSM state) over the ranks
    (tp,) = _stages("nemotron-h-8b", Strategy(tp=2))
    assert tp["state_bytes"] == pytest.approx(whole / 2, rel=0.02)


def test_attention_only_models_carry_no_state():
    (st,) = _stages("llama3-8b", Strategy())
    assert st["state_bytes"] == 0


def test_plan_counts_the_states_in_a_layouts_memory():
    wl = Workload(batch=64, seq_len=1, past_len=1279, logits="last")
    (one,) = [c for c in plan(load_config("nemotron-h-8b"), wl, 1, H100).candidates]
    (st,) = _stages("nemotron-h-8b", Strategy(), wl)
    assert st["state_bytes"] == pytest.approx(64 * _memory("nemotron-h-8b").state)
    assert one["memory_bytes"] == pytest.approx(st["memory_bytes"], rel=1e-6)


def test_serving_sizes_the_batch_on_the_cache_and_the_states():
    cfg = load_config("nemotron-h-8b")
    doc = serving_report(cfg, Workload(), Strategy(), H100, prompt=1024, output=256)
    mem = _memory("nemotron-h-8b", Workload(seq_len=1, past_len=1279, logits="last"))
    assert doc["state_bytes_per_sequence_per_device"] == pytest.approx(mem.state)
    assert doc["kv_bytes_per_sequence_per_device"] == pytest.approx(mem.kv_cache)
    (st,) = _stages("nemotron-h-8b", Strategy())
    room = 0.9 * 80e9 - st["weight_bytes"] - st["activation_bytes"]
    assert doc["max_batch"] == math.floor(room / (mem.kv_cache + mem.state))
    # the states are most of what a sequence keeps here: without them 5x as many would fit
    assert doc["max_batch"] < room / mem.kv_cache / 5


def test_a_stage_keeps_the_cache_and_states_of_all_its_microbatches():
    """A prefill pipelined in 8 microbatches of one sequence: each stage ends holding 8
    sequences' KV cache and states, in partition's figures as in plan's."""
    wl = Workload(batch=8, seq_len=1024, logits="last")
    s = Strategy(pp=2, microbatches=8)
    stages = _stages("nemotron-h-8b", s, wl)
    one = _stages("nemotron-h-8b", Strategy(pp=2), Workload(seq_len=1024, logits="last"))
    for st, single in zip(stages, one, strict=True):
        assert st["state_bytes"] == pytest.approx(8 * single["state_bytes"])
        assert st["kv_cache_bytes"] == pytest.approx(8 * single["kv_cache_bytes"])
    report = plan(load_config("nemotron-h-8b"), wl, 2, H100, pinned={"pp": 2})
    (best,) = [c for c in report.candidates if c["strategy"]["microbatches"] == 8]
    for st, p in zip(stages, best["stages"], strict=True):
        assert (st["kv_cache_bytes"], st["state_bytes"]) == (p["kv_cache_bytes"], p["state_bytes"])
