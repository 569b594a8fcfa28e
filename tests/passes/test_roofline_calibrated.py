"""The roofline on calibrate's tables: every byte of a step at the bandwidth of the step's working
set, each GEMM at the rate of its shape, fused attention at the rate of its heads and step; the
presets and --ideal untouched."""

import math
from dataclasses import replace

import pytest

from graphllm import Workload, build_graph
from graphllm.files import json_text
from graphllm.models.config import config_from_dict, load_config
from graphllm.models.hardware import hardware_from_dict, load_hardware
from graphllm.passes.cost import scopes_of
from graphllm.passes.registry import meta_result, run
from graphllm.passes.roofline import _output_mnk
from graphllm.report.reuse import reused_report
from graphllm.report.trace_report import trace_report
from tests.support import tiny_configs
from tests.support.calibration import OLD_LOCAL, TABLE

MiB = 1 << 20


def tiny(**wl):
    cfg = config_from_dict(tiny_configs.LLAMA, "tiny")
    return build_graph(cfg, Workload(**({"batch": 1, "seq_len": 1, "past_len": 7} | wl)))


def calibrated(read=None):
    """The made-up tables with the read sweep replaced by `read` (bytes -> bytes/s)."""
    points = [{"bytes": b, "bandwidth": r} for b, r in read.items()] if read else None
    table = TABLE | ({"read_bandwidth": points} if points else {})
    return hardware_from_dict(OLD_LOCAL | {"calibration": table}, "local")


def test_each_op_of_a_step_reads_at_the_bandwidth_of_the_steps_working_set():
    hw = calibrated()
    g = tiny()
    roof = run(g, ["cost", "roofline"], hardware=hw)["roofline"]
    step = sum(meta_result(n, "cost").bytes for n in g.nodes())
    bw = hw.calibration.bandwidth_at(step)
    assert step < MiB and bw == 100e9  # a tiny model's step fits the smallest working set
    assert roof.bandwidth == bw and roof.rate_model == "calibrated"
    for name in ("model.layers.0.input_layernorm", "model.layers.1.mlp.down_proj"):
        n = g[name]
        oc = meta_result(n, "cost")
        rate = hw.calibration.gemm_rate(*_output_mnk(g, n, oc.matmul)) if oc.matmul else 44.7e9
        want = max(oc.flops / rate, oc.bytes / bw)
        assert meta_result(n, "time").seconds == pytest.approx(want, rel=1e-12)


def test_a_step_past_the_cache_reads_at_the_dram_figure():
    g = tiny()
    run(g, ["cost"])
    step = sum(meta_result(n, "cost").bytes for n in g.nodes())
    # the same machine with its cache's edge moved below this step: every op slows by 5x
    fits = calibrated({int(step * 2): 100e9, int(step * 4): 20e9})
    spills = calibrated({int(step / 4): 100e9, int(step / 2): 20e9})
    bound = {}
    for hw, bw in ((fits, 100e9), (spills, 20e9)):
        g = tiny()
        assert run(g, ["cost", "roofline"], hardware=hw)["roofline"].bandwidth == bw
        bound[bw] = set()
        for n in g.nodes():
            t = meta_result(n, "time")
            if t.bound == "memory":
                assert t.seconds == pytest.approx(meta_result(n, "cost").bytes / bw, rel=1e-12)
                bound[bw].add(n.name)
    assert bound[100e9] < bound[20e9]  # ops that kept up with the cache fall behind DRAM


