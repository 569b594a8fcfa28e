"""The bench's prediction of a quantized export prices the storage the export has: MatMulNBits
weights at their bits with their scales and zero points (and g_idx), the rest float at the
export's dtype, read from the export's `graphllm.stored` metadata (passes/stored.py counts)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphllm
from graphllm.build.builder import build_export_graph
from graphllm.exporters.onnx import export_onnx
from graphllm.exporters.onnx.export import read_metadata
from graphllm.exporters.onnx.nbits import Quantization
from graphllm.models.hardware import load_hardware
from graphllm.runtime.bench import export_storage, predict, predicted_stored_bytes
from tests.support import quantized_checkpoints as qc

pytest.importorskip("onnxruntime")

ITEM = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2, onnx.TensorProto.UINT8: 1,
        onnx.TensorProto.INT32: 4}  # fmt: skip
GPTQ_DESC_ACT = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True,
                 "sym": False, "checkpoint_format": "gptq"}  # fmt: skip


def _weight_bytes(path) -> int:
    """The file's weight initializers and the ort lowering's rotary tables (not the lowering's
    small constants: shapes, masks' values)."""
    model = onnx.load(str(path))
    inits = [t for t in model.graph.initializer if not t.name.startswith("const.")]
    return sum(int(np.prod(t.dims)) * ITEM[t.data_type] for t in inits)


def _predicted_weights(path) -> float:
    return predicted_stored_bytes(read_metadata(path))


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
@pytest.mark.parametrize(
    ("case", "q"),
    [
        ("llama", Quantization("int4")),
        ("llama", Quantization("int8", 64, 4, True)),
        ("qwen2", Quantization("int4", 128)),  # biases float; K=64 rows in one padded block
        ("qwen3_moe-norm_topk", Quantization("int4")),  # routed experts float, router quantized
    ],
)
def test_predicted_weight_bytes_are_the_files(tiny_model, tmp_path, case, q, dtype):
    tm = tiny_model(case)
    path = tmp_path / "q.onnx"
    export_onnx(build_export_graph(tm.cfg, dtype), path, weights=tm.folder, quantize=q)
    meta = read_metadata(path)
    assert meta.stored and set(meta.stored.values()) == {"none" if q.symmetric else "uint8"}
    want = _weight_bytes(path)
    assert abs(_predicted_weights(path) - want) <= 0.01 * want


def test_a_gptq_desc_act_exports_float_zero_points_and_g_idx_are_priced(tmp_path):
    folder = tmp_path / "q"
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 128,
           "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "tie_word_embeddings": False, "dtype": "float32"}  # fmt: skip
    qc.write_quantized(folder, cfg, GPTQ_DESC_ACT)
    path = tmp_path / "q.onnx"
    g = build_export_graph(graphllm.load_config(folder))
    export_onnx(g, path, weights=folder, quantize=Quantization("int4", 32))
    kinds = read_metadata(path).stored
    assert kinds["model.layers.0.mlp.down_proj.weight"] == "float+g_idx"
    assert kinds["lm_head.weight"] == "uint8"  # float in the checkpoint, quantized here
    want = _weight_bytes(path)
    assert abs(_predicted_weights(path) - want) <= 0.01 * want


def test_the_int4_prediction_reads_fewer_bytes_than_the_float_one(tiny_model, tmp_path):
    tm = tiny_model("llama")
    path = tmp_path / "q.onnx"
    export_onnx(build_export_graph(tm.cfg), path, weights=tm.folder, quantize=Quantization())
    meta = read_metadata(path)
    hw = load_hardware("h100").ideal()  # bytes, not the tiny GEMMs' one-tile kernels
    args = (meta.config, meta.lowering, "fp32", "all", 1, 16, 4, hw, meta.build)
    _, dec_q = predict(*args, export_storage(meta))
    _, dec_f = predict(*args)
    assert dec_q < dec_f
