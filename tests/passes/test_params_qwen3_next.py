"""issue 19: Qwen3-Next-80B-A3B's parameters, exact: the main model against transformers' own
model on the meta device, and with the checkpoint's MTP layer against the checkpoint's total."""

from __future__ import annotations

import pytest

import graphllm
from graphllm.passes import run

MAIN = 79_674_391_296  # transformers' Qwen3NextForCausalLM of the published config
ACTIVE = 3_874_929_408  # 10 of 512 experts and the shared expert per token
# Qwen/Qwen3-Next-80B-A3B-Instruct's checkpoint, its mtp.* layer included (issue 19)
CHECKPOINT = 81_324_862_720


@pytest.fixture(scope="module")
def report():
    cfg = graphllm.load_config("qwen3-next-80b-a3b")
    return cfg, run(graphllm.build_graph(cfg, graphllm.Workload(seq_len=4)), ["params"])["params"]


def test_main_model_and_active_parameters(report):
    _, r = report
    assert (r.total, r.active) == (MAIN, ACTIVE)


def test_equals_transformers_meta_model(report):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    _, r = report
    from graphllm.models.config import _load_preset

    d, _ = _load_preset("qwen3-next-80b-a3b")
    drop = ("architectures", "model_type", "transformers_version", "torch_dtype")
    hf = transformers.Qwen3NextConfig(
        **{k: v for k, v in d.items() if not k.startswith("_") and k not in drop}
    )
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    assert sum(p.numel() for p in model.parameters()) == r.total


def test_with_the_checkpoints_mtp_layer_the_total_is_the_checkpoints(report):
    """The MTP layer (vLLM's qwen3_next_mtp: fc over [embedding; hidden], a norm on each, one
    full-attention decoder layer with the MoE, a final norm; embedding and head shared) in
    closed form from the config: with it the count is the checkpoint's."""
    cfg, r = report
    d, e = cfg.hidden_size, cfg.head_dim
    h, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    attention = d * 2 * h * e + 2 * d * kv * e + h * e * d + 2 * e  # gated q, k, v, o, q/k norms
    experts = cfg.num_experts * 3 * d * cfg.moe_intermediate_size
    shared = 3 * d * cfg.shared_expert_intermediate_size + d  # and its gate
    layer = attention + 2 * d + cfg.num_experts * d + experts + shared
    mtp = 2 * d * d + 2 * d + layer + d
    assert mtp == 1_650_471_424
    assert r.total + mtp == CHECKPOINT


def test_the_linear_layers_weights_by_name(report):
    cfg, _ = report
    g = graphllm.build_graph(cfg.with_layers(4), graphllm.Workload(seq_len=4))
    p = "model.layers.0.linear_attn"
    shapes = {n.name: n.out.shape() for n in g.params() if n.name.startswith(p)}
    assert shapes == {
        f"{p}.in_proj_qkvz.weight": (2 * 16 * 128 + 2 * 32 * 128, 2048),
        f"{p}.in_proj_ba.weight": (64, 2048),
        f"{p}.conv1d.weight": (2 * 16 * 128 + 32 * 128, 1, 4),
        f"{p}.A_log": (32,),
        f"{p}.dt_bias": (32,),
        f"{p}.norm.weight": (128,),
        f"{p}.out_proj.weight": (2048, 32 * 128),
    }
    assert g["model.layers.3.self_attn.q_proj.weight"].out.shape() == (2 * 16 * 256, 2048)
