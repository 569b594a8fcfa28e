"""The mask relation read from transformers' mask functions, and sizes fitted to the probes."""

from __future__ import annotations

import pytest

from graphllm.errors import ConfigError
from graphllm.models.config import read_config_source
from graphllm.models.workload import Workload
from graphllm.trace import traced_graph
from graphllm.trace.relation import read_relation
from graphllm.trace.scopes import param_kind, scope_kinds
from graphllm.trace.symbolic import DECODE_PROBES, PREFILL_PROBES, Expr, fit

masking = pytest.importorskip("transformers.masking_utils")


def test_causal_window_and_chunk_relations():
    assert read_relation(masking.causal_mask_function) == {"causal": True, "window": None}
    window = masking.sliding_window_causal_mask_function(4096)
    assert read_relation(window) == {"causal": True, "window": 4096}

    # Llama 4's chunked attention, as transformers' chunked overlay computes it unpadded
    def chunk(b, h, q, k):
        return k <= q and k // 8192 == q // 8192

    assert read_relation(chunk) == {"causal": True, "window": None, "chunk": 8192}
    assert read_relation(masking.bidirectional_mask_function)["causal"] is False


def test_a_mask_no_relation_describes_is_refused():
    with pytest.raises(ConfigError, match="not a causal, sliding-window or chunked"):
        read_relation(lambda b, h, q, k: (q + k) % 3 == 0)


@pytest.mark.parametrize(
    ("rule", "points"),
    [
        (Expr(0, 4096, 0, 0), PREFILL_PROBES),
        (Expr(1, 0, 1, 0), PREFILL_PROBES),  # B*T: tokens flattened
        (Expr(1, 0, 8, 0), PREFILL_PROBES),  # B*T*k routed pairs
        (Expr(0, 0, 1, 1), DECODE_PROBES),  # S = P + T
        (Expr(0, 0, 0, 1), DECODE_PROBES),  # the past
        (Expr(1, 1, 0, 0), DECODE_PROBES),  # B
    ],
)
def test_fit_recovers_each_rule(rule, points):
    assert fit([rule.value(*p) for p in points], points) == rule


def test_a_size_that_branches_fits_nothing():
    # min(T, 6): a sliding cache cut at its window, seen below and above it
    assert fit([min(t, 6) for _, t, _ in PREFILL_PROBES], PREFILL_PROBES) is None


def test_overlays_of_packed_sequences_and_image_blocks_read_as_one_text_sequence():
    # transformers adds these when it cannot tell the tokens' values (on fake tensors): which
    # packed sequence each token is of (its positions remapped), which image block it is in
    torch = pytest.importorskip("torch")
    positions, sequences = torch.zeros((2, 5), dtype=torch.long), torch.zeros((2, 5))
    packed = masking.and_masks(
        masking.remap_positions_for_packed_sequence(masking.causal_mask_function, positions),
        masking.packed_sequence_mask_function(sequences),
    )
    assert read_relation(packed) == {"causal": True, "window": None}
    blocks = masking.or_masks(
        masking.causal_mask_function, masking.blockwise_overlay(torch.full((2, 5), -1))
    )
    assert read_relation(blocks) == {"causal": True, "window": None}


@pytest.mark.parametrize(
    ("preset", "other"),
    [("mixtral-8x7b", "kv_head"), ("qwen3-30b-a3b", "head_dim")],  # 8 = KV heads, 128 = head dim
)
def test_the_expert_axis_is_named_so_where_another_field_has_its_size(preset, other):
    raw, name = read_config_source(preset)
    g = traced_graph({**raw, "num_hidden_layers": 1}, Workload(seq_len=16), name)
    experts = g.meta["config"].num_experts
    layer = "model.layers.0.mlp"
    for node in ("gate.weight", "gate", "experts.gate_up_proj", "experts.dispatch"):
        n = g[f"{layer}.{node}"]
        expert_axes = [d for d in n.out.dims if d.role == "expert"]
        assert [d.size for d in expert_axes] == [experts], node
    # the router's scores keep the axis through the code between units (cast, softmax)
    scores = [n for n in g.nodes() if n.name.startswith(f"{layer}.gate.") and "softmax" in n.name]
    assert scores and all(n.out.dims[-1].role == "expert" for n in scores)
    # and the attention's axes of the same size keep their own role
    attention = [d.role for n in g.nodes() if ".self_attn." in n.name for d in n.out.dims]
    assert other in attention and "expert" not in attention


def test_scope_kinds_read_gates_and_shared_experts_by_what_they_do():
    kinds = scope_kinds(
        {
            "model.layers.0.mlp": "InklingSparseMoeBlock",
            "model.layers.0.mlp.gate": "Qwen2MoeTopKRouter",
            "model.layers.0.mlp.experts": "InklingExperts",
            "model.layers.0.mlp.shared_experts": "InklingSharedExperts",  # on every token
            "model.layers.0.mlp.shared_expert": "Qwen2MoeMLP",
            "model.layers.0.residual_gate": "ErgoResidualGate",  # scales a stream
            "model.layers.0.self_attn.f_a_proj": "KimiForgetGate",  # makes a decay
        }
    )
    assert kinds["model.layers.0.mlp.gate"] == "router"
    assert kinds["model.layers.0.mlp.experts"] == "experts"
    assert kinds["model.layers.0.mlp.shared_experts"] == "shared_expert"
    assert kinds["model.layers.0.mlp.shared_expert"] == "shared_expert"
    assert "model.layers.0.residual_gate" not in kinds
    assert "model.layers.0.self_attn.f_a_proj" not in kinds
    weight = param_kind("model.layers.0.mlp.shared_experts.gate_up_proj", kinds)
    assert weight == "shared_experts"  # not routed experts: counted active on every token


def test_a_class_is_read_without_its_familys_name():
    # Kimi Linear's MLA layer is KimiLinear + Attention, not a LinearAttention
    kinds = scope_kinds(
        {
            "model": "KimiLinearModel",
            "model.layers.0.self_attn": "KimiLinearDeltaAttention",
            "model.layers.3.self_attn": "KimiLinearAttention",
            "model.layers.0.mlp": "KimiLinearMoE",
        }
    )
    assert kinds["model.layers.0.self_attn"] == "linear_attention"
    assert kinds["model.layers.3.self_attn"] == "attention"
    assert kinds["model.layers.0.mlp"] == "moe"
