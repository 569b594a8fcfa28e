"""issue 18: gpt-oss through graphllm's interpreter == transformers' gpt_oss (eager attention:
transformers has no sdpa path for the sinks), on the tiny_model fixture's "gpt_oss" case: a
prefill and 16 cached steps past its window, with the features that decide the result shown to
matter (the sinks, the clamps, the router's choice)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.support.quantized_checkpoints import MXFP4_CONFIG
from tests.support.tiny_models import BATCH, SEQ, SMALL, presents

ATOL = 1e-4


def test_sixteen_cached_steps_through_the_window(tiny_model):
    m = tiny_model("gpt_oss")
    assert m.model.config._attn_implementation == "eager"
    rng = np.random.default_rng(7)
    ids = rng.integers(0, SMALL["vocab_size"], (BATCH, SEQ))
    ours, theirs = m.run(ids), m.hf(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    w = m.cfg.sliding_window
    for step in range(16):
        nxt = rng.integers(0, SMALL["vocab_size"], (BATCH, 1))
        ours, theirs = m.run(nxt, past=presents(ours)), m.hf(nxt, past=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )
        # the sliding layers' caches roll to the last W-1 keys plus the new one
        assert ours["present.0.key"].shape[2] == w
        assert ours["present.1.key"].shape[2] == SEQ + step + 1


def _hf_logits(m, ids: np.ndarray) -> np.ndarray:
    return m.hf(ids).logits.numpy()


@torch.no_grad()
def test_sinks_clamps_and_routing_each_change_the_logits(tiny_model):
    """Each feature is live in the tiny case, so parity above is not parity of a model that
    ignores it: the sinks, the SwiGLU clamp, and the router's choice of experts."""
    m = tiny_model("gpt_oss")
    ids = np.random.default_rng(8).integers(0, SMALL["vocab_size"], (BATCH, SEQ))
    base = _hf_logits(m, ids)
    layers = m.model.model.layers
    # the router sends tokens to different experts (more distinct choices than one top-k)
    h = m.model.model.embed_tokens(torch.from_numpy(ids))
    _, _, chosen = layers[0].mlp.router(layers[0].post_attention_layernorm(h).reshape(-1, 32))
    assert len({tuple(sorted(r)) for r in chosen.tolist()}) > 2
    for attr, owner, off in (
        ("sinks", [layer.self_attn for layer in layers], None),
        ("limit", [layer.mlp.experts for layer in layers], 1e6),
    ):
        kept = [o.sinks.detach().clone() if off is None else o.limit for o in owner]
        for o in owner:
            if off is None:
                o.sinks.data = torch.full_like(o.sinks, -1e9)  # no mass to the sink
            else:
                setattr(o, attr, off)
        try:
            assert not np.allclose(_hf_logits(m, ids), base, atol=1e-3), attr
        finally:
            for o, k in zip(owner, kept, strict=True):
                if off is None:
                    o.sinks.data = k
                else:
                    setattr(o, attr, k)
    np.testing.assert_allclose(_hf_logits(m, ids), base, atol=0, rtol=0)


def test_router_choice_is_per_token(tiny_model):
    """The graph routes each token to its own experts: a router bias pushing one expert to the
    top changes graphllm's logits as it changes transformers'."""
    m = tiny_model("gpt_oss")
    ids = np.random.default_rng(9).integers(0, SMALL["vocab_size"], (BATCH, SEQ))
    before = m.run(ids)["logits"]
    name = "model.layers.1.mlp.router.bias"
    param = dict(m.model.named_parameters())[name]
    kept, kept_w = param.detach().clone(), m.weights[name].copy()
    try:
        with torch.no_grad():
            param[3] += 10.0
        m.weights[name] = param.detach().numpy().copy()
        ours, theirs = m.run(ids)["logits"], _hf_logits(m, ids)
        np.testing.assert_allclose(ours, theirs, atol=ATOL, rtol=0)
        assert not np.allclose(ours, before, atol=1e-3)
    finally:
        with torch.no_grad():
            param.copy_(kept)
        m.weights[name] = kept_w


@pytest.mark.parametrize("layer", [0, 2])
def test_window_layers_are_sliding(tiny_model, layer):
    m = tiny_model("gpt_oss")
    assert m.cfg.layer_types[layer] == "sliding_attention"
    assert m.cfg.layer_types[1] == "full_attention"


@torch.no_grad()
def test_mxfp4_checkpoint_as_openai_ships_it(tiny_model, tmp_path):
    """The experts stored as gpt-oss's release stores them, W_blocks [E, out, in/32, 16] and
    W_scales [E, out, in/32] beside unconverted biases, router and attention (its
    quantization_config); graphllm reads and dequantizes them to transformers' logits, the
    reference model running on what transformers' own convert_moe_packed_tensors makes of them."""
    import json

    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    import graphllm
    from graphllm.build.weights import load_weights
    from graphllm.runtime.interpret import run_graph
    from tests.support.quantized_checkpoints import quantize_mxfp4

    m = tiny_model("gpt_oss", intermediate_size=32)  # MXFP4 rows: multiples of 32
    tensors = load_file(str(m.folder / "model.safetensors"))
    params = dict(m.model.named_parameters())
    stored = {}
    for name, t in tensors.items():
        if not name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            stored[name] = t
            continue
        w = t.transpose(0, 2, 1)  # (E, out, in), the release's row layout
        blocks, scales = zip(*(quantize_mxfp4(w[e]) for e in range(w.shape[0])), strict=True)
        stored[name + "_blocks"], stored[name + "_scales"] = np.stack(blocks), np.stack(scales)
        back = convert_moe_packed_tensors(
            torch.from_numpy(stored[name + "_blocks"]),
            torch.from_numpy(stored[name + "_scales"]),
            dtype=torch.float32,
        )
        params[name].copy_(back)  # the reference runs on the dequantized experts
    folder = tmp_path / "mxfp4"
    folder.mkdir()
    save_file(stored, str(folder / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((m.folder / "config.json").read_text())
    cfg["quantization_config"] = MXFP4_CONFIG
    (folder / "config.json").write_text(json.dumps(cfg))
    try:
        c = graphllm.load_config(folder)
        assert c.quantization is not None and c.quantization.method == "mxfp4"
        ids = np.random.default_rng(10).integers(0, SMALL["vocab_size"], (BATCH, SEQ))
        wl = graphllm.Workload.with_dtype(batch=BATCH, seq_len=SEQ, dtype="fp32")
        g = graphllm.build_graph(c, wl)
        ours = run_graph(g, load_weights(g, folder), ids)["logits"]
        np.testing.assert_allclose(ours, m.hf(ids).logits.numpy(), atol=ATOL, rtol=0)
    finally:  # the fixture's model is shared: its own expert weights back
        for name, t in tensors.items():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                params[name].copy_(torch.from_numpy(t))
