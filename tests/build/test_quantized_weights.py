"""Quantized checkpoints load dequantized, matrix by matrix (graphllm.build.quantized).

Each test writes a tiny checkpoint of an existing family quantized by the method's published
rule (tests/support/quantized_checkpoints.py) with a published-shaped quantization_config, loads
it through `graphllm.load_config` + `load_weights`, and checks:
- FP8 (block-scaled, e4m3): the logits of graphllm's interpreter equal transformers' own model
  loaded from the same folder (transformers dequantizes FP8 on CPU once accelerate is there),
  prefill and one cached decode step;
- MXFP4 (experts only, on a Qwen3-MoE; transformers reads MXFP4 only into gpt-oss's experts):
  each expert's matrix equals transformers' convert_moe_packed_tensors of the same bytes, and
  the logits equal a run on the dequantized weights saved as a dense checkpoint;
- GPTQ (v1 and v2, desc_act or not, 4 and 8 bits) and AWQ (GEMM): transformers reads them only
  through gptqmodel, which does not install beside torch 2.13 / transformers 5.24, so each
  matrix equals the element-by-element reference reader exactly, and the logits equal a run on
  those reference weights saved dense.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

import graphllm
from graphllm.build.builder import build_export_graph
from graphllm.build.weights import SafetensorsFolder, checkpoint_tensors, load_weights
from graphllm.errors import WeightsError
from graphllm.exporters.onnx import export_onnx
from graphllm.runtime.interpret import run_graph
from graphllm.runtime.session import OnnxModel
from tests.support import quantized_checkpoints as qc

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

BATCH, SEQ = 2, 8
SMALL = qc.SMALL
FP8 = {  # Qwen3-8B-FP8's, at a block that divides the tiny matrices (transformers requires it)
    "quant_method": "fp8",
    "fmt": "e4m3",
    "activation_scheme": "dynamic",
    "weight_block_size": [16, 32],
}
MXFP4 = qc.MXFP4_CONFIG


def _config(model_type: str, **extra: object) -> dict:
    arch = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}.get(
        model_type, "LlamaForCausalLM"
    )
    cfg = transformers.AutoConfig.for_model(model_type, **SMALL, **extra).to_dict()
    return cfg | {"architectures": [arch], "dtype": "float32"}


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SMALL["vocab_size"], (BATCH, seq))


def _run(folder, ids, past=None):
    cfg = graphllm.load_config(folder)
    p = 0 if past is None else next(iter(past.values())).shape[2]
    wl = graphllm.Workload.with_dtype(batch=BATCH, seq_len=ids.shape[1], past_len=p, dtype="fp32")
    g = graphllm.build_graph(cfg, wl)
    return run_graph(g, load_weights(g, folder), ids, past)


def _presents(out: dict) -> dict:
    return {k: v for k, v in out.items() if k.startswith("present.")}


def _loaded(folder) -> dict[str, np.ndarray]:
    """Every matrix as load_weights reads it, by checkpoint name (experts split)."""
    g = graphllm.build_graph(graphllm.load_config(folder), graphllm.Workload(batch=1, seq_len=1))
    out = {}
    for name, arr in load_weights(g, folder).items():
        if "*" in name:
            out |= {name.replace("*", str(e)): arr[e] for e in range(arr.shape[0])}
        else:
            out[name] = arr
    return out


def test_fp8_logits_equal_transformers_loading_the_same_folder(tmp_path):
    folder = tmp_path / "fp8"
    _, meant = qc.write_quantized(folder, _config("qwen3"), FP8)
    assert len(meant) == 14  # q k v o gate up down, two layers; the head stays fp32
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    sd = model.state_dict()
    for name, w in _loaded(folder).items():  # the same tensors transformers dequantized
        np.testing.assert_array_equal(w, sd[name].numpy(), err_msg=name)
    ids, nxt = _ids(1), _ids(2, seq=1)
    ours = _run(folder, ids)
    step = _run(folder, nxt, past=_presents(ours))
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids), use_cache=True)
        theirs_step = model(torch.from_numpy(nxt), cache=theirs.cache)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=1e-4, rtol=0)
    np.testing.assert_allclose(step["logits"], theirs_step.logits.numpy(), atol=1e-4, rtol=0)


def test_mxfp4_experts_match_transformers_unpacking_and_the_dense_run(tmp_path):
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    cfg = _config("qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    folder = tmp_path / "mxfp4"
    weights, meant = qc.write_quantized(folder, cfg, MXFP4)
    assert meant and all(".experts." in n for n in meant)  # experts only
    loaded = _loaded(folder)
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    raw = _stored(folder, [name + "_blocks", name + "_scales"])
    theirs = mx.convert_moe_packed_tensors(
        torch.from_numpy(raw[0][None]), torch.from_numpy(raw[1][None]), dtype=torch.float32
    )[0].T.numpy()  # gpt-oss's experts are [in, out]
    np.testing.assert_array_equal(loaded[name], theirs)
    for n, w in meant.items():
        np.testing.assert_array_equal(loaded[n], w, err_msg=n)
    dense = qc.write_dense(tmp_path / "dense", cfg, weights | meant)
    ids = _ids(3)
    np.testing.assert_array_equal(_run(folder, ids)["logits"], _run(dense, ids)["logits"])


def _stored(folder, names: list[str]) -> list[np.ndarray]:
    ck = SafetensorsFolder(folder)
    return [np.array(ck.stored(n)) for n in names]


INT_CASES = {
    "gptq-v1-desc-act-4bit": {"quant_method": "gptq", "bits": 4, "group_size": 32,
                              "desc_act": True, "sym": False, "checkpoint_format": "gptq"},
    "gptq-v2-8bit": {"quant_method": "gptq", "bits": 8, "group_size": 16, "desc_act": False,
                     "sym": True, "checkpoint_format": "gptq_v2"},
    "gptq-v1-group-all": {"quant_method": "gptq", "bits": 4, "group_size": -1,
                          "desc_act": False, "sym": False},
    "awq-gemm": {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True,
                 "version": "gemm"},
}  # fmt: skip


@pytest.mark.parametrize("case", INT_CASES)
def test_int_checkpoints_equal_the_reference_reader_and_the_dense_run(tmp_path, case):
    cfg = _config("llama")
    folder = tmp_path / "q"
    weights, meant = qc.write_quantized(folder, cfg, INT_CASES[case])
    assert len(meant) == 14
    loaded = _loaded(folder)
    for n, w in meant.items():
        np.testing.assert_array_equal(loaded[n], w, err_msg=n)
        assert np.abs(w - weights[n]).max() < np.abs(weights[n]).max() / 4  # near the original
    dense = qc.write_dense(tmp_path / "dense", cfg, weights | meant)
    ids = _ids(4)
    np.testing.assert_array_equal(_run(folder, ids)["logits"], _run(dense, ids)["logits"])


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_the_export_reads_the_dequantized_weights(tmp_path, dtype):
    folder = tmp_path / "fp8"
    _, meant = qc.write_quantized(folder, _config("llama"), FP8)
    g = build_export_graph(graphllm.load_config(folder), dtype=dtype)
    got = {n.name: arr for n, arr in checkpoint_tensors(g, folder, dtype)}
    name = "model.layers.0.mlp.down_proj.weight"
    assert got[name].dtype == np.dtype(dtype.replace("fp", "float"))
    np.testing.assert_array_equal(got[name], meant[name].astype(got[name].dtype))


def test_an_fp8_tensor_in_a_checkpoint_that_declares_no_quantization_is_refused(tmp_path):
    folder = tmp_path / "fp8"
    qc.write_quantized(folder, _config("llama"), FP8)
    cfg = json.loads((folder / "config.json").read_text())
    del cfg["quantization_config"]
    (folder / "config.json").write_text(json.dumps(cfg))
    g = build_export_graph(graphllm.load_config(folder))
    with pytest.raises(WeightsError, match="F8_E4M3, a quantized form"):
        checkpoint_tensors(g, folder)


@pytest.mark.parametrize("qconfig", [FP8, INT_CASES["gptq-v1-desc-act-4bit"]], ids=["fp8", "gptq"])
def test_the_fp32_onnx_export_of_a_quantized_checkpoint_runs_like_the_interpreter(
    tmp_path, qconfig
):
    pytest.importorskip("onnxruntime")
    folder = tmp_path / "q"
    qc.write_quantized(folder, _config("qwen3"), qconfig)
    r = export_onnx(build_export_graph(graphllm.load_config(folder)), tmp_path / "m.onnx",
                    weights=folder)  # fmt: skip
    ids = _ids(5)
    ours = OnnxModel(r.path, "cpu").forward(ids)["logits"]
    np.testing.assert_allclose(ours, _run(folder, ids)["logits"], atol=1e-4, rtol=0)


def test_bf16_fp8_scales_as_qwen3_fp8_stores_them_load(tmp_path):
    def to_bf16(tensors: dict, dtypes: dict) -> None:
        for name in [n for n in tensors if n.endswith("_scale_inv")]:
            tensors[name] = tensors[name].astype(ml_dtypes.bfloat16)

    folder = tmp_path / "fp8"
    qc.write_quantized(folder, _config("qwen3"), FP8, to_bf16)
    name = "model.layers.1.self_attn.o_proj.weight"
    values, scale = _stored(folder, [name, name + "_scale_inv"])
    assert scale.dtype == ml_dtypes.bfloat16
    want = values.astype(np.float32) * np.repeat(np.repeat(scale.astype(np.float32), 16, 0), 32, 1)
    np.testing.assert_array_equal(_loaded(folder)[name], want)
