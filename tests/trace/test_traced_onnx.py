"""A traced model exported to ONNX (the decomposed lowering of its generic rows, sizes symbolic)
runs on onnxruntime with transformers' logits, from an empty cache and after a cached past."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
from graphllm.cli.main import main
from graphllm.errors import ConfigError
from graphllm.exporters.onnx import export_onnx
from graphllm.models.workload import Workload
from graphllm.trace import traced_graph
from tests.support.benchmark_scripts import load_script
from tests.support.traced import FAMILIES, TINY, onnx_against_transformers


@pytest.mark.parametrize(
    "kind",
    [
        "dense",
        "moe",  # its checkpoint stores one tensor an expert and a projection: put together
        "qk_norm",
        "sliding",
        "layernorm_bias",
        "linear_attention",
        "mla",
        "mamba2",
        "short_conv",
        "complex_rope",
        "own_attention_filled",
        "dynamic_mask",
    ],
)
def test_traced_export_equals_transformers(kind, tmp_path):
    decode, prefill = onnx_against_transformers(FAMILIES[kind], tmp_path)
    assert decode < 2e-5 and prefill < 2e-5, (decode, prefill)


def test_export_command_traces_and_refuses_what_it_does_not_lower(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(json.dumps(FAMILIES["layernorm_bias"]))
    out = tmp_path / "m.onnx"
    r = CliRunner().invoke(main, ["export", "--config", str(config), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "traced from transformers' code" in r.output and out.exists()
    r = CliRunner().invoke(
        main, ["export", "--config", str(config), "--dtype", "fp16", "-o", str(tmp_path / "h.onnx")]
    )
    assert r.exit_code == 2 and "decomposed lowering" in r.output
    assert not (tmp_path / "h.onnx").exists()


@pytest.mark.parametrize(
    "raw",
    [
        # Mixtral's checkpoint keeps block_sparse_moe.experts.{e}.w1/w3/w2: renamed, and one
        # tensor an expert and a projection where the model holds one gate_up_proj
        dict(FAMILIES["moe"], model_type="mixtral", num_local_experts=4),
        dict(FAMILIES["moe"], model_type="olmoe"),
        # DeepSeek-V3's MoE layer beside its latent attention, with a shared expert
        dict(
            FAMILIES["mla"], first_k_dense_replace=1, n_shared_experts=1, moe_intermediate_size=16
        ),
    ],
    ids=lambda raw: raw["model_type"],
)
def test_experts_renamed_and_split_in_the_checkpoint(tmp_path, raw):
    decode, prefill = onnx_against_transformers(raw, tmp_path)
    assert decode < 2e-5 and prefill < 2e-5, (decode, prefill)


def test_a_repeat_by_the_batch_follows_it(tmp_path):
    # BLOOM repeats its ALiBi slopes B times: the count is the batch, not the traced one's
    raw = {"model_type": "bloom", "vocab_size": 96, "hidden_size": 32, "n_layer": 2, "n_head": 4}
    decode, prefill = onnx_against_transformers(raw, tmp_path)
    assert decode < 2e-5 and prefill < 2e-5, (decode, prefill)


LINEAR = dict(
    layer_types=["linear_attention", "full_attention"],
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=8,
    linear_value_head_dim=8,
)
MOE = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


@pytest.mark.parametrize(
    "raw",
    [
        # q, k and v in one query_key_value (GQA: split by each one's size), the MoE layer's
        # experts one tensor each
        dict(TINY, model_type="sarvam_moe", first_k_dense_replace=1, **MOE),
        dict(TINY, model_type="param2moe", first_k_dense_replace=1, **MOE),
        # the Gated DeltaNet's conv: one tensor in the model, a q, a k and a v conv on disk
        dict(TINY, model_type="olmo_hybrid", **LINEAR),
        # the Gated DeltaNet's four input projections in one in_proj
        dict(
            TINY,
            model_type="lara_mini",
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=16,
            shared_expert_intermediate_size=16,
            **LINEAR,
        ),
        # HRM: gate and up in one gate_up_proj, a gate, q, k and v in one gqkv_proj (Chunk:
        # equal parts)
        dict({k: v for k, v in TINY.items() if k != "num_key_value_heads"}, model_type="hrm_text"),
    ],
    ids=lambda raw: raw["model_type"],
)
def test_checkpoints_that_join_what_the_model_splits(tmp_path, raw):
    decode, prefill = onnx_against_transformers(raw, tmp_path)
    assert decode < 2e-5 and prefill < 2e-5, (decode, prefill)


def test_bamba_has_the_sweeps_onnx_parity():
    """transformers' Bamba numbers a cached step's positions from 0 when it is given none: the
    sweep gives it the positions the export is fed."""
    import torch

    tc = load_script("traced_coverage")
    raw = tc.tiny_config("bamba")
    ref = tc._reference(raw)
    rng = np.random.default_rng(0)
    ids, past = (
        rng.integers(0, raw["vocab_size"], (2, 3)),
        rng.integers(0, raw["vocab_size"], (2, 4)),
    )
    assert tc._onnx(raw, ref, ids, past) is True
    with torch.no_grad():  # the reason: no positions given, transformers' step is another
        cache = ref(torch.tensor(past), use_cache=True).past_key_values
        alone = ref(torch.tensor(ids), cache=cache).logits
        whole = ref(torch.tensor(np.concatenate([past, ids], 1))).logits[:, 4:]
    assert float((alone - whole).abs().max()) > 1e-4


GPT1 = dict(model_type="openai-gpt", vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=512)


def test_a_model_without_a_cache_exports_its_prefill(tmp_path):
    """GPT-1 keeps no cache: `export` writes its prefill alone (no past in or present out),
    which runs with transformers' logits; a model with a cache is not exported prefill-only."""
    import onnxruntime as ort
    import torch
    import transformers

    torch.manual_seed(0)
    cfg = transformers.CONFIG_MAPPING["openai-gpt"](
        **{k: v for k, v in GPT1.items() if k != "model_type"}
    )
    ref = transformers.AutoModelForCausalLM.from_config(cfg).eval()
    ref.save_pretrained(tmp_path / "ckpt")
    out = tmp_path / "m.onnx"
    r = CliRunner().invoke(main, ["export", "--weights", str(tmp_path / "ckpt"), "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert "prefill only (the model keeps no cache)" in r.output
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    assert [o.name for o in session.get_outputs()] == ["logits"]
    names = {i.name for i in session.get_inputs()}
    assert names <= {"input_ids", "attention_mask", "position_ids"}
    ids = np.random.default_rng(0).integers(0, GPT1["vocab_size"], (2, 5))
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones(ids.shape, np.int64),
        "position_ids": np.broadcast_to(np.arange(5), ids.shape).copy(),
    }
    got = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    with torch.no_grad():
        want = ref(torch.tensor(ids)).logits.numpy()
    assert np.abs(got - want).max() < 2e-5
    llama = traced_graph(FAMILIES["dense"], Workload(batch=1, seq_len=1, past_len=0, dtype="fp32"))
    with pytest.raises(ConfigError, match=r"^the graph has no past K/V inputs"):
        export_onnx(llama, str(tmp_path / "llama.onnx"), no_weights=True, ops="decomposed")
