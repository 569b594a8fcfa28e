"""Checkpoint loading (build/weights.py): a bf16 or fp16 checkpoint of a tiny transformers model
loads into fp32 as stored, each graph param from its tensor, MoE experts one tensor each."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import graphllm  # noqa: E402
from graphllm.build.weights import load_weights  # noqa: E402


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", ["llama-bias", "mixtral"])
def test_half_precision_checkpoint(tiny_model, tmp_path, case, dtype):
    m = tiny_model(case)
    half = copy.deepcopy(m.model).to(getattr(torch, dtype))
    half.save_pretrained(tmp_path)
    state = {k: v.float().numpy() for k, v in half.state_dict().items()}
    assert graphllm.load_config(tmp_path).num_experts == m.cfg.num_experts
    got = load_weights(m.graph(), tmp_path)
    assert set(got) == {n.name for n in m.graph().params()}
    for name, arr in got.items():
        assert arr.dtype == np.float32
        np.testing.assert_array_equal(arr, _from_state(state, name), err_msg=name)
    fp32 = m.model.state_dict()["model.embed_tokens.weight"].numpy()
    assert not np.array_equal(got["model.embed_tokens.weight"], fp32)  # stored rounded


def _from_state(state: dict[str, np.ndarray], name: str) -> np.ndarray:
    """The in-memory tensor a graph param holds. transformers 5 keeps each MoE layer's experts
    fused, as `experts.gate_up_proj` (E, 2 ffn, d) and `experts.down_proj` (E, d, ffn), in a
    module named `mlp`; the checkpoint has one tensor per expert (`*` in the graph's name)."""
    name = name.replace(".block_sparse_moe.", ".mlp.")
    if "*" not in name:
        return state[name]
    prefix, role = name.split(".*.")
    if role in ("w2.weight", "down_proj.weight"):
        return state[f"{prefix}.down_proj"]
    gate, up = np.split(state[f"{prefix}.gate_up_proj"], 2, axis=1)
    return gate if role in ("w1.weight", "gate_proj.weight") else up
