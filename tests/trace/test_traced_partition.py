"""Partitioning a traced graph as transformers' own parallel plans cut it: every rank's program
run in numpy equals one device, the collectives equal the built family's where both cut alike,
and a layout a plan cannot give is one line naming why."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
from click.testing import CliRunner

from graphllm.build.builder import build_graph
from graphllm.cli.main import main
from graphllm.errors import ConfigError
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel.module_plans import style_of
from graphllm.passes.parallel.partition import Strategy, partition, partition_report
from graphllm.passes.parallel.plan import plan
from graphllm.runtime.spmd import check_partition
from graphllm.trace import traced_graph
from tests.support.traced import FAMILIES, TINY

FP32 = dict(batch=2, seq_len=6, dtype="fp32")
H100 = load_hardware("h100")
LLAMA = dict(TINY, model_type="llama")
QWEN3_MOE = dict(
    TINY, model_type="qwen3_moe", num_experts=6, num_experts_per_tok=2, moe_intermediate_size=16
)


@pytest.mark.parametrize(
    "family, layout",
    [
        ("dense", dict(tp=2)),
        ("dense", dict(tp=2, sp=True)),
        ("dense", dict(cp=2)),
        ("moe", dict(ep=2)),
        ("moe", dict(tp=2, ep=2, pp=2)),
        ("mla", dict(tp=2)),
        ("linear_attention", dict(tp=2)),
        # Nemotron-H's plan cuts its attention only: the Mamba mixer takes the sp stream whole
        ("mamba2", dict(tp=2, sp=True)),
        ("moe", dict(dp=2, ep=2)),
        ("moe", dict(microbatches=2, ep=2)),
    ],
)
@pytest.mark.parametrize("past", [0, 4])
def test_every_rank_equals_one_device(family, layout, past):
    batch = 2 * layout.get("dp", 1) * layout.get("microbatches", 1)
    wl = Workload(past_len=past, **dict(FP32, batch=batch))
    g = traced_graph(FAMILIES[family], wl, values=True)
    check = check_partition(g, partition(g, Strategy(**layout)))
    assert check.agrees(), check.differences(3)


def _collectives(graph, layout):
    report = partition_report(partition(graph, Strategy(**layout)))
    out: dict[tuple, int] = {}
    for c in report.collectives:
        key = (c["kind"], c["mesh_axis"], float(c["bytes"]))
        out[key] = out.get(key, 0) + c["count"]
    return out, report.stages[0]


@pytest.mark.parametrize(
    "raw, layout",
    [
        (
            LLAMA,
            dict(tp=2),
        ),  # Megatron: two all-reduces a layer, the embedding's, the head's gather
        (LLAMA, dict(tp=2, sp=True)),
        (LLAMA, dict(cp=2)),
        (QWEN3_MOE, dict(ep=2)),  # the tokens to their experts' ranks and back
    ],
)
@pytest.mark.parametrize("past", [0, 8])
def test_collectives_equal_the_built_family(raw, layout, past):
    wl = Workload(batch=4, seq_len=2 if past else 16, past_len=past)  # sp and cp cut T
    built, built_stage = _collectives(build_graph(load_config(raw), wl), layout)
    traced, traced_stage = _collectives(traced_graph(raw, wl), layout)
    assert traced == built
    assert traced_stage["params"] == built_stage["params"]
    assert traced_stage["weight_bytes"] == built_stage["weight_bytes"]
    if "cp" not in layout:  # the traced cache is written after the cp gather of K and V
        assert traced_stage["kv_cache_bytes"] == built_stage["kv_cache_bytes"]


def test_experts_stay_whole_under_tp_as_transformers_plans_them():
    # graphllm's built Qwen3-MoE cuts each expert's width over tp (as vLLM does);
    # transformers' plan names no expert weight, so a traced one keeps them whole
    wl = Workload(batch=4, seq_len=16)
    built, built_stage = _collectives(build_graph(load_config(QWEN3_MOE), wl), dict(tp=2))
    traced, traced_stage = _collectives(traced_graph(QWEN3_MOE, wl), dict(tp=2))
    layers = QWEN3_MOE["num_hidden_layers"]
    # the built graph all-reduces after the experts' down projection, the traced does not
    assert sum(built.values()) - sum(traced.values()) == layers
    g = traced_graph(QWEN3_MOE, wl)
    experts = [p for p in g.params() if p.attrs.get("stacked") == "expert"]
    assert experts and not any(style_of(g.meta["tp_plan"], p.name) for p in experts)
    assert traced_stage["params"] > built_stage["params"]


def test_plans_are_transformers_own():
    g = traced_graph(LLAMA, Workload())
    plan = g.meta["tp_plan"]
    assert style_of(plan, "model.layers.1.self_attn.q_proj.weight") == "colwise"
    assert style_of(plan, "model.layers.0.mlp.down_proj.weight") == "rowwise"
    assert style_of(plan, "lm_head.weight") == "colwise_gather_output"
    assert style_of(plan, "model.norm.weight") is None


@pytest.mark.parametrize(
    "raw, layout, words",
    [
        (FAMILIES["own_attention"], dict(tp=2), "declares no tensor-parallel plan"),
        (LLAMA, dict(ep=2), "has no experts"),
        (LLAMA, dict(tp=4), "does not divide the 2 heads of model.layers.0.self_attn.k_proj"),
        (QWEN3_MOE, dict(ep=4), "does not divide the 6 experts"),
    ],
)
def test_impossible_layouts_are_refused(raw, layout, words):
    with pytest.raises(ConfigError, match=words):
        partition(traced_graph(raw, Workload(batch=4, seq_len=8)), Strategy(**layout))


def test_ep_cuts_one_sequence_on_its_positions():
    # one sequence's tokens flattened are its positions: ep cuts them as the built family does
    g = traced_graph(QWEN3_MOE, Workload(batch=1, seq_len=6, dtype="fp32"), values=True)
    local = partition(g, Strategy(ep=2))
    assert "ep cuts the tokens on T" in " ".join(local.meta["partition"].notes)
    assert check_partition(g, local).agrees()


@pytest.mark.parametrize("batch, layout", [(3, dict(ep=2)), (2, dict(dp=2, ep=2))])
def test_ep_needs_a_batch_it_divides(batch, layout):
    # several sequences flattened: a cut of their positions is no block of the flat tokens
    with pytest.raises(ConfigError, match="flattens its tokens"):
        partition(traced_graph(QWEN3_MOE, Workload(batch=batch, seq_len=8)), Strategy(**layout))


def test_a_style_graphllm_does_not_model_is_named():
    g = traced_graph(LLAMA, Workload(seq_len=8))
    g.meta["tp_plan"] = dict(g.meta["tp_plan"], **{"model.layers.*.mlp": "mystery_style"})
    with pytest.raises(ConfigError, match="mystery_style"):
        partition(g, Strategy(tp=2))


def test_cli_refuses_what_a_traced_model_cannot_give(tmp_path):
    path = tmp_path / "mla.json"
    path.write_text(json.dumps(FAMILIES["mla"]))
    runner = CliRunner()
    base = ["partition", "--config", str(path), "--frontend", "traced", "--tp", "2"]
    for extra, says in [
        (["-t", "1", "--past-len", "8"], "give --mla naive"),
        (["--mla", "absorbed"], "--mla absorbed"),
        (["--mtp"], "--mtp"),
    ]:
        got = runner.invoke(main, [*base, *extra])
        assert got.exit_code == 2 and says in got.output, got.output
    got = runner.invoke(main, [*base, "-t", "1", "--past-len", "8", "--mla", "naive"])
    assert got.exit_code == 0, got.output


def test_cli_partition_and_verify(tmp_path):
    path = tmp_path / "qwen3-moe-tiny.json"
    path.write_text(json.dumps(QWEN3_MOE))
    runner = CliRunner()
    base = ["--config", str(path), "--frontend", "traced", "-b", "2", "-t", "6"]
    got = runner.invoke(main, ["partition", *base, "--tp", "2", "--ep", "2", "--json"])
    assert got.exit_code == 0, got.output
    doc = json.loads(got.output)
    assert doc["model"]["frontend"] == "traced"
    kinds = {c["kind"] for c in doc["partition"]["collectives"]}
    assert kinds == {"all_reduce", "all_gather", "all_to_all"}
    got = runner.invoke(main, ["verify", "partition", *base, "--tp", "2", "--ep", "2"])
    assert got.exit_code == 0, got.output
    assert "(traced)" in got.output and "logits equal within 1e-5" in got.output
    got = runner.invoke(main, ["partition", *base, "--tp", "3"])
    assert got.exit_code == 2 and "does not divide" in got.output


@pytest.mark.parametrize(
    "raw, wl, n",
    [
        (LLAMA, Workload(batch=4, seq_len=32), 4),
        (QWEN3_MOE, Workload(batch=4, seq_len=1, past_len=64), 4),
    ],
)
def test_plan_candidates_agree_with_the_partition_report(raw, wl, n):
    g = traced_graph(raw, wl)
    r = plan(g.meta["config"], wl, n, H100)
    assert r.candidates and {c["strategy"]["tp"] for c in r.candidates} >= {1, 2}
    for c in r.candidates:
        s = Strategy(**c["strategy"])
        rep = partition_report(partition(g, s, H100), H100).to_dict()
        mem = max(st["memory_bytes"] for st in rep["stages"])
        assert c["memory_bytes"] == pytest.approx(mem, rel=1e-6)
        assert c["seconds"] == pytest.approx(rep["pipeline"]["step_seconds"], rel=1e-6)
    # what transformers' plan refuses is an illegal layout, named; no pipeline stages
    assert any("does not divide the 2 heads" in x["reason"] for x in r.illegal)
    assert all(c["strategy"]["pp"] == 1 for c in r.candidates + r.too_big)
    with pytest.raises(ConfigError, match="--pp with plan"):
        plan(g.meta["config"], wl, n, H100, pinned={"pp": 2})
