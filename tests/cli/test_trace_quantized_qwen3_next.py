"""issue 19: the preset qwen3-next-80b-a3b-fp8 (Qwen/Qwen3-Next-80B-A3B-Instruct-FP8) against the
published checkpoint as a public per-tensor report lists it (GitHub; find_string
'/models/Qwen3-Next-80B-A3B-Instruct-FP8`'): 8 safetensors files whose tensors take 76.40 GiB,
81,329,784,384 stored values (parameters and one fp32 scale per 128x128 block), the MTP layer
(mtp.*) included; which matrices it stores e4m3 and which bf16."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from graphllm import build_graph, load_config
from graphllm.cli import main
from tests.support import quantized_checkpoints as qc

GIB = 1 << 30
TENSORS = 76.40 * GIB  # the report's sum of tensor sizes (its files: 76.42 GiB)
STORED_VALUES = 81_329_784_384


@pytest.fixture(scope="module")
def graph():
    return build_graph(load_config("qwen3-next-80b-a3b-fp8"), mtp=True)


def test_params_and_scales_add_up_to_the_stored_values(graph):
    params, scales = qc.stored_values(graph)
    assert params == 81_324_862_720
    assert params + scales == STORED_VALUES


def test_the_linear_attention_projections_as_transformers_converts_them(graph):
    def stored(name: str) -> str:
        n = graph[name]
        return n.attrs["stored"].dtype if "stored" in n.attrs else n.out.dtype

    p = "model.layers.0.linear_attn"
    assert stored(f"{p}.in_proj_qkvz.weight") == stored(f"{p}.out_proj.weight") == "fp8"
    # listed in modules_to_not_convert, or not an nn.Linear (conv1d), or a vector
    for kept in ("in_proj_ba.weight", "conv1d.weight", "A_log", "dt_bias", "norm.weight"):
        assert stored(f"{p}.{kept}") == "bf16", kept
    assert stored("model.layers.0.mlp.shared_expert_gate.weight") == "bf16"
    assert stored("model.layers.0.mlp.shared_expert.up_proj.weight") == "fp8"
    assert stored("mtp.fc.weight") == "bf16"
    assert stored("mtp.layers.0.self_attn.q_proj.weight") == "fp8"


@pytest.mark.parametrize("mtp", [True, False])
def test_trace_weights_are_the_checkpoints_size(mtp):
    args = ["trace", "--json", "-t", "1", "--model", "qwen3-next-80b-a3b-fp8"]
    r = CliRunner().invoke(main, [*args, *(["--mtp"] if mtp else [])])
    assert r.exit_code == 0, r.output
    weights = json.loads(r.stdout)["memory"]["weights"]
    if mtp:
        assert weights == pytest.approx(TENSORS, rel=0.001)
    else:  # the main model alone: the MTP layer is 1.55 GiB of the checkpoint
        assert TENSORS - weights == pytest.approx(1.5463 * GIB, rel=0.001)
