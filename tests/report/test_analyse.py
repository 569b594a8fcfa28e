"""`graphllm.analyse` (report/analyse.py) gives what `passes.run` gives on the full graph, figure
for figure: every field of every report walked (ints, strings and arrays exact, floats to 1e-12
relative), on dense, MoE, MLA, sliding and hybrid models, prefill and decode, with the options
passed through; and it takes the one-layer path where that stands for the model, the full graph
where it does not."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import graphllm
from graphllm import passes
from graphllm.cli import main
from graphllm.files import json_text
from graphllm.models.hardware import load_hardware
from graphllm.passes.parallel.engine import mla_form
from graphllm.report import analyse as api
from graphllm.report.trace_report import ANALYSES

PREFILL = {"batch": 1, "seq_len": 300}  # intervals (over 256 positions)
SHORT = {"batch": 1, "seq_len": 40}  # bit sets
DECODE = {"batch": 2, "seq_len": 1, "past_len": 500}

CASES = [
    ("llama3.2-1b", PREFILL, {}),
    ("llama3.2-1b", DECODE, {"training": True}),
    ("mixtral-8x7b", SHORT, {"attention": "naive"}),  # MoE
    ("qwen3-30b-a3b", DECODE, {"hardware": None}),
    ("deepseek-v2-lite", SHORT, {}),  # MLA, a dense first layer then MoE
    ("deepseek-v2-lite", DECODE, {"mla": "absorbed"}),
    ("gemma3-1b", PREFILL, {"exact_sets": True}),  # 5 sliding : 1 global
    ("gemma3-1b", {**SHORT, "past_len": 1000, "dtype": "fp8"}, {"ideal": True}),
    ("qwen3-next-80b-a3b", SHORT, {"cuda_graphs": True}),  # 3 linear attention : 1 full
    ("nemotron-h-8b", DECODE, {}),  # Mamba, attention and MLP layers
    ("nemotron-h-8b", PREFILL, {"exact_sets": False, "training": True}),
]


def same(got: Any, want: Any, where: str = "") -> None:
    """`got` is `want`: the same types and structure, ints and arrays exact, floats to 1e-12."""
    assert type(got) is type(want), f"{where}: {type(got).__name__} != {type(want).__name__}"
    if isinstance(want, float):
        assert math.isclose(got, want, rel_tol=1e-12, abs_tol=0.0) or (
            math.isnan(got) and math.isnan(want)
        ), f"{where}: {got!r} != {want!r}"
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and np.array_equal(got, want), where
    elif dataclasses.is_dataclass(want):
        for f in dataclasses.fields(want):
            same(getattr(got, f.name), getattr(want, f.name), f"{where}.{f.name}")
    elif isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys differ"
        for k in want:
            same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: {len(got)} != {len(want)} items"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            same(g, w, f"{where}[{i}]")
    elif hasattr(want, "__dict__"):  # the token pass's Deps: its arrays
        same(vars(got), vars(want), f"{where}.__dict__")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _full(preset: str, workload: dict, options: dict) -> passes.Results:
    """What a library user gets without `analyse`: the full graph through `passes.run`."""
    config = graphllm.load_config(preset)
    wl = graphllm.Workload(**workload)
    hw = api._hardware(
        options.get("hardware", "h100"), options.get("ideal", False), options.get("cuda_graphs")
    )
    phase = "training" if options.get("training") else wl.phase
    graph = graphllm.build_graph(
        config, wl, mla=mla_form(config, phase, options.get("mla", "auto"))
    )
    kw = {k: options[k] for k in ("attention", "training", "exact_sets") if k in options}
    return passes.run(graph, ANALYSES, hardware=hw, **kw)


_analysed = api.analysed  # the full-graph path, before a test replaces it


def _fast_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The full-graph fallback fails the test: `analyse` must stand one layer for its kind."""

    def no(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("analyse built the full graph")

    monkeypatch.setattr(api, "analysed", no)


@pytest.mark.parametrize(
    ("preset", "workload", "options"), CASES, ids=[f"{p}-{w}-{o}" for p, w, o in CASES]
)
def test_analyse_is_passes_run_on_the_full_graph(
    preset: str, workload: dict, options: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _full(preset, workload, options)
    with monkeypatch.context() as m:
        _fast_only(m)
        got = graphllm.analyse(preset, graphllm.Workload(**workload), **options)
    assert isinstance(got, passes.Results)
    assert list(got) == list(want) == ANALYSES
    same(got, want, "results")
    for name in ("params", "tokens", "memory", "roofline"):  # and so their JSON
        if want[name] is not None:
            assert json_text(got[name].to_dict()) == json_text(want[name].to_dict()), name
    assert (got["roofline"] is None) == ("hardware" in options)
    if options.get("ideal"):
        assert got["roofline"].rate_model == "ideal"
    if options.get("cuda_graphs"):
        assert got["roofline"].cuda_graphs


def test_the_walk_sees_a_changed_figure() -> None:
    got = graphllm.analyse("llama3.2-1b", {"seq_len": 16})
    want = graphllm.analyse("llama3.2-1b", {"seq_len": 16})
    same(got, want)
    moved = dataclasses.replace(want["cost"], flops={**want["cost"].flops, "total": 1})
    with pytest.raises(AssertionError, match="flops"):
        same(moved, got["cost"])
    with pytest.raises(AssertionError, match="seconds"):
        same(
            dataclasses.replace(got["roofline"], seconds=got["roofline"].seconds * (1 + 1e-9)),
            want["roofline"],
        )


def test_what_one_layer_cannot_stand_for_is_analysed_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # DeepSeek-V3's MTP module reads the main model's last hidden state
    wl = {"batch": 1, "seq_len": 8}
    config = graphllm.load_config("deepseek-v3")
    calls = []
    monkeypatch.setattr(api, "analysed", lambda *a: calls.append(a) or _analysed(*a))
    got = graphllm.analyse(config, wl, mtp=True)
    assert len(calls) == 1
    graph = graphllm.build_graph(config, graphllm.Workload(**wl), mtp=True)
    same(got, passes.run(graph, ANALYSES, hardware=load_hardware("h100")))
    assert got["params"].mtp > 0


def test_defaults_are_traces() -> None:
    # a preset name, no workload: T=2048 as `graphllm trace`, timed on an H100
    got = graphllm.analyse("qwen3-0.6b", None)
    assert got["tokens"].positions == 2048
    assert got["roofline"].hardware == load_hardware("h100").name
    assert graphllm.analyse("qwen3-0.6b", {"dtype": "fp8"})["memory"].weights_by_dtype.keys() == {
        "fp8"
    }


@pytest.mark.parametrize(("option", "value"), [("attention", "eager"), ("mla", "latent")])
def test_an_unknown_form_is_a_config_error(option: str, value: str) -> None:
    with pytest.raises(graphllm.ConfigError, match=f"{option} must be one of .*{value}"):
        graphllm.analyse("llama3.2-1b", {"seq_len": 4}, **{option: value})


def test_a_seq_len_of_none_is_not_given() -> None:
    assert graphllm.analyse("qwen3-0.6b", {"seq_len": None}, None)["tokens"].positions == 2048


def test_a_yaml_configs_workload_section_fills_what_is_not_given() -> None:
    path = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"
    got = graphllm.analyse(path, {"seq_len": 4})  # the file says batch 2, T=8, fp32
    wl = graphllm.Workload(batch=2, seq_len=4, dtype="fp32")
    graph = graphllm.build_graph(graphllm.load_config(path), wl)
    same(got, passes.run(graph, ANALYSES, hardware=load_hardware("h100")))
    assert got["roofline"].tokens_per_step == 8


@pytest.mark.parametrize("dtype", [None, "bf16"])
def test_weight_bytes_are_traces(dtype: str | None) -> None:
    # a dtype named replaces DeepSeek-V3's FP8 checkpoint format in both: 1,342 GB in bf16,
    # 673 GB as stored
    flags = ["--dtype", dtype] if dtype else []
    r = CliRunner().invoke(main, ["trace", "--model", "deepseek-v3", "--json", *flags])
    assert r.exit_code == 0, r.output
    want = json.loads(r.stdout)["memory"]
    got = graphllm.analyse("deepseek-v3", {"dtype": dtype})["memory"]
    assert got.weights == want["weights"] and got.weights_by_dtype == want["weights_by_dtype"]
    assert round(got.weights / 1e9) == (1342 if dtype else 673)
    assert ("fp8" in got.weights_by_dtype) == (dtype is None)


def test_mla_auto_is_the_engines_form_for_the_phase() -> None:
    # trace's default: absorbed for a decode step, naive for a prefill and for training
    def flops(workload: dict, mla: str, **kw: Any) -> float:
        return graphllm.analyse("deepseek-v2-lite", workload, None, mla=mla, **kw)["cost"].flops[
            "total"
        ]

    assert flops(DECODE, "auto") == flops(DECODE, "absorbed") != flops(DECODE, "naive")
    default = graphllm.analyse("deepseek-v2-lite", DECODE, None)["cost"].flops["total"]
    assert default == flops(DECODE, "auto")  # the library prices what trace prices
    assert flops(SHORT, "auto") == flops(SHORT, "naive") != flops(SHORT, "absorbed")
    assert flops(DECODE, "auto", training=True) == flops(DECODE, "naive", training=True)
    # a model without MLA: auto is naive, absorbed is refused
    assert flops_of("llama3.2-1b", "auto") == flops_of("llama3.2-1b", "naive")
    with pytest.raises(graphllm.ConfigError, match="has no latent attention"):
        graphllm.analyse("llama3.2-1b", DECODE, None, mla="absorbed")


def flops_of(preset: str, mla: str) -> float:
    return graphllm.analyse(preset, DECODE, None, mla=mla)["cost"].flops["total"]
