"""The onnxruntime segment runner (runtime/dist/ort.py): each segment dist-run's `cut` makes, on
onnxruntime, equals the numpy run of the same nodes on that rank; what the export cannot express
runs on numpy, said once; the DLPack/IO-binding path gives the same values; and `graphllm run`'s
ranks on gloo with `--runtime onnxruntime` equal one device, as the numpy runtime's do."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from graphllm import Workload, build_graph
from graphllm.build.weights import random_weights
from graphllm.models.config import config_from_dict
from graphllm.passes.parallel.partition import Strategy, partition
from graphllm.runtime.dist import ort as ort_runner
from graphllm.runtime.dist.ort import OrtRunner, threads_per_rank
from graphllm.runtime.dist.segments import NumpyRunner, Segment, cut
from graphllm.runtime.spmd import SPMDInterpreter
from tests.runtime.dist.support import CONFIGS
from tests.support.tiny_configs import PARTIAL_LONGROPE
from tests.support.tiny_nemotron import SMALL as NEMOTRON
from tests.support.tiny_qwen3_next import SMALL as QWEN3_NEXT

HAS_TORCH = importlib.util.find_spec("torch") is not None


class _Recording(SPMDInterpreter):
    """The SPMD interpreter, keeping every rank's values: what each segment reads and makes."""

    def _run_node(self, node, ranks, env, feeds):
        self.env = env
        return super()._run_node(node, ranks, env, feeds)


