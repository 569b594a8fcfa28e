"""Damaged quantized checkpoints through `graphllm export --weights`: each is refused in one line
naming the tensor, before anything is written. Each case writes a valid tiny quantized
checkpoint (tests/support/quantized_checkpoints.py) and damages its tensors or its config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.support import quantized_checkpoints as qc
from tests.support.checkpoints import tiny_config
from tests.support.hostile import Case, cases_params, check_case, run_cli

EXPORT = ["export", "--weights", "ck", "--device", "cpu", "-o", "out.onnx"]
Q = "model.layers.0.self_attn.q_proj"
FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
       "weight_block_size": [16, 32]}  # fmt: skip
UE8M0 = FP8 | {"scale_fmt": "ue8m0"}
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True, "sym": False,
        "checkpoint_format": "gptq"}  # fmt: skip
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}
MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
         "model.layers.*.mlp.gate", "model.embed_tokens", "lm_head"]}  # fmt: skip
MOE = {  # a tiny Qwen3-MoE: two layers of four experts
    "model_type": "qwen3_moe", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
    "num_experts_per_tok": 2, "norm_topk_prob": True, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
    "rope_theta": 10000.0, "tie_word_embeddings": False,
}  # fmt: skip
EXPERT = "model.layers.1.mlp.experts.2.up_proj.weight"
Edit = Callable[[dict, dict], None]


def quantized(qconfig: dict, edit: Edit | None = None, config: dict | None = None):
    def make(root: Path) -> None:
        qc.write_quantized(root / "ck", config or tiny_config(), qconfig, edit)

    return make


def _drop(name: str) -> Edit:
    def edit(t: dict, d: dict) -> None:
        del t[name]

    return edit


def _set(name: str, value: Callable[[np.ndarray], np.ndarray]) -> Edit:
    def edit(t: dict, d: dict) -> None:
        t[name] = value(t[name])

    return edit


def _as_e8m0(name: str) -> Edit:
    def edit(t: dict, d: dict) -> None:
        t[name] = (np.ceil(np.log2(t[name])) + 127).astype(np.uint8)
        d[name] = "F8_E8M0"

    return edit


def _g_idx_out_of_range(t: dict, d: dict) -> None:
    t[f"{Q}.g_idx"] = t[f"{Q}.g_idx"].copy()
    t[f"{Q}.g_idx"][5] = 2  # two groups of 32 in a 64-wide input


def _undeclared_config(root: Path) -> None:
    """A checkpoint of FP8 tensors whose config.json has lost its quantization_config."""
    quantized(FP8)(root)
    cfg = json.loads((root / "ck" / "config.json").read_text())
    del cfg["quantization_config"]
    (root / "ck" / "config.json").write_text(json.dumps(cfg))


def _config_says(qconfig: dict, real: dict) -> Callable[[Path], None]:
    """A checkpoint quantized as `real` whose config.json declares `qconfig`."""

    def make(root: Path) -> None:
        quantized(real)(root)
        cfg = json.loads((root / "ck" / "config.json").read_text())
        (root / "ck" / "config.json").write_text(json.dumps(cfg | {"quantization_config": qconfig}))

    return make


CT_FP8 = {  # compressed-tensors FP8 per channel: parsed for its bytes, not read
    "quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
        "type": "float", "num_bits": 8, "symmetric": True, "strategy": "channel",
        "dynamic": False}}},
}  # fmt: skip


def _compressed_tensors(root: Path) -> None:
    qc.write_dense(root / "ck", tiny_config() | {"quantization_config": CT_FP8},
                   qc.checkpoint_weights(_graph()))  # fmt: skip


def _graph():
    import graphllm
    from graphllm.build.builder import build_export_graph
    from tests.support.checkpoints import TINY

    return build_export_graph(graphllm.load_config(TINY))


CASES = [
    Case("fp8-scale-missing", EXPORT, quantized(FP8, _drop(f"{Q}.weight_scale_inv")),
         expect=f"needs tensor '{Q}.weight_scale_inv', which the checkpoint lacks"),
    Case("fp8-scale-truncated", EXPORT,
         quantized(FP8, _set(f"{Q}.weight_scale_inv", lambda a: a[:3])),
         expect="shape [3, 2], but storing"),
    Case("fp8-values-f16", EXPORT,
         quantized(FP8, _set(f"{Q}.weight", lambda a: a.astype(np.float16))),
         expect="dtype F16, but storing"),
    Case("fp8-scale-int", EXPORT,
         quantized(FP8, _set(f"{Q}.weight_scale_inv", lambda a: a.astype(np.int32))),
         expect="dtype I32, but storing"),
    Case("fp8-e8m0-scale-not-declared", EXPORT, quantized(FP8, _as_e8m0(f"{Q}.weight_scale_inv")),
         expect="dtype F8_E8M0"),
    Case("fp8-values-in-bf16-checkpoint-without-quantization", EXPORT, _undeclared_config,
         expect="F8_E4M3, a quantized form"),
    Case("fp8-block-not-the-stored-one", EXPORT,
         _config_says(FP8 | {"weight_block_size": [32, 32]}, FP8), expect="shape [4, 2]"),
    Case("gptq-qzeros-missing", EXPORT, quantized(GPTQ, _drop(f"{Q}.qzeros")),
         expect=f"'{Q}.qzeros', which the checkpoint lacks"),
    Case("gptq-g-idx-missing", EXPORT, quantized(GPTQ, _drop(f"{Q}.g_idx")),
         expect="with desc_act needs tensor"),
    Case("gptq-g-idx-out-of-range", EXPORT, quantized(GPTQ, _g_idx_out_of_range),
         expect="input row 5 is in group 2"),
    Case("gptq-scales-f32", EXPORT,
         quantized(GPTQ, _set(f"{Q}.scales", lambda a: a.astype(np.float32))),
         expect="needs F16 or BF16"),
    Case("gptq-bits-not-declared", EXPORT, _config_says(GPTQ | {"bits": 8}, GPTQ),
         expect="as 8-bit GPTQ"),
    Case("awq-qweight-int64", EXPORT,
         quantized(AWQ, _set(f"{Q}.qweight", lambda a: a.astype(np.int64))),
         expect="dtype I64"),
    Case("awq-qzeros-missing", EXPORT, quantized(AWQ, _drop(f"{Q}.qzeros")),
         expect="which the checkpoint lacks"),
    Case("awq-group-not-declared", EXPORT, _config_says(AWQ | {"group_size": 16}, AWQ),
         expect="in groups of 16"),
    Case("mxfp4-scales-missing", EXPORT, quantized(MXFP4, _drop(EXPERT + "_scales"), MOE),
         expect=f"'{EXPERT}_scales', which the checkpoint lacks"),
    Case("mxfp4-blocks-wrong-shape", EXPORT,
         quantized(MXFP4, _set(EXPERT + "_blocks", lambda a: a.reshape(32, 4, 8)), MOE),
         expect="shape [32, 4, 8]"),
    Case("mxfp4-blocks-as-e4m3", EXPORT, quantized(MXFP4, _set(
         EXPERT + "_blocks", lambda a: a.view(ml_dtypes.float8_e4m3fn)), MOE),
         expect="dtype F8_E4M3"),
    Case("compressed-tensors-not-read", EXPORT, _compressed_tensors,
         expect="does not read compressed-tensors checkpoints"),
]  # fmt: skip


@pytest.mark.parametrize("case", cases_params(CASES))
def test_refused(case, tmp_path):
    check_case(case, tmp_path)


@pytest.mark.parametrize("qconfig", [FP8, GPTQ, AWQ], ids=["fp8", "gptq", "awq"])
def test_the_undamaged_quantized_checkpoints_export(tmp_path, qconfig):
    """The base checkpoints are valid: each case is refused for its damage alone."""
    quantized(qconfig)(tmp_path)
    r = run_cli(EXPORT, tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out.onnx").is_file()


def test_the_undamaged_mxfp4_checkpoint_exports(tmp_path):
    quantized(MXFP4, config=MOE)(tmp_path)
    r = run_cli(EXPORT, tmp_path)
    assert r.returncode == 0, r.stderr
