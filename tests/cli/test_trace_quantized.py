"""`trace` of quantized checkpoints: the storage they declare, their real size, and the
--weight-dtype override that says so."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from graphllm import build_graph, load_config
from graphllm.cli import main
from tests.support import quantized_checkpoints as qc

# deepseek-ai/DeepSeek-V3's model.safetensors.index.json `total_size` (revision afb92e1f...),
# which ships the MTP module (model.layers.61); quoted in public code that records the
# checkpoint's bytes (find_string "688586727753"), and matching a published per-tensor listing
# of the same layout (DeepSeek-R1: 641.29 GiB, FP8 e4m3 weights with fp32 128x128
# weight_scale_inv, bf16 embeddings, head, routers, norms and eh_proj)
DEEPSEEK_V3_TOTAL = 688_586_727_753
GIB = 1 << 30
# public per-tensor reports of the published checkpoints (GitHub files found with find_string
# "/models/Qwen3-8B-FP8`" and "/models/Qwen3-32B-AWQ`"): their safetensors files' total size
# (in GiB, two decimals) and the elements of every stored tensor, scales included
PUBLISHED = {
    "qwen3-8b-fp8": 8.79 * GIB,  # 2 files; weight_scale_inv stored bf16
    "qwen3-32b-awq": 18.00 * GIB,  # 4 files
}


def trace(*args: str) -> dict:
    r = CliRunner().invoke(main, ["trace", "--json", "-t", "1", *args])
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_deepseek_v3_with_mtp_is_the_checkpoint_size():
    doc = trace("--model", "deepseek-v3", "--mtp")
    weights = doc["memory"]["weights"]
    assert weights == pytest.approx(DEEPSEEK_V3_TOTAL, rel=0.01)
    q = doc["model"]["quantization"]
    assert q["method"] == "fp8" and set(q["stored_bytes_by_dtype"]) == {"bf16", "fp8"}


def test_deepseek_v3_main_model_is_0_67_tb():
    main_model = trace("--model", "deepseek-v3")["memory"]["weights"]
    # the figure: the main model's FP8 storage is about 0.67 TB (1.34 TB at bf16)
    assert main_model == pytest.approx(0.67e12, rel=0.01)
    assert main_model < DEEPSEEK_V3_TOTAL


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_quantized_presets_are_their_checkpoints_size(preset):
    doc = trace("--model", preset)
    assert doc["memory"]["weights"] == pytest.approx(PUBLISHED[preset], rel=0.01)


@pytest.mark.parametrize(
    "preset, mtp, stored_values",
    [
        # the reports' element counts: parameters plus one scale per 128x128 block
        ("qwen3-8b-fp8", False, 8_191_159_296),
        ("deepseek-v3", True, 684_531_386_000),  # DeepSeek-R1's listing, the same layout
    ],
)
def test_params_and_scales_add_up_to_the_stored_values(preset, mtp, stored_values):
    cfg = load_config(preset)
    params, scales = qc.stored_values(build_graph(cfg, mtp=mtp))
    assert params + scales == stored_values


def test_weight_dtype_overrides_and_says_so():
    r = CliRunner().invoke(main, ["trace", "--model", "deepseek-v3", "-t", "1",
                                  "--weight-dtype", "bf16"])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert (
        "note: --weight-dtype bf16 overrides the checkpoint's quantization_config (fp8): "
        "every weight is modelled as bf16"
    ) in r.output
    assert "memory: weights 1.34 TB" in r.output
    assert "storage:" not in r.output


def test_trace_prints_the_storage_line():
    r = CliRunner().invoke(main, ["trace", "--model", "deepseek-v3", "-t", "1"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "weights as the checkpoint stores them (fp8)" in text
    assert "storage: fp8: 8-bit e4m3 weights, one fp32 scale per 128x128 block" in text
    assert "memory: weights 673.15 GB" in text
    assert "note:" not in text


def test_an_unmodelled_method_is_one_line_exit_2(tmp_path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 64,
        "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True},
    }))  # fmt: skip
    r = CliRunner().invoke(main, ["trace", "--config", str(cfg)])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "bitsandbytes" in r.output
    assert r.output.startswith("error: ")
