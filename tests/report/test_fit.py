"""`trace` on a device too small for the model: the fewest devices a layout fits on."""

import dataclasses
import json
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from graphllm.cli import main
from graphllm.models.config import load_config
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.passes.parallel.plan import plan
from graphllm.passes.training import TrainingOptions
from graphllm.report.fit import PINNED, fit_section, training_fit_section
from graphllm.report.trace_report import trace_report


def _fit(model: str, hardware: str, **wl):
    cfg, hw = load_config(model), load_hardware(hardware)
    workload = Workload.with_dtype(None, **({"seq_len": 16} | wl))
    doc, _ = trace_report(cfg, workload, hw)
    return cfg, workload, hw, fit_section(cfg, workload, hw, doc["memory"])


def test_the_count_is_the_first_a_layout_fits_on():
    cfg, wl, hw, fit = _fit("llama3-70b", "h100")
    assert not fit["fits"] and fit["needs"] > hw.memory_bytes
    n = fit["devices"]
    assert n >= 2 and fit["layout_memory_bytes"] <= hw.memory_bytes
    assert plan(cfg, wl, n, hw, pinned=PINNED).candidates
    for fewer in range(1, n):
        assert not plan(cfg, wl, fewer, hw).candidates  # not even with dp or cp


def test_moe_counts_expert_parallel_layouts():
    _, _, hw, fit = _fit("mixtral-8x22b", "a100")
    assert fit["devices"] == 4 and set(fit["layout"]) <= {"tp", "pp", "ep"}
    assert fit["layout_memory_bytes"] <= hw.memory_bytes


def test_a_model_that_fits_has_no_count():
    _, _, _, fit = _fit("llama3-8b", "h100")
    assert fit["fits"] and "devices" not in fit


def test_trace_says_so_on_the_roofline_line():
    r = CliRunner().invoke(main, ["trace", "--model", "llama3-70b", "-t", "16", "--json"])
    fit = json.loads(r.stdout)["fit"]
    r = CliRunner().invoke(main, ["trace", "--model", "llama3-70b", "-t", "16"])
    assert r.exit_code == 0, r.output
    line = " ".join(r.stdout[r.stdout.index("roofline on") :].split())
    assert "does not fit one h100-sxm" in line
    n = fit["devices"]
    command = f"graphllm plan --model llama3-70b -t 16 -n {n} --hardware h100"
    assert f"`{command}` ranks their layouts" in line
    r = CliRunner().invoke(main, ["trace", "--model", "llama3-8b", "-t", "16"])
    assert "does not fit" not in r.stdout


def test_the_plan_command_it_prints_runs_on_the_same_workload(tmp_path):
    """The hint is a command as given: the trace's config and workload flags, the count, the
    device; run as printed, its best layout is the one the count came from."""
    cfg = tmp_path / "big.yaml"
    cfg.write_text(
        (Path("examples") / "llama.yaml")
        .read_text()
        .replace("num_hidden_layers: 32", "num_hidden_layers: 320")
    )
    args = ["--config", str(cfg), "-b", "4", "--past-len", "1024", "-t", "1", "--kv-dtype", "fp8"]
    r = CliRunner().invoke(main, ["trace", *args, "--hardware", "a100", "--json"])
    assert r.exit_code == 0, r.output
    fit = json.loads(r.stdout)["fit"]
    words = shlex.split(fit["plan_command"])
    assert words[:2] == ["graphllm", "plan"] and words[-4:] == [
        "-n",
        str(fit["devices"]),
        "--hardware",
        "a100",
    ]
    assert words[2:-4] == args
    ran = CliRunner().invoke(main, [*words[1:], "--json"])
    assert ran.exit_code == 0, ran.output
    best = json.loads(ran.stdout)["plan"]["candidates"][0]
    assert best["memory_bytes"] <= load_hardware("a100").memory_bytes


def test_a_device_without_links_says_why_no_count():
    cfg, hw = load_config("llama3-70b"), load_hardware("h100")
    lone = dataclasses.replace(hw, name="lone", interconnect_bandwidth=None)
    wl = Workload(seq_len=16)
    doc, _ = trace_report(cfg, wl, lone)
    fit = fit_section(cfg, wl, lone, doc["memory"])
    assert not fit["fits"] and fit["devices"] is None
    assert fit["unplanned"] == "lone has no links to lay a model out over"


def test_a_training_step_fits_on_its_training_memory():
    """trace --training weighs weights, gradients, Adam's fp32 state and the saved activations
    (plan's figures for one device), and counts the fewest devices with plan's training search."""
    cfg, hw = load_config("llama3-70b"), load_hardware("h100")
    wl = Workload(seq_len=4096)
    fit = training_fit_section(cfg, wl, hw)
    parts = fit["parts"]
    assert fit["needs"] == pytest.approx(sum(parts.values()))
    # 2 bytes of bf16 weight and of gradient, 12 of Adam (fp32 master, two moments) a parameter
    params = plan(cfg, wl, 1, hw, TrainingOptions()).too_big[0]["stages"][0]["params"]
    assert parts["weights"] == parts["gradients"] == 2 * params
    assert parts["optimizer"] == 12 * params
    assert not fit["fits"] and fit["devices"] == 16
    assert not plan(cfg, wl, 15, hw, TrainingOptions(), pinned=PINNED).candidates
    assert plan(cfg, wl, 16, hw, TrainingOptions(), pinned=PINNED).candidates
    r = CliRunner().invoke(main, ["trace", "--model", "llama3-70b", "-t", "4096", "--training"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "workload: training step (forward + backward)" in text
    assert "training memory on one device (Adam, fp32 state, recompute none, ZeRO-0)" in text
    assert "16 devices are the fewest" in text
    assert "`graphllm plan --model llama3-70b -t 4096 --training -n 16 --hardware h100`" in text
    small = training_fit_section(
        load_config("llama3-8b"), Workload(seq_len=1024), load_hardware("h200")
    )
    assert small["fits"] and "devices" not in small
