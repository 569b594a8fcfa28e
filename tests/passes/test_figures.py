"""passes/parallel/figures.py: the tally of a rank's program by group, which the partition report
(by stage) and the plan (by layer) both read, and the layer slots they group by."""

import pytest

from graphllm import Workload, build_graph
from graphllm.models.config import config_from_dict
from graphllm.models.hardware import load_hardware
from graphllm.ops import COMMUNICATION, OPS, SOURCE
from graphllm.passes.cost import layer_of, layer_scopes, layer_slots
from graphllm.passes.parallel.figures import Figures, bubble, step_seconds, tally
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.passes.registry import meta_result
from tests.support import tiny_configs

H100 = load_hardware("h100")


def tiny(**wl):
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    return build_graph(cfg, Workload(**({"batch": 4, "seq_len": 8} | wl)))


def test_layer_slots_are_before_in_and_after_the_layers():
    g = tiny()
    slots = layer_slots(g)
    layers = layer_scopes(g)
    assert len(layers) == 2
    assert set(slots) == {n.name for n in g.nodes() if OPS[n.op].category != SOURCE}
    for name, slot in slots.items():
        lay = layer_of(g, name)
        assert slot == (layers.index(lay) + 1 if lay else slot)
        assert lay or slot in (0, len(layers) + 1)
    assert slots[g.outputs["logits"].node] == len(layers) + 1
    first = next(n for n in g.nodes() if OPS[n.op].category != SOURCE)
    assert slots[first.name] == 0  # the embedding gather


def test_one_group_holds_the_whole_program():
    pg = partition(tiny(), Strategy(tp=2), H100)
    whole = Figures()
    timed = tally(pg, H100, "flash", False, lambda n: [whole])
    assert whole.names == {n.name for n in pg.nodes()}
    assert whole.params == sum(p.out.numel(pg.bindings) for p in pg.params())
    assert whole.flops == sum(meta_result(n, "cost").flops for n in pg.nodes())
    comm = [n.name for n in pg.nodes() if OPS[n.op].category == COMMUNICATION]
    assert comm and [c.name for c in timed] == comm == [c.name for c in whole.collectives]
    assert whole.comm_seconds == pytest.approx(sum(c.seconds for c in timed))
    kinds = [c.kind for c in timed]  # the embedding, two a layer; the vocab-parallel logits
    assert kinds == ["all_reduce"] * 5 + ["all_gather"]
    assert all(c.axis == "tp" and c.group == 2 for c in timed)
    assert whole.compute_seconds > 0 and whole.ep_weight_bytes == 0
    assert whole.master  # bf16 weights: Adam keeps fp32 master weights


def test_groups_split_the_whole_and_the_report_reads_them():
    pg = partition(tiny(), Strategy(tp=2, pp=2, microbatches=2), H100)
    stages = [Figures(), Figures()]
    timed = tally(pg, H100, "flash", False, lambda n: [stages[s] for s in meta_result(n, "stages")])
    rep = partition_report(pg, H100).to_dict()
    assert [c["name"] for c in rep["collectives"]] == [c.name for c in timed]
    for f, e in zip(stages, rep["stages"]):
        assert e["params"] == f.params and e["weight_bytes"] == f.weight_bytes
        assert e["flops"] == 2 * f.flops  # two microbatches a step
        assert e["seconds_per_microbatch"] == f.compute_seconds + f.comm_seconds
    sends = [c for c in timed if c.kind == "send/recv"]
    assert sends and all(c.axis == "pp" for c in sends)  # the recv is timed on its send


def test_no_hardware_no_seconds():
    pg = partition(tiny(dtype="fp32"), Strategy(tp=2))
    whole = Figures()
    timed = tally(pg, None, "flash", False, lambda n: [whole])
    assert timed and all(c.seconds is None for c in timed)
    assert whole.compute_seconds == whole.comm_seconds == 0.0
    assert not whole.master  # fp32 weights are their own master copy


def test_nothing_grouped_nothing_counted():
    pg = partition(tiny(), Strategy())
    assert tally(pg, None, "flash", False, lambda n: []) == []  # one device: no collectives


def test_pipeline_step_and_bubble():
    stages = [
        {"seconds_per_microbatch": 2.0, "gradient_seconds": 0.5},
        {"seconds_per_microbatch": 3.0, "gradient_seconds": 0.25},
    ]
    # the first microbatch through both stages, the other three each a turn of the slower
    assert step_seconds(stages, 4) == 2.0 + 3.0 + 3 * 3.0 + 0.5
    balanced = [dict(stages[1]), dict(stages[1])]
    assert step_seconds(balanced, 4) == (4 + 2 - 1) * 3.0 + 0.25
    assert bubble(4, 2) == 1 / 5 and bubble(1, 1) == 0.0


def test_expert_weights_cut_over_ep_are_counted_apart():
    cfg = {
        **tiny_configs.LLAMA,
        "model_type": "mixtral",
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    }
    g = build_graph(config_from_dict(cfg, "moe"), Workload(batch=4, seq_len=8))
    pg = partition(g, Strategy(ep=2), H100)
    whole = Figures()
    tally(pg, H100, "flash", False, lambda n: [whole])
    experts = [p for p in pg.params() if p.attrs.get("stacked") == "expert"]
    assert experts
    ep_bytes = sum(p.out.numel(pg.bindings) * 2 for p in experts)  # bf16
    assert whole.ep_weight_bytes == ep_bytes < whole.weight_bytes
