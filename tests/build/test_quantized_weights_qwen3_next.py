"""issue 19: a tiny Qwen3-Next FP8 checkpoint, quantized by the published block rule with the
published skip pattern (Qwen/Qwen3-Next-80B-A3B-Instruct-FP8's modules_to_not_convert: per layer
the norms, in_proj_ba, conv1d, A_log, dt_bias, the router and shared_expert_gate), loads through
graphllm.load_config + load_weights: the Linear projections of the Gated DeltaNet layers
(in_proj_qkvz, out_proj) are stored e4m3 and dequantized, the rest read as stored, and the
interpreter's logits equal transformers' own Qwen3Next loaded from the same folder (transformers
dequantizes FP8 on CPU once accelerate is there), a prefill longer than a chunk and cached steps.
"""

from __future__ import annotations

import numpy as np
import pytest

import graphllm
from graphllm.build.weights import load_weights
from graphllm.runtime.interpret import run_graph
from tests.support import quantized_checkpoints as qc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

BATCH, SEQ, STEPS = 2, 70, 3
SMALL = {  # every quantized matrix a whole number of 16x32 blocks
    "vocab_size": 128,
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "intermediate_size": 64,
    "full_attention_interval": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": False,
}


def _skips(layers: int, every: int) -> list[str]:
    """The published list's pattern (lm_head, then each layer's unconverted modules)."""
    out = ["lm_head"]
    for i in range(layers):
        p = f"model.layers.{i}"
        out += [f"{p}.input_layernorm", f"{p}.post_attention_layernorm"]
        out += [f"{p}.mlp.gate", f"{p}.mlp.shared_expert_gate"]
        if (i + 1) % every:
            out += [f"{p}.linear_attn.{m}" for m in ("A_log", "conv1d", "dt_bias", "in_proj_ba")]
            out.append(f"{p}.linear_attn.norm")
        else:
            out += [f"{p}.self_attn.k_norm", f"{p}.self_attn.q_norm"]
    return out


FP8 = {  # the published config's, at a block that divides the tiny matrices
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [16, 32],
    "modules_to_not_convert": _skips(SMALL["num_hidden_layers"], SMALL["full_attention_interval"]),
}


def _config() -> dict:
    cfg = transformers.AutoConfig.for_model("qwen3_next", **SMALL).to_dict()
    return cfg | {"architectures": ["Qwen3NextForCausalLM"], "dtype": "float32"}


def _ids(seed: int, seq: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


def _run(folder, ids, past=None):
    cfg = graphllm.load_config(folder)
    kv = [v.shape[2] for k, v in (past or {}).items() if k.endswith(".key")]
    wl = graphllm.Workload.with_dtype(
        batch=BATCH, seq_len=ids.shape[1], past_len=max(kv, default=0), dtype="fp32"
    )
    g = graphllm.build_graph(cfg, wl)
    return run_graph(g, load_weights(g, folder), ids, past)


@pytest.fixture(scope="module")
def fp8(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen3-next-fp8")
    _, meant = qc.write_quantized(folder, _config(), FP8)
    return folder, meant


def test_which_matrices_the_fp8_checkpoint_stores_quantized(fp8):
    _, meant = fp8
    p = "model.layers.0.linear_attn"
    assert {f"{p}.in_proj_qkvz.weight", f"{p}.out_proj.weight"} <= set(meant)
    for kept in ("in_proj_ba.weight", "conv1d.weight"):
        assert f"{p}.{kept}" not in meant
    assert "model.layers.1.self_attn.q_proj.weight" in meant
    assert "model.layers.0.mlp.experts.3.down_proj.weight" in meant
    assert "model.layers.0.mlp.shared_expert.up_proj.weight" in meant
    assert "model.layers.0.mlp.shared_expert_gate.weight" not in meant
    assert "lm_head.weight" not in meant
    # 2 linear layers x 2, 2 attention layers x 4, 4 layers x (4 experts + shared) x 3
    assert len(meant) == 4 + 8 + 4 * 5 * 3


def test_fp8_logits_equal_transformers_loading_the_same_folder(fp8):
    folder, _ = fp8
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    sd = model.state_dict()
    g = graphllm.build_graph(graphllm.load_config(folder), graphllm.Workload(batch=1, seq_len=1))
    loaded = load_weights(g, folder)
    for name in ("in_proj_qkvz", "out_proj", "in_proj_ba"):
        key = f"model.layers.0.linear_attn.{name}.weight"
        np.testing.assert_array_equal(loaded[key], sd[key].numpy(), err_msg=key)
    ids = _ids(1, SEQ)
    ours = _run(folder, ids)
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids), use_cache=True)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=1e-4, rtol=0)
    for step in range(STEPS):
        nxt = _ids(10 + step, 1)
        past = {k: v for k, v in ours.items() if k.startswith("present.")}
        ours = _run(folder, nxt, past=past)
        with torch.no_grad():
            theirs = model(torch.from_numpy(nxt), cache=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=1e-4, rtol=0, err_msg=f"step {step}"
        )
