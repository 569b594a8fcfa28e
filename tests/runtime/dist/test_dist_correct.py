"""`graphllm run`'s ranks, on gloo: logits and greedy tokens equal to one device's (fp32, within
1e-4) for every strategy, on a dense, an MoE and a DeepSeek (MLA) tiny config, prefill and 16
cached decode steps. One launch a world size runs its strategies in turn (torch's import and the
rendezvous cost some seconds a launch)."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch (the dist extra) is not installed"
)

from graphllm.runtime.dist.launch import launch  # noqa: E402
from tests.runtime.dist.support import (  # noqa: E402
    assert_equal_to_reference,
    job,
    write_configs,
    write_moe_checkpoint,
)

STRATEGIES = {
    "tp sp": {"tp": 2, "sp": True},
    "cp": {"cp": 2},
    "pp mb": {"pp": 2, "microbatches": 2},
    "dp": {"dp": 2},
}


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    return write_configs(tmp_path_factory.mktemp("configs"))


def _check(jobs, nproc):
    cases = launch(jobs, nproc)
    assert [c["name"] for c in cases] == [j.name for j in jobs]
    for case, j in zip(cases, jobs):
        assert len(case["ranks"]) == nproc
        assert_equal_to_reference(case, j)
    return cases


def test_two_ranks(configs, tmp_path):
    ckpt = write_moe_checkpoint(tmp_path / "moe", configs["moe"])
    jobs = [
        job(configs["dense"], "dense tp", strategy={"tp": 2}),
        job(configs["dense"], "dense tp sp", strategy={"tp": 2, "sp": True}),
        job(configs["dense"], "dense tp whole vocab", strategy={"tp": 2, "whole_vocab": True}),
        job(configs["dense"], "dense cp", strategy={"cp": 2}),
        job(configs["dense"], "dense pp mb", strategy={"pp": 2, "microbatches": 2}),
        job(configs["dense"], "dense dp", strategy={"dp": 2}),
        job(configs["moe"], "moe ep", strategy={"ep": 2}),
        job(str(ckpt), "moe ep checkpoint", strategy={"ep": 2}, weights=str(ckpt)),
        job(configs["deepseek"], "deepseek tp", strategy={"tp": 2}),
        job(configs["moe"], "moe tp", strategy={"tp": 2}),
        job(configs["deepseek"], "deepseek ep", strategy={"ep": 2}),
    ]
    for family in ("moe", "deepseek"):  # the dense strategies on the other two families
        for name, strategy in STRATEGIES.items():
            jobs.append(job(configs[family], f"{family} {name}", strategy=strategy))
    cases = _check(jobs, 2)
    tp = cases[0]["ranks"]
    # every rank timed its all-reduces, and its blocks of the weights are half the tp-cut ones
    assert all(r["comm_seconds"] > 0 and r["compute_seconds"] > 0 for r in tp)
    kinds = {c["kind"] for s in tp[0]["steps"] for c in s["collectives"]}
    assert {"all_reduce", "all_gather"} <= kinds
    assert [s["step"] for s in tp[0]["steps"]][:2] == ["prefill", "decode 1"]
    by = {c["name"]: c["ranks"] for c in cases}
    assert all(r["comm_seconds"] == 0 for r in by["dense dp"])  # replicas never talk
    # each rank holds its blocks only: tp halves every matrix (norms stay whole), ep the
    # experts, read as slices of the checkpoint just as cut from the random weights
    whole = by["dense dp"][0]["weight_bytes"]
    assert all(r["weight_bytes"] < 0.55 * whole for r in by["dense tp"])
    ep = [r["weight_bytes"] for r in by["moe ep checkpoint"]]
    assert ep == [r["weight_bytes"] for r in by["moe ep"]]
    assert all(b < 0.8 * by["moe dp"][0]["weight_bytes"] for b in ep)


def test_four_ranks(configs):
    jobs = [
        job(configs["dense"], "dense tp pp mb", strategy={"tp": 2, "pp": 2, "microbatches": 2}),
        job(configs["dense"], "dense cp tp sp", strategy={"cp": 2, "tp": 2, "sp": True}),
        job(configs["moe"], "moe ep tp", strategy={"ep": 2, "tp": 2}),
        job(configs["deepseek"], "deepseek ep pp", strategy={"ep": 2, "pp": 2}),
        job(configs["dense"], "dense dp tp", strategy={"dp": 2, "tp": 2}),
    ]
    _check(jobs, 4)


def test_eight_ranks_tp_pp_ep(configs):
    jobs = [
        job(configs["moe"], "moe tp pp ep", strategy={"tp": 2, "pp": 2, "ep": 2}),
        job(configs["deepseek"], "deepseek tp pp ep", strategy={"tp": 2, "pp": 2, "ep": 2}),
    ]
    _check(jobs, 8)


def test_hybrid_families_two_ranks(tmp_path):
    """Nemotron-H (Mamba2) and Qwen3-Next (Gated DeltaNet): each tp rank keeps its heads' block of
    the conv and recurrent states from step to step (no gather), on numpy and on onnxruntime,
    whose segments read a rank's share of the fused projections' regrouped channels."""
    import json

    from tests.support.tiny_nemotron import SMALL as NEMOTRON
    from tests.support.tiny_qwen3_next import SMALL as QWEN3_NEXT

    nemotron = {**NEMOTRON, "model_type": "nemotron_h", "hybrid_override_pattern": "M*-EM"}
    nemotron["time_step_limit"] = [0.001, {"__float__": "Infinity"}]  # JSON has no inf
    paths = {}
    for name, fields in (
        ("nemotron", nemotron),
        ("qwen3-next", {**QWEN3_NEXT, "model_type": "qwen3_next"}),
    ):
        paths[name] = tmp_path / f"{name}.json"
        paths[name].write_text(json.dumps(fields))
    jobs = [
        job(str(paths[name]), f"{name} {label} {runtime}", strategy=strategy, runtime=runtime)
        for name in paths
        for label, strategy in (("tp", {"tp": 2}), ("pp mb", {"pp": 2, "microbatches": 2}))
        for runtime in ("numpy", "onnxruntime")
    ]
    cases = _check(jobs, 2)
    # the states stay cut: no step of a tp rank gathers anything inside a mixer (its conv state,
    # its scan's recurrent state), the decode steps' past included; the mixer's one collective
    # is the all-reduce after out_proj
    for name, mixer in (("nemotron tp numpy", ".mixer."), ("qwen3-next tp numpy", ".linear_attn.")):
        tp = next(c for c in cases if c["name"] == name)["ranks"][0]
        inside = [
            (c["kind"], c["node"]) for s in tp["steps"] for c in s["collectives"] if mixer in c["node"]
        ]
        assert inside and {k for k, _ in inside if k != "shard_slice"} == {"all_reduce"}, inside
