"""A multimodal checkpoint (Gemma 3's Gemma3ForConditionalGeneration) read as its text decoder:
the config loads through its text_config, the weights from where that model keeps them, and the
logits on text equal transformers' own model's (fp32, 1e-4), through the interpreter and ONNX."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import graphllm  # noqa: E402
from graphllm.build.builder import build_export_graph  # noqa: E402
from graphllm.build.weights import load_weights  # noqa: E402
from graphllm.runtime.interpret import run_graph  # noqa: E402
from tests.support.tiny_models import SMALL, presents  # noqa: E402

BATCH, SEQ = 2, 8
TEXT = {
    **{k: v for k, v in SMALL.items() if not k.endswith("token_id")},
    "model_type": "gemma3_text",
    "num_hidden_layers": 3,
    "head_dim": 16,
    "sliding_window": 4,
    "sliding_window_pattern": 3,
    "rope_local_base_freq": 100.0,
}
VISION = {
    "model_type": "siglip_vision_model",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.AutoConfig.for_model(
        "gemma3", text_config=TEXT, vision_config=VISION, mm_tokens_per_image=4,
        image_token_index=127, boi_token_index=125, eoi_token_index=126,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    folder = tmp_path_factory.mktemp("gemma3-mm")
    model.eval().save_pretrained(folder)
    return model, folder


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, 120, (BATCH, seq))


def test_the_config_is_its_text_decoder(checkpoint):
    model, folder = checkpoint
    assert type(model).__name__ == "Gemma3ForConditionalGeneration"
    cfg = graphllm.load_config(folder)
    assert (cfg.model_type, cfg.text_decoder_of, cfg.num_hidden_layers) == (
        "gemma3_text",
        "gemma3",
        3,
    )
    assert cfg.sliding_rope is not None and cfg.sliding_rope.theta == 100.0


def test_interpreter_logits_and_a_cached_step_equal_transformers(checkpoint):
    model, folder = checkpoint
    cfg = graphllm.load_config(folder)
    ids, nxt = _ids(1), _ids(2, seq=1)
    g = graphllm.build_graph(
        cfg, graphllm.Workload.with_dtype(batch=BATCH, seq_len=SEQ, dtype="fp32")
    )
    weights = load_weights(g, folder)  # from model.language_model.*, not model.*
    ours = run_graph(g, weights, ids)
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids), use_cache=True)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=1e-4, rtol=0)
    wl = graphllm.Workload.with_dtype(batch=BATCH, seq_len=1, past_len=SEQ, dtype="fp32")
    step = run_graph(graphllm.build_graph(cfg, wl), weights, nxt, presents(ours))
    with torch.no_grad():
        theirs = model(torch.from_numpy(nxt), cache=theirs.cache, use_cache=True)
    np.testing.assert_allclose(step["logits"], theirs.logits.numpy(), atol=1e-4, rtol=0)


def test_the_onnx_export_reads_the_same_tensors(checkpoint, tmp_path):
    pytest.importorskip("onnxruntime")
    from graphllm.exporters.onnx import export_onnx
    from graphllm.runtime.session import OnnxModel

    model, folder = checkpoint
    cfg = graphllm.load_config(folder)
    export_onnx(build_export_graph(cfg), tmp_path / "m.onnx", weights=folder)
    ids = _ids(3)
    ours = OnnxModel(tmp_path / "m.onnx", device="cpu").forward(ids)
    with torch.no_grad():
        theirs = model(torch.from_numpy(ids)).logits.numpy()
    np.testing.assert_allclose(ours["logits"], theirs, atol=1e-4, rtol=0)


def test_the_vision_tower_is_known_and_left_unread(checkpoint):
    from graphllm.build.weights import unmodelled_tensors

    _, folder = checkpoint
    # transformers 5.24 saves Gemma 3 in transformers 4's layout: vision_tower.*, ...
    unused = unmodelled_tensors(folder, "gemma3")
    assert any(n.startswith("vision_tower.") for n in unused)
    assert any(n.startswith("multi_modal_projector.") for n in unused)
    assert not any("language_model." in n for n in unused)
