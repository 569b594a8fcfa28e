"""onnxruntime helpers: provider choice, the forward step's defaults, greedy generation with the KV
cache against transformers' generate, lazy import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from graphllm.build.builder import build_export_graph

ort = pytest.importorskip("onnxruntime")

import graphllm  # noqa: E402
from graphllm.errors import GraphllmError  # noqa: E402
from graphllm.exporters.onnx import export_onnx  # noqa: E402
from graphllm.runtime.session import OnnxModel, positions, providers, session  # noqa: E402


def test_providers():
    assert providers("cpu") == ["CPUExecutionProvider"]
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    assert providers("auto")[0] == ("CUDAExecutionProvider" if has_cuda else "CPUExecutionProvider")
    if not has_cuda:
        with pytest.raises(GraphllmError, match="onnxruntime-gpu"):
            providers("cuda")
    with pytest.raises(GraphllmError, match="unknown device"):
        providers("tpu")
    with pytest.raises(GraphllmError, match="no such ONNX model"):
        session("/nonexistent/model.onnx")


def test_positions_count_real_tokens():
    mask = np.array([[1, 1, 1, 1], [0, 0, 1, 1]])
    assert positions(mask, 4).tolist() == [[0, 1, 2, 3], [1, 1, 0, 1]]
    assert positions(np.concatenate([mask, [[1], [1]]], axis=1), 1).tolist() == [[4], [2]]


def test_forward_defaults_and_empty_past(tiny_onnx):
    m = OnnxModel(tiny_onnx, device="cpu", threads=1)
    past = m.empty_past(3)
    assert len(past) == 4 and past["past_key_values.1.value"].shape == (3, 2, 0, 16)
    ids = np.arange(10).reshape(2, 5)
    out = m.forward(ids)
    assert out["logits"].shape == (2, 5, 256) and out["present.0.key"].shape == (2, 2, 5, 16)
    # explicit all-ones mask and positions are the defaults; a past under either name works
    same = m.forward(ids, np.ones((2, 5), np.int64), np.tile(np.arange(5), (2, 1)))
    np.testing.assert_array_equal(same["logits"], out["logits"])
    presents = {k: v for k, v in out.items() if k.startswith("present.")}
    step = m.forward(ids[:, :1], past=presents)
    renamed = {k.replace("present.", "past_key_values."): v for k, v in presents.items()}
    np.testing.assert_array_equal(m.forward(ids[:, :1], past=renamed)["logits"], step["logits"])
    assert step["present.0.key"].shape[2] == 6


def test_ort_refuses_a_batch_of_chunks_after_a_past_in_one_line(tiny_onnx):
    m = OnnxModel(tiny_onnx, device="cpu")  # the default CPU lowering: ort
    assert m.lowering == "ort"
    ids = np.random.default_rng(1).integers(3, 256, (2, 5))
    past = {k: v for k, v in m.forward(ids).items() if k.startswith("present.")}
    with pytest.raises(GraphllmError, match=r"at batch 1 only .* with --ops standard"):
        m.forward(ids[:, :2], past=past)
    assert m.forward(ids[:1, :2], past={k: v[:1] for k, v in past.items()})["logits"].shape[1] == 2


def test_generate_matches_row_by_row(tiny_onnx):
    m = OnnxModel(tiny_onnx, device="cpu")
    rng = np.random.default_rng(0)
    a, b = rng.integers(3, 256, 7), rng.integers(3, 256, 4)
    batch = np.stack([a, np.concatenate([[0, 0, 0], b])])
    mask = (np.arange(7)[None] >= np.array([[0], [3]])).astype(np.int64)
    both = m.generate(batch, 12, mask)
    assert both.shape == (2, 12)
    np.testing.assert_array_equal(both[0], m.generate(a, 12)[0])
    np.testing.assert_array_equal(both[1], m.generate(b, 12)[0])
    assert m.generate(a, 0).shape == (1, 0)


def test_generate_matches_transformers(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(20.0)  # confident logits: greedy choices far from ties
    model.save_pretrained(tmp_path / "ckpt")
    path = tmp_path / "m.onnx"
    export_onnx(
        build_export_graph(graphllm.load_config(tmp_path / "ckpt")), path, weights=tmp_path / "ckpt"
    )
    ids = np.array([[5, 6, 7, 8, 9, 10], [0, 0, 11, 12, 13, 14]])
    mask = (ids != 0).astype(np.int64)
    with torch.no_grad():
        hf = model.generate(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            max_new_tokens=16,
            min_new_tokens=16,
            do_sample=False,
            pad_token_id=0,
        )
    ours = OnnxModel(path, device="cpu").generate(ids, 16, mask)
    np.testing.assert_array_equal(ours, hf[:, ids.shape[1] :].numpy())


def test_importing_runtime_does_not_import_onnxruntime():
    code = "import sys, graphllm.runtime; assert 'onnxruntime' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_failing_run_is_one_line(tiny_onnx):
    m = OnnxModel(tiny_onnx, device="cpu")
    with pytest.raises(GraphllmError, match=r"onnxruntime failed: .*total_sequence_length") as e:
        m.forward(np.array([[1, 2, 3]]), attention_mask=np.ones((1, 2), np.int64))  # too short
    assert "\n" not in str(e.value)
