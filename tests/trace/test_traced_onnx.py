"""A traced model exported to ONNX (the decomposed lowering of its generic rows, sizes symbolic)
runs on onnxruntime with transformers' logits, from an empty cache and after a cached past."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
from graphllm.cli.main import main
from tests.support.traced import FAMILIES, onnx_against_transformers


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
        "complex_rope",
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
