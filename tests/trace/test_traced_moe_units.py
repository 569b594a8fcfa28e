"""Experts modules that compute in eager code of their own (DBRX's loop over the experts its
tokens hit) and ScatterMoE blocks (JetMoE's MoE and mixture of attention heads, which hand the
experts' counts to Python), recorded whole as graphllm's MoE rows once their class is checked on
random values: the check itself, a class that computes otherwise left to its own code, and the
traced models against transformers (parameters total and active, FLOPs, logits, prefill and a
cached step; ONNX)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.trace import traced_graph
from graphllm.trace.expert_units import experts_units, rows_reference
from graphllm.trace.routed_blocks import routed_units
from graphllm.trace.scopes import scope_kinds
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


# two experts a token of four, in the MLP and in the attention (each choice its own query
# heads, h_kv of them)
JETMOE = dict(
    model_type="jetmoe",
    vocab_size=96,
    hidden_size=D,
    intermediate_size=F,
    num_hidden_layers=2,
    num_key_value_heads=2,
    kv_channels=8,
    num_local_experts=E,
    num_experts_per_tok=K,
    max_position_embeddings=512,
    bos_token_id=0,
    eos_token_id=0,
)


def _model(raw=DBRX):
    import torch
    import transformers

    fields = {k: v for k, v in raw.items() if k != "model_type"}
    cfg = transformers.CONFIG_MAPPING[raw["model_type"]](**fields)
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(cfg)


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
    monkeypatch.setenv("GRAPHLLM_TRACE_CACHE", "0")  # the model's code runs, not a recording
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


def test_jetmoe_blocks_are_read_as_moe_rows_after_the_check():
    units = routed_units(_model(JETMOE))
    for i in range(2):
        assert units[f"model.layers.{i}.mlp"] == {"kind": "mlp", "act": "silu"}
        assert units[f"model.layers.{i}.self_attention.experts"] == {"kind": "attention"}


def test_a_scatter_block_that_computes_otherwise_runs_its_own_code(monkeypatch):
    from transformers.models.jetmoe import modeling_jetmoe

    own = modeling_jetmoe.JetMoeMoE.forward
    monkeypatch.setattr(modeling_jetmoe.JetMoeMoE, "forward", lambda self, x: 2 * own(self, x))
    monkeypatch.setenv("GRAPHLLM_TRACE_CACHE", "0")  # the model's code runs, not a recording
    units = routed_units(_model(JETMOE))
    assert set(units) == {f"model.layers.{i}.self_attention.experts" for i in range(2)}
    # its own code hands the experts' counts to Python
    with pytest.raises(ConfigError, match=r"model\.layers\.0\.mlp\.router"):
        traced_graph(JETMOE, Workload(batch=B, seq_len=T, dtype="fp32"))


@pytest.mark.parametrize("past", [0, 4])
def test_traced_jetmoe_equals_transformers(past):
    c = check_traced(JETMOE, past)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    np.testing.assert_allclose(c.logits, c.want, atol=1e-4, rtol=0)
    g = c.graph
    for i in range(2):  # the replayed layer too
        moa, mlp = f"model.layers.{i}.self_attention.experts", f"model.layers.{i}.mlp"
        assert g[f"{moa}.dispatch"].op == "moe_dispatch" and g[f"{moa}.gather"].op == "moe_gather"
        assert g[f"{moa}.dispatch_pairs"].op == "moe_dispatch_pairs"
        assert g[f"{moa}.combine"].op == g[f"{mlp}.combine"].op == "moe_combine"
        assert g[f"{mlp}.gate_up"].op == g[f"{mlp}.down"].op == "expert_linear"
    # the experts' stacks count as routed experts, in the attention too
    r = c.results["params"]
    experts = 2 * E * (2 * F * D + F * D + 2 * 16 * D)
    assert r.by_kind["moe_experts"] == experts
    assert r.active == r.total - experts + experts * K // E


def test_traced_jetmoe_on_onnxruntime(tmp_path):
    decode, prefill = onnx_against_transformers(JETMOE, tmp_path)
    assert decode < 1e-4 and prefill < 1e-4


# published configs (dbrx-instruct, jetmoe-8b): each class is checked at a few elements a width,
# not at the model's (DBRX's experts alone hold 126 billion weights)
DBRX_INSTRUCT = dict(
    model_type="dbrx",
    d_model=6144,
    n_heads=48,
    n_layers=40,
    max_seq_len=32768,
    vocab_size=100352,
    attn_config={"kv_n_heads": 8, "clip_qkv": 8, "rope_theta": 500000},
    ffn_config={"ffn_hidden_size": 10752, "moe_num_experts": 16, "moe_top_k": 4},
)
JETMOE_8B = dict(
    model_type="jetmoe",
    hidden_size=2048,
    intermediate_size=5632,
    kv_channels=128,
    max_position_embeddings=4096,
    num_experts_per_tok=2,
    num_key_value_heads=16,
    num_hidden_layers=24,
    num_local_experts=8,
    tie_word_embeddings=True,
    vocab_size=32000,
    bos_token_id=1,
    eos_token_id=2,
)


@pytest.mark.parametrize(
    ("raw", "k", "e", "active_billions"), [(DBRX_INSTRUCT, 4, 16, 36), (JETMOE_8B, 2, 8, 2)]
)
def test_published_configs_count_transformers_parameters(raw, k, e, active_billions):
    model = _model(raw)
    want = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    g = traced_graph(raw, Workload(batch=1, seq_len=8, dtype="bf16"))
    r = run(g, ["params"])["params"]
    assert r.total == want  # DBRX 131,596,523,520; JetMoE-8B 8,522,237,952
    experts = r.by_kind["moe_experts"]
    assert r.active == want - experts + experts * k // e
    assert int(r.active / 1e9) == active_billions  # DBRX's published 36B active


def test_dbrx_norm_attention_norm_wrapper_is_no_norm():
    # its attention is drawn and counted as one (the attention view of a traced DBRX)
    kinds = scope_kinds(
        {
            "transformer": "DbrxModel",
            "transformer.blocks.0.norm_attn_norm": "DbrxNormAttentionNorm",
            "transformer.blocks.0.norm_attn_norm.attn": "DbrxAttention",
            "transformer.blocks.0.norm_attn_norm.norm_1": "LayerNorm",
        }
    )
    assert "transformer.blocks.0.norm_attn_norm" not in kinds
    assert kinds["transformer.blocks.0.norm_attn_norm.attn"] == "attention"
    assert kinds["transformer.blocks.0.norm_attn_norm.norm_1"] == "norms"
