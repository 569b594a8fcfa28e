"""The ONNX parity checks every model with carried states (conv and recurrent/SSM states beside
the KV cache: Nemotron-H, Qwen3-Next) runs against transformers and the numpy interpreter: a
prefill then greedy decode steps, a left-padded batch, and generate. `m` is a tiny model of
tests/support (its `model`, `run` and `cfg`), `session` a runtime.session.OnnxModel."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from graphllm.runtime.session import OnnxModel, positions
from tests.support.tiny_models import presents as carried


def hf(m, ids, mask=None, pos=None, cache=None):
    """transformers' forward of the tiny model, with its cache (use_cache) to feed back."""
    import torch

    t = torch.from_numpy
    with torch.no_grad():
        return m.model(
            t(ids),
            attention_mask=None if mask is None else t(mask),
            position_ids=None if pos is None else t(pos),
            cache=cache,
            use_cache=True,
        )


def assert_prefill_and_decode(m, session, ids: np.ndarray, steps: int, atol: float) -> None:
    """The prefill and `steps` greedy decode steps, each fed its presents: ONNX == transformers
    == the interpreter."""
    ours, theirs, interp = session.forward(ids), hf(m, ids), m.run(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=atol, rtol=0)
    np.testing.assert_allclose(ours["logits"], interp["logits"], atol=atol, rtol=0)
    for step in range(steps):
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        ours = session.forward(nxt, past=carried(ours))
        theirs = hf(m, nxt, cache=theirs.cache)
        interp = m.run(nxt, past=carried(interp))
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=atol, rtol=0, err_msg=f"step {step}"
        )
        np.testing.assert_allclose(ours["logits"], interp["logits"], atol=atol, rtol=0)


def assert_left_padded(
    m, session, ids: np.ndarray, pad: int, steps: int, atol: float, alone: bool = False
) -> None:
    """A batch of 2 whose second row is left-padded by `pad` tokens (set to 0 here), then `steps`
    decode steps: ONNX == transformers on every real position. alone: also that the padded row
    is its prompt alone in the interpreter (padding reaches neither attention nor the states)."""
    ids[1, :pad] = 0
    mask = np.ones_like(ids)
    mask[1, :pad] = 0
    pos = positions(mask, ids.shape[1])
    ours, theirs = session.forward(ids, mask, pos), hf(m, ids, mask, pos)
    np.testing.assert_allclose(ours["logits"][0], theirs.logits.numpy()[0], atol=atol, rtol=0)
    np.testing.assert_allclose(
        ours["logits"][1, pad:], theirs.logits.numpy()[1, pad:], atol=atol, rtol=0
    )
    if alone:
        by_itself = m.run(ids[1:, pad:])["logits"][0]
        np.testing.assert_allclose(ours["logits"][1, pad:], by_itself, atol=atol, rtol=0)
    for step in range(steps):
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
        pos = positions(mask, 1)
        ours = session.forward(nxt, mask, pos, past=carried(ours))
        theirs = hf(m, nxt, mask, pos, cache=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=atol, rtol=0, err_msg=f"step {step}"
        )


def assert_generate_matches(m, session, ids: np.ndarray, new_tokens: int) -> None:
    """session.generate (BoundCache: the presents fed back as OrtValues) == transformers' greedy
    tokens, eos or not."""
    new = session.generate(ids, new_tokens)
    theirs, ref = hf(m, ids), []
    for _ in range(new_tokens):
        ref.append(theirs.logits.numpy()[:, -1].argmax(-1)[:, None])
        theirs = hf(m, ref[-1], cache=theirs.cache)
    np.testing.assert_array_equal(new, np.concatenate(ref, axis=1))


def exported_decomposed(m, folder: Path) -> tuple:
    """(m, the path, an OnnxModel session) of `m`'s export with the decomposed lowering to
    folder/model.onnx: what StatefulExportParity's `exported` fixture gives."""
    from graphllm.build.builder import build_export_graph
    from graphllm.exporters.onnx import export_onnx

    path = folder / "model.onnx"
    export_onnx(build_export_graph(m.cfg), path, weights=m.folder, ops="decomposed")
    return m, path, OnnxModel(path, device="cpu")


class StatefulExportParity:
    """The parity tests every stateful export passes, for a test module to subclass as
    `TestParity` beside its module-scoped `exported` fixture ((tiny model, path, session)):
    `vocab` its model's vocabulary, `long` a prefill longer than one chunk of its scan."""

    vocab: int
    long: int
    atol, steps, pad = 1e-4, 16, 3

    def test_prefill_longer_than_a_chunk_and_16_decode_steps(self, exported) -> None:
        m, _, session = exported
        ids = np.random.default_rng(0).integers(3, self.vocab, (2, self.long))
        assert_prefill_and_decode(m, session, ids, self.steps, self.atol)

    def test_left_padded_batch(self, exported) -> None:
        m, _, session = exported
        ids = np.random.default_rng(1).integers(3, self.vocab, (2, 8))
        assert_left_padded(m, session, ids, self.pad, self.steps, self.atol, alone=True)

    def test_generate_feeds_the_states_back(self, exported) -> None:
        m, _, session = exported
        ids = np.random.default_rng(2).integers(3, self.vocab, (1, 6))
        assert_generate_matches(m, session, ids, 5)