def test_a_prefill_gemm_runs_at_its_shapes_rate_not_the_peak():
    hw = calibrated()
    g = tiny(seq_len=128, past_len=0)
    run(g, ["cost", "roofline"], hardware=hw)
    q = g["model.layers.0.mlp.gate_proj"]
    oc = meta_result(q, "cost")
    m, n, k = _output_mnk(g, q, oc.matmul)
    assert m == 128 and hw.calibration.gemm_rate(m, n, k) == 50e9  # the 512 x 1408 row, M=128
    t = meta_result(q, "time").seconds
    assert t == pytest.approx(max(oc.flops / 50e9, oc.bytes / 100e9), rel=1e-12)
    ideal = tiny(seq_len=128, past_len=0)
    run(ideal, ["cost", "roofline"], hardware=hw.ideal())
    t0 = meta_result(ideal[q.name], "time").seconds
    assert t0 == pytest.approx(max(oc.flops / 44.7e9, oc.bytes / 17.4e9), rel=1e-12)


def core_matmuls(g):
    """Layer 0's core-attention nodes that multiply (Q K^T and P V)."""
    return [
        n
        for n in g.nodes()
        if meta_result(n, "cost").matmul
        and any(k == "core_attention" and ".layers.0." in s for s, k in scopes_of(g, n.name))
    ]


@pytest.mark.parametrize(
    ("workload", "rate"),
    [
        # 8 keys: a quarter of the way from the 4-key to the 64-key row, in log
        ({"seq_len": 1, "past_len": 7}, math.exp(0.75 * math.log(1e9) + 0.25 * math.log(4e9))),
        ({"seq_len": 128, "past_len": 0}, 20e9),  # the prefill row
    ],
)
def test_fused_attention_runs_at_the_rate_measured_for_its_heads_and_step(workload, rate):
    hw = calibrated()
    assert hw.calibration.attention_rate(4, 2, 16, workload["seq_len"], workload["past_len"]) == (
        pytest.approx(rate, rel=1e-12)
    )
    without = hardware_from_dict(
        OLD_LOCAL | {"calibration": {k: v for k, v in TABLE.items() if k != "attention"}}, "local"
    )
    times = {}
    for name, h, attention in (("table", hw, "flash"), ("none", without, "flash"),
                               ("naive", hw, "naive")):  # fmt: skip
        g = tiny(**workload)
        run(g, ["cost", "roofline"], hardware=h, attention=attention)
        step = sum(meta_result(n, "cost").bytes for n in g.nodes())
        bw = hw.calibration.bandwidth_at(step)
        nodes = core_matmuls(g)
        assert len(nodes) == 2  # scores and values
        for n in nodes:
            oc = meta_result(n, "cost")
            flops = oc.matmul_causal if attention == "flash" else oc.flops
            # the table's rate under fused attention; the matmul peak without it, and for the
            # decomposed lowering's attention (its MatMuls, not the fused kernel timed)
            r = rate if name == "table" else 44.7e9
            want = max(flops / r, oc.bytes / bw)
            assert meta_result(n, "time").seconds == pytest.approx(want, rel=1e-12)
            assert flops / r > oc.bytes / bw  # compute-bound: the rate decides the time
        times[name] = sum(meta_result(n, "time").seconds for n in nodes)
    assert times["table"] > 2 * times["none"]  # the kernel measured far below the peak


def test_presets_and_old_local_files_time_as_before():
    old = hardware_from_dict(OLD_LOCAL, "local")
    assert calibrated().ideal() == replace(old, name="local")
    for hw in (old, load_hardware("h100"), load_hardware("h100").ideal()):
        r = run(tiny(), ["cost", "roofline"], hardware=hw)["roofline"]
        assert r.bandwidth == hw.bandwidth() and r.rate_model != "calibrated"


@pytest.mark.parametrize("workload", [{"seq_len": 300}, {"seq_len": 1, "past_len": 500}])
def test_one_layer_for_all_prices_the_full_steps_working_set(workload):
    # the working set is the whole step's bytes: reuse.py's unrolled layers must sum to it
    config = load_config("llama3.2-1b")
    wl = Workload(batch=1, **workload)
    hw = calibrated()
    got = reused_report(config, wl, hw)
    want, _ = trace_report(config, wl, hw)
    assert json_text(got) == json_text(want)
    assert got["roofline"]["bandwidth"] == 16e9  # 2.5 GB of bf16 weights: past the sweep
