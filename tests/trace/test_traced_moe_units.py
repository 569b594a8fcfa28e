"""Experts modules that compute in eager code of their own (DBRX's loop over the experts its
tokens hit), recorded whole as graphllm's MoE rows once their class is checked on random values:
the check itself, a class that computes otherwise left to its own code, and traced DBRX against
transformers (parameters total and active, FLOPs, logits, prefill and a cached step; ONNX)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.trace import traced_graph
from graphllm.trace.expert_units import experts_units, rows_reference
from tests.support.traced import B, T, check_traced, onnx_against_transformers

E, K, D, F = 4, 2, 32, 48
DBRX = dict(
    model_type="dbrx",
    d_model=D,
    n_layers=2,
    n_heads=4,
    vocab_size=96,
    max_seq_len=512,
    attn_config={"kv_n_heads": 2, "clip_qkv": 8.0, "rope_theta": 500000.0},
    ffn_config={"ffn_hidden_size": F, "moe_num_experts": E, "moe_top_k": K},
)


def _model():
    import torch
    import transformers

    fields = {k: v for k, v in DBRX.items() if k != "model_type"}
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(transformers.DbrxConfig(**fields))


def test_dbrx_experts_are_read_as_gate_up_and_down_after_the_check():
    units = experts_units(_model())
    assert set(units) == {f"transformer.blocks.{i}.ffn.experts" for i in range(2)}
    form = units["transformer.blocks.0.ffn.experts"]
    # w1 and v1 (out, in) a row block an expert, w2 (in, out): x w1^T, x v1^T, h w2
    assert form["weights"] == ("mlp.w1", "mlp.v1", "mlp.w2")
    assert form["roles"] == ("gate", "up", "down")
    assert form["layouts"] == ("linear", "linear", "matmul")
    assert form["flat"] == (True, True, True) and form["experts"] == E
    assert form["act"] == "silu" and form["ranks"] == [3]  # DBRX takes (B, T, d)


def test_the_rows_reference_is_the_experts_sum():
    rng = np.random.default_rng(0)
    form = experts_units(_model())["transformer.blocks.0.ffn.experts"]
    w1, v1, w2 = (0.2 * rng.standard_normal((E * F, D)).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((3, D)).astype(np.float32)
    idx = np.array([[0, 2], [3, 1], [2, 0]])
    w = rng.random((3, K)).astype(np.float32)
    want = np.zeros_like(x)
    for n in range(3):
        for j in range(K):
            e = slice(idx[n, j] * F, (idx[n, j] + 1) * F)
            g, u = x[n] @ w1[e].T, x[n] @ v1[e].T
            want[n] += w[n, j] * ((g / (1 + np.exp(-g)) * u) @ w2[e])
    got = rows_reference(form, [w1, v1, w2], x, idx, w)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_an_experts_class_that_computes_otherwise_runs_its_own_code(monkeypatch):
    from transformers.models.dbrx import modeling_dbrx

    def ungated(self, x, expert_w1, expert_v1, expert_w2):  # no activation on the gate
        return ((x @ expert_w1.T) * (x @ expert_v1.T)) @ expert_w2

    monkeypatch.setattr(modeling_dbrx.DbrxExpertGLU, "forward", ungated)
    assert experts_units(_model()) == {}
    with pytest.raises(ConfigError, match="nonzero"):
        traced_graph(DBRX, Workload(batch=B, seq_len=T, dtype="fp32"))


@pytest.mark.parametrize("past", [0, 4])
def test_traced_dbrx_equals_transformers(past):
    c = check_traced(DBRX, past)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    np.testing.assert_allclose(c.logits, c.want, atol=1e-4, rtol=0)
    g = c.graph
    assert not [n for n in g.nodes() if "nonzero" in n.op or "index_add" in n.op]
    for i in range(2):  # the replayed layer too
        p = f"transformer.blocks.{i}.ffn.experts"
        assert g[f"{p}.dispatch"].op == "moe_dispatch" and g[f"{p}.combine"].op == "moe_combine"
        assert g[f"{p}.gate"].op == g[f"{p}.up"].op == "expert_linear"
        assert g[f"{p}.down"].op == "expert_matmul"
        # the weights as the checkpoint holds them: flat, each expert's rows a block
        assert g[f"{p}.mlp.w2"].out.shape({}) == (E * F, D)


def test_traced_dbrx_counts_an_experts_share_of_its_flat_stacks_as_active():
    g = traced_graph(DBRX, Workload(batch=B, seq_len=T, dtype="fp32"))
    r = run(g, ["params"])["params"]
    experts = 2 * 3 * E * F * D
    assert r.by_kind["moe_experts"] == experts
    assert r.active == r.total - experts + experts * K // E


def test_traced_dbrx_on_onnxruntime(tmp_path):
    decode, prefill = onnx_against_transformers(DBRX, tmp_path)
    assert decode < 1e-4 and prefill < 1e-4
