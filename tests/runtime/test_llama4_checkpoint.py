"""Llama 4 from real checkpoints: a tiny Llama4ForCausalLM (llama4_text) and a tiny
Llama4ForConditionalGeneration (llama4, with a vision tower), random weights, written by
`save_pretrained` as safetensors, then loaded from their folders as a user would.

The text config is the `llama4_text-moe` case (routing decides: top 1 of 4 experts, interleaved
with dense layers; Llama 4's L2 QK-norm, temperature tuning, chunked attention and NoPE layers
all on). Logits equal transformers' through the interpreter (prefill, 16 cached steps) and the
decomposed ONNX export (the same, and a left-padded batch), fp32 within 1e-4.

transformers 5.24's Llama4ForConditionalGeneration.forward fails on text alone (it reads
`image_outputs` off its language model's output), so the wrapper's reference is what that
forward computes for text: its `language_model` on the same ids (no pixel_values: the embeddings
are the language model's own).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from click.testing import CliRunner  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

import graphllm  # noqa: E402
from graphllm.build.weights import load_weights, unmodelled_tensors  # noqa: E402
from graphllm.cli import main  # noqa: E402
from graphllm.errors import WeightsError  # noqa: E402
from graphllm.runtime.interpret import run_graph  # noqa: E402
from graphllm.runtime.session import OnnxModel, positions  # noqa: E402
from tests.support.tiny_models import CASES, SMALL, presents  # noqa: E402

ATOL, BATCH, SEQ, STEPS, PAD = 1e-4, 2, 8, 16, 3
TEXT = {**SMALL, **CASES["llama4_text-moe"][1]}
VISION = {
    "model_type": "llama4_vision_model",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
    "vision_output_dim": 32,
    "projector_input_dim": 32,
    "projector_output_dim": 32,
}


class Saved:
    """A tiny Llama 4 model of one kind, its save_pretrained folder, and its text decoder."""

    def __init__(self, kind: str, folder) -> None:
        torch.manual_seed(0)
        if kind == "llama4":
            cfg = transformers.AutoConfig.for_model(
                "llama4", text_config=TEXT, vision_config=VISION, image_token_index=127,
                boi_token_index=125, eoi_token_index=126,
            )  # fmt: skip
            model = transformers.Llama4ForConditionalGeneration(cfg)
        else:
            cfg = transformers.AutoConfig.for_model("llama4_text", **TEXT)
            model = transformers.AutoModelForCausalLM.from_config(cfg)
        model = model.float().eval()
        with torch.no_grad():
            for p in model.parameters():  # norm weights off 1, the router off its init
                p.add_(0.1 * torch.randn_like(p))
        model.save_pretrained(folder)
        self.kind, self.folder, self.model = kind, folder, model
        self.text = model.language_model if kind == "llama4" else model
        self.prefix = "language_model.model." if kind == "llama4" else "model."
        self.cfg = graphllm.load_config(folder)
        self._weights: dict | None = None

    def weights(self, graph) -> dict:
        if self._weights is None:
            self._weights = load_weights(graph, self.folder)
        return self._weights

    def run(self, ids: np.ndarray, past: dict | None = None, p: int = 0) -> dict:
        wl = graphllm.Workload.with_dtype(
            batch=ids.shape[0], seq_len=ids.shape[1], past_len=p, dtype="fp32"
        )
        g = graphllm.build_graph(self.cfg, wl)
        return run_graph(g, self.weights(g), ids, past)

    @torch.no_grad()
    def hf(self, ids, mask=None, pos=None, cache=None):
        t = torch.from_numpy
        return self.text(
            input_ids=t(ids),
            attention_mask=None if mask is None else t(mask),
            position_ids=None if pos is None else t(pos),
            cache=cache,
            use_cache=True,
        )


@pytest.fixture(scope="module", params=["llama4_text", "llama4"])
def saved(request, tmp_path_factory) -> Saved:
    return Saved(request.param, tmp_path_factory.mktemp(request.param))


def _ids(seed: int, seq: int = SEQ) -> np.ndarray:
    return np.random.default_rng(seed).integers(3, SMALL["vocab_size"], (BATCH, seq))


def _close(a, b, what: str) -> None:
    np.testing.assert_allclose(a, b, atol=ATOL, rtol=0, err_msg=what)


def test_the_checkpoint_holds_the_hubs_names_and_layouts(saved):
    # the names and shapes of meta-llama/Llama-4-Scout-17B-16E's index (language_model.model.*;
    # experts fused, gate then up, as (E, d, 2f) and (E, f, d)): what graphllm's graph reads
    d, f, f_mlp, e = TEXT["hidden_size"], TEXT["intermediate_size"], 48, 4
    tensors = load_file(saved.folder / "model.safetensors")
    moe, dense = f"{saved.prefix}layers.1.feed_forward.", f"{saved.prefix}layers.0.feed_forward."
    assert tensors[moe + "experts.gate_up_proj"].shape == (e, d, 2 * f)
    assert tensors[moe + "experts.down_proj"].shape == (e, f, d)
    assert tensors[moe + "router.weight"].shape == (e, d)
    assert tensors[moe + "shared_expert.gate_proj.weight"].shape == (f, d)
    assert tensors[dense + "gate_proj.weight"].shape == (f_mlp, d)
    assert moe + "experts.0.gate_proj.weight" not in tensors  # nothing per expert
    cfg = saved.cfg
    assert (cfg.model_type, cfg.text_decoder_of) == (
        "llama4_text",
        "llama4" if saved.kind == "llama4" else "",
    )
    assert cfg.moe_layers == (False, True, False, True)


def test_the_vision_tower_is_known_and_left_unread(saved):
    names = load_file(saved.folder / "model.safetensors").keys()
    vision = sorted(n for n in names if not n.startswith(("language_model.", "model.", "lm_")))
    if saved.kind == "llama4_text":
        assert vision == []
        return
    assert any(n.startswith("vision_model.") for n in vision)
    assert "multi_modal_projector.linear_1.weight" in vision
    assert unmodelled_tensors(saved.folder, "llama4") == vision


def test_a_tensor_of_an_unknown_part_is_refused_in_one_line(saved, tmp_path):
    if saved.kind == "llama4_text":
        pytest.skip("a text model's extra tensors follow the text decoder's rule")
    folder = tmp_path / "ckpt"
    shutil.copytree(saved.folder, folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["audio_tower.proj.weight"] = np.zeros((2, 2), np.float32)
    save_file(tensors, folder / "model.safetensors")
    g = graphllm.build_graph(saved.cfg, graphllm.Workload(batch=1, seq_len=4))
    with pytest.raises(WeightsError, match="belongs to no part") as e:
        load_weights(g, folder)
    assert "'audio_tower.proj.weight'" in str(e.value) and "vision_model.*" in str(e.value)
    assert "\n" not in str(e.value)


def test_interpreter_prefill_and_16_cached_steps_equal_transformers(saved):
    ids = _ids(1)
    theirs, ours = saved.hf(ids), saved.run(ids)
    _close(ours["logits"], theirs.logits.numpy(), "prefill")
    cache = theirs.cache
    for step in range(STEPS):
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        theirs = saved.hf(nxt, cache=cache)
        ours = saved.run(nxt, presents(ours), p=SEQ + step)
        _close(ours["logits"], theirs.logits.numpy(), f"cached step {step}")


def test_routing_decides_on_this_checkpoint(saved):
    """The router sends the prompt's tokens to more than one expert, and the interpreter follows
    it: the same weights with the experts' order reversed give other logits."""
    ids = _ids(1)
    chosen: list[int] = []
    router = saved.text.model.layers[1].feed_forward.router
    hook = router.register_forward_hook(lambda m, i, out: chosen.extend(out[1].argmax(-1).tolist()))
    try:
        theirs = saved.hf(ids).logits.numpy()
    finally:
        hook.remove()
    assert len(set(chosen)) > 1  # layer 1's top-1 expert per token
    g = graphllm.build_graph(saved.cfg, graphllm.Workload(batch=BATCH, seq_len=SEQ))
    w = dict(saved.weights(g))
    for name in w:
        if ".experts." in name:
            w[name] = w[name][::-1].copy()
    moved = run_graph(g, w, ids)["logits"]
    assert np.abs(moved - theirs).max() > 1e-2