def _program(family, strategy, past):
    fields = CONFIGS[family] if isinstance(family, str) else family
    cfg = config_from_dict(dict(fields), fields.get("model_type", family))
    t = 1 if past else 8
    g = build_graph(cfg, Workload.with_dtype(batch=4, seq_len=t, past_len=past, dtype="fp32"))
    program = partition(g, strategy)
    rng = np.random.default_rng(0)
    b, p = 4, past
    feeds = {
        "input_ids": rng.integers(0, 256, (b, t)),
        "position_ids": np.broadcast_to(np.arange(p, p + t), (b, t)).copy(),
    }
    if "attention_mask" in g:  # a recurrence zeroes padded positions: none here
        feeds["attention_mask"] = np.ones((b, p + t), np.int64)
    for n in g.nodes("input"):
        if n.name not in feeds:
            shape = tuple(int(s) for s in n.out.shape(g.bindings))
            feeds[n.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    rec = _Recording(program, random_weights(g, seed=1))
    rec.run(feeds)
    return program, rec


def _rank_segments(program, rec):
    """(segment, the rank's weights, its env) for every segment of every rank."""
    for r in rec.ranks:
        env = rec.env[r]
        weights = {p.name: env[p.name] for p in program.params() if p.name in env}
        for st in cut(program, rec.coords[r]):
            if isinstance(st, Segment):
                yield st, weights, env


def _value(env, name):
    if name in env:
        v = env[name]
        return v[0] if isinstance(v, tuple) else v
    node, _, k = name.rpartition(":")
    return env[node][int(k)]


CASES = [
    ("dense", Strategy(tp=2), 0),
    ("dense", Strategy(tp=2, sp=True, pp=2, microbatches=2), 0),
    ("dense", Strategy(dp=2, tp=2), 6),
    ("moe", Strategy(ep=2, tp=2), 6),
    ("deepseek", Strategy(ep=2, tp=2), 0),
    ("deepseek", Strategy(tp=2, pp=2), 6),
    ("dense", Strategy(cp=2, tp=2), 0),
]
# the hybrid families' tp cuts the head groups of their fused input projections (select_blocked
# reads a rank's share of its index from the rank's offset), prefill and a decode step from states
NEMOTRON_H = {**NEMOTRON, "model_type": "nemotron_h", "hybrid_override_pattern": "M*-EM"}
HYBRID = [
    (dict(family, vocab_size=256), Strategy(tp=2), past)
    for family in (NEMOTRON_H, {**QWEN3_NEXT, "model_type": "qwen3_next"})
    for past in (0, 6)
]
# sp cuts the keys of MLA's prefill (queries and keys both T): those segments run on numpy
KEY_BLOCKS = [("deepseek", Strategy(tp=2, sp=True), 0)]


def _case_id(v):
    return v["model_type"] if isinstance(v, dict) else str(v)


@pytest.mark.parametrize(("family", "strategy", "past"), CASES + HYBRID + KEY_BLOCKS, ids=_case_id)
def test_each_segment_on_onnxruntime_equals_numpy(family, strategy, past):
    program, rec = _program(family, strategy, past)
    runs, on_numpy = 0, 0
    for st, weights, env in _rank_segments(program, rec):
        runner = OrtRunner(st, weights)
        on_numpy += runner._fallback is not None
        got = runner.run({k: _value(env, k) for k in st.inputs})
        assert list(got) == list(st.outputs)
        for k, y in got.items():
            assert y.shape == np.shape(_value(env, k)), k
            want = _value(env, k)  # a numpy mask's -inf against its own -inf: equal
            with np.errstate(invalid="ignore"):
                diff = np.where(y == want, 0, y - want)
            assert np.max(np.abs(diff), initial=0.0) < 1e-5, k
        runs += 1
    assert runs >= strategy.devices
    # every segment ran on onnxruntime, but the attention of a block of the keys
    assert (on_numpy > 0) == ((family, strategy, past) in KEY_BLOCKS), on_numpy


LONGROPE = {**CONFIGS["dense"], "model_type": "phi3", "pad_token_id": 0, **PARTIAL_LONGROPE}


def test_what_the_export_cannot_express_runs_on_numpy_said_once(capsys):
    """longrope chooses its frequencies from the whole call's last position, which a rank's
    block of the tokens (cp) does not hold: those segments run on numpy."""
    program, rec = _program(LONGROPE, Strategy(cp=2), 0)
    ort_runner._SAID.clear()
    fell_back = 0
    for st, weights, env in _rank_segments(program, rec):
        runner = OrtRunner(st, weights)
        fell_back += runner._fallback is not None
        got = runner.run({k: _value(env, k) for k in st.inputs})
        want = NumpyRunner(st, weights).run({k: _value(env, k) for k in st.inputs})
        assert all(np.max(np.abs(got[k] - want[k]), initial=0.0) < 1e-5 for k in want)
    assert fell_back >= 2  # the attention segments of both ranks
    notes = [x for x in capsys.readouterr().err.splitlines() if x.startswith("note:")]
    assert len(notes) == 1 and "such segments run on numpy" in notes[0], notes


def test_a_decode_step_reuses_the_sessions_of_the_step_before():
    """The program is rebuilt for every step (its past grows); its segments' models and
    sessions are not."""
    cfg = config_from_dict(dict(CONFIGS["dense"]), "dense")
    sessions, weights = [], None
    for past in (6, 7):
        g = build_graph(cfg, Workload.with_dtype(batch=4, seq_len=1, past_len=past, dtype="fp32"))
        program = partition(g, Strategy(tp=2))
        if weights is None:  # a rank loads its blocks once, for every step
            weights = {
                p.name: np.zeros(p.out.shape(g.bindings), np.float32) for p in program.params()
            }
        segs = [s for s in cut(program, {"tp": 0}) if isinstance(s, Segment)]
        sessions.append([OrtRunner(s, weights)._session for s in segs])
    assert all(a is b for a, b in zip(*sessions)) and len(sessions[0]) > 2


def test_threads_share_the_cores_between_the_ranks(monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    two = threads_per_rank()
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    one = threads_per_rank()
    assert two == max(1, one // 2)


@pytest.mark.skipif(not HAS_TORCH, reason="torch (the dist extra) is not installed")
def test_the_dlpack_path_gives_the_same_values_on_the_cpu():
    """run_device binds torch tensors by pointer and hands outputs back through DLPack: the
    CUDA path's code, run here on the CPU provider with CPU tensors."""
    import torch

    program, rec = _program("moe", Strategy(ep=2, tp=2), 6)
    for st, weights, env in list(_rank_segments(program, rec))[:6]:
        runner = OrtRunner(st, weights)
        host = runner.run({k: _value(env, k) for k in st.inputs})
        dev = runner.run_device(
            {k: torch.from_numpy(np.asarray(_value(env, k))) for k in st.inputs}
        )
        for k in host:
            assert isinstance(dev[k], torch.Tensor)
            assert np.array_equal(dev[k].numpy(), host[k]), k


# dist-run's correctness cases (tests/runtime/dist/test_dist_correct.py), on onnxruntime
STRATEGIES = {
    "tp": {"tp": 2},
    "tp sp": {"tp": 2, "sp": True},
    "cp": {"cp": 2},
    "pp mb": {"pp": 2, "microbatches": 2},
    "dp": {"dp": 2},
}
FOUR = {
    "dense tp pp mb": ("dense", {"tp": 2, "pp": 2, "microbatches": 2}),
    "dense cp tp sp": ("dense", {"cp": 2, "tp": 2, "sp": True}),
    "moe ep tp": ("moe", {"ep": 2, "tp": 2}),
    "deepseek ep pp": ("deepseek", {"ep": 2, "pp": 2}),
    "dense dp tp": ("dense", {"dp": 2, "tp": 2}),
}
EIGHT = {
    "moe tp pp ep": ("moe", {"tp": 2, "pp": 2, "ep": 2}),
    "deepseek tp pp ep": ("deepseek", {"tp": 2, "pp": 2, "ep": 2}),
}


@pytest.mark.skipif(not HAS_TORCH, reason="torch (the dist extra) is not installed")
def test_every_strategy_on_onnxruntime_equals_one_device(tmp_path):
    """2, 4 and 8 gloo ranks, every segment on onnxruntime: one device's logits (1e-4, 17
    steps) and tokens, a checkpoint's slices too."""
    from graphllm.runtime.dist.launch import launch
    from tests.runtime.dist.support import (
        assert_equal_to_reference,
        job,
        write_configs,
        write_moe_checkpoint,
    )

    configs = write_configs(tmp_path)
    ckpt = write_moe_checkpoint(tmp_path / "moe", configs["moe"])
    ort = {"runtime": "onnxruntime"}
    two = [
        job(configs[family], f"{family} {name}", strategy=strategy, **ort)
        for family in ("dense", "moe", "deepseek")
        for name, strategy in STRATEGIES.items()
    ]
    two += [
        job(configs["moe"], "moe ep", strategy={"ep": 2}, **ort),
        job(str(ckpt), "moe ep checkpoint", strategy={"ep": 2}, weights=str(ckpt), **ort),
        job(configs["deepseek"], "deepseek ep", strategy={"ep": 2}, **ort),
    ]
    four = [job(configs[f], name, strategy=st, **ort) for name, (f, st) in FOUR.items()]
    eight = [job(configs[f], name, strategy=st, **ort) for name, (f, st) in EIGHT.items()]
    for jobs, nproc in ((two, 2), (four, 4), (eight, 8)):
        cases = launch(jobs, nproc)
        assert [c["name"] for c in cases] == [j.name for j in jobs]
        for case, j in zip(cases, jobs):
            assert {r["runtime"] for r in case["ranks"]} == {"onnxruntime"}
            assert len(case["ranks"]) == nproc
            assert_equal_to_reference(case, j)
