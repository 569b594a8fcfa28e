"""Kimi Delta Attention traced (Kimi Linear, BailingHybrid): transformers' chunk_kda and
fused_recurrent_kda recorded whole and lowered onto the kda_* rows; tiny random models against
transformers' forward (prefill, several tokens after a past, one token after a past) and on
onnxruntime, their cache as transformers holds it; a published config's parameter count. The
rows themselves are checked against transformers' fallbacks in tests/ops/test_kda.py."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.trace import traced_graph
from tests.support.traced import P, assert_recurrent_equal, check_traced, onnx_against_transformers

_IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
# KDA then MLA, a dense MLP then an MoE one
_HYBRID = dict(
    vocab_size=96,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=16,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_rope_head_dim=4,
    qk_nope_head_dim=8,
    v_head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    layer_types=["linear_attention", "full_attention"],
    mlp_layer_types=["dense", "sparse"],
    **_IDS,
)
# two KDA heads of 8 channels, their decay from a low-rank forget gate (softplus)
KIMI = dict(_HYBRID, model_type="kimi_linear", linear_num_heads=2, linear_head_dim=8)
# the KDA heads are the attention's (4 of 8 channels); its decay a bounded sigmoid (safe gate)
BAILING = dict(_HYBRID, model_type="bailing_hybrid", head_dim=8, first_k_dense_replace=1)
MODELS = {"kimi_linear": KIMI, "bailing_hybrid": BAILING}


@pytest.mark.parametrize(("past", "new"), [(0, 5), (P, 5), (P, 1)])
@pytest.mark.parametrize("kind", sorted(MODELS))
def test_traced_kda_equals_transformers(kind, past, new):
    """Parameters, matmul FLOPs (FlopCounterMode), logits within 1e-4; one new token after a
    past steps from the carried state (fused_recurrent_kda), several chunk after it."""
    c = check_traced(MODELS[kind], past, new)
    assert_recurrent_equal(c, new)
    g, tokens = c.graph, c.results["tokens"].to_dict()
    rule = "kda_chunked" if not past else "kda_step" if new == 1 else "kda_chunked_state"
    assert {n.op for n in g.nodes() if n.op.startswith(("kda_", "gated_delta_"))} == {rule}
    assert rule in tokens["mixing_ops"]
    states = [k for k in g.outputs if k.endswith("recurrent_state")]
    assert states and all(g.output_role(k) == "state" for k in states)
    # the cache as transformers holds it: the KDA layer's conv inputs (q, k and v in one conv)
    # and its state, the MLA layer's keys and values
    held = sum(g.type_of(g.outputs[k]).numel(g.bindings) * 4 for k in g.outputs if "present" in k)
    assert c.results["memory"].state + c.results["memory"].kv_cache == held


def test_the_decay_is_a_key_channels_and_the_forget_gate_no_router():
    g = traced_graph(KIMI, Workload(seq_len=8, dtype="fp32"))
    core = next(n for n in g.nodes() if n.op == "kda_chunked")
    decay, value = (g.type_of(core.inputs[i]).shape(g.bindings) for i in (3, 2))
    assert decay == (1, 8, 2, 8) and value == (1, 8, 2, 8)  # (B, T, heads, d_k)
    params = {n.name: n.attrs.get("kind") for n in g.nodes("param")}
    gate = [k for k in params if ".forget_gate." in k]
    assert gate and {params[k] for k in gate} == {"linear_attention"}


@pytest.mark.parametrize("kind", sorted(MODELS))
@pytest.mark.parametrize("new", [1, 5])
def test_traced_kda_export_equals_transformers(kind, new, tmp_path):
    """One export (made at one token after a past) on onnxruntime: `new` tokens after 4 cached
    ones, and all of them from an empty cache, against transformers' forward of the whole
    sequence (the KDA rule one Scan over the new tokens, its decay per key channel)."""
    decode, prefill = onnx_against_transformers(MODELS[kind], tmp_path, new)
    assert decode < 1e-4, decode
    assert prefill < 1e-4, prefill


# moonshotai/Kimi-Linear-48B-A3B-Instruct's config.json, the fields that shape the model (as
# public copies of it hold them, e.g. github.com/pmains/kimi-linear-48b-ssd-streaming,
# benchmarks/results/phase-02-static-inventory.json, made from the repo at e1df551a); no
# quantization_config (a bf16 checkpoint)
_MLA_LAYERS = [4, 8, 12, 16, 20, 24, 27]  # 1-based, as the checkpoint numbers them
KIMI_LINEAR_48B = dict(
    model_type="kimi_linear",
    vocab_size=163840,
    hidden_size=2304,
    intermediate_size=9216,
    num_hidden_layers=27,
    num_attention_heads=32,
    num_key_value_heads=32,
    hidden_act="silu",
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    first_k_dense_replace=1,
    moe_intermediate_size=1024,
    moe_renormalize=True,
    num_experts=256,
    num_experts_per_token=8,
    num_shared_experts=1,
    routed_scaling_factor=2.446,
    num_expert_group=1,
    topk_group=1,
    q_lora_rank=None,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    model_max_length=1048576,
    linear_attn_config={
        "full_attn_layers": _MLA_LAYERS,
        "kda_layers": [i for i in range(1, 28) if i not in _MLA_LAYERS],
        "head_dim": 128,
        "num_heads": 32,
        "short_conv_kernel_size": 4,
    },
    bos_token_id=163584,
    eos_token_id=163586,
    pad_token_id=163839,
)


def test_kimi_linear_48b_parameters_equal_the_published_count():
    """Traced at full size on the meta device: 49,122,681,728 parameters, the sum of the
    tensors in the checkpoint's model.safetensors.index.json as the inventory cited above
    counts them (the model card: 48B total, 3B activated), 47,110,422,528 of them the routed
    experts, of which a token reads 8 of 256 in each of the 26 MoE layers."""
    g = traced_graph(KIMI_LINEAR_48B, Workload(seq_len=8))
    res = run(g, ["params", "memory"])
    total, routed = 49_122_681_728, 47_110_422_528
    assert res["params"].total == total
    assert res["params"].active == total - routed * 248 // 256
    # each of 20 KDA layers: its fp32 state (32 heads of 128 x 128) and its conv's last 4
    # inputs of q, k and v (3 x 4096 channels, bf16)
    assert res["memory"].state == 20 * (32 * 128 * 128 * 4 + 3 * 4096 * 4 * 2)