@pytest.fixture(scope="module")
def onnx_model(saved, tmp_path_factory) -> tuple[OnnxModel, str]:
    """The decomposed export of the folder through the CLI, as a user runs it, and its stderr."""
    out = tmp_path_factory.mktemp(f"{saved.kind}-onnx") / "m.onnx"
    r = CliRunner().invoke(main, ["export", "--weights", str(saved.folder), "-o", str(out)])
    assert r.exit_code == 0, r.output
    return OnnxModel(out, device="cpu"), r.stderr


def test_the_export_says_what_it_leaves_unread(saved, onnx_model):
    stderr = onnx_model[1]
    if saved.kind == "llama4_text":
        assert "vision" not in stderr
        return
    n = len(unmodelled_tensors(saved.folder, "llama4"))
    assert f"note: the checkpoint's {n} tensors of the vision tower and projector" in stderr


def test_onnx_prefill_and_16_cached_steps_equal_transformers(saved, onnx_model):
    onnx = onnx_model[0]
    ids = _ids(2)
    theirs, ours = saved.hf(ids), onnx.forward(ids)
    _close(ours["logits"], theirs.logits.numpy(), "prefill")
    cache = theirs.cache
    for step in range(STEPS):
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        theirs = saved.hf(nxt, cache=cache)
        ours = onnx.forward(nxt, past=presents(ours))
        _close(ours["logits"], theirs.logits.numpy(), f"cached step {step}")


def test_onnx_left_padded_batch_and_16_steps_equal_transformers(saved, onnx_model):
    onnx = onnx_model[0]
    ids = _ids(3)
    ids[1, :PAD] = 0
    mask = np.ones_like(ids)
    mask[1, :PAD] = 0
    pos = positions(mask, SEQ)
    theirs, ours = saved.hf(ids, mask, pos), onnx.forward(ids, mask, pos)
    _close(ours["logits"][0], theirs.logits.numpy()[0], "full row")
    _close(ours["logits"][1, PAD:], theirs.logits.numpy()[1, PAD:], "padded row")
    cache = theirs.cache
    for step in range(STEPS):
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
        pos = positions(mask, 1)
        theirs = saved.hf(nxt, mask, pos, cache=cache)
        ours = onnx.forward(nxt, mask, pos, past=presents(ours))
        _close(ours["logits"], theirs.logits.numpy(), f"padded step {step}")
