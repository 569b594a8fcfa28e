"""issue 19: Nemotron-H's ONNX export (decomposed: the loop-free chunked scan, exporters/onnx/
mamba.py) on onnxruntime == transformers == the numpy interpreter (fp32, 1e-4): a prefill of
three chunks (11 tokens, the last chunk padded), 16 decode steps carrying the conv and SSM
states as `past_key_values.{i}.conv_state|recurrent_state` -> `present.{i}.*`, a left-padded
batch of 2 (the padded positions zeroed before each Mamba2 mixer and after its conv, from
attention_mask), and generate."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from graphllm.build.builder import build_export_graph  # noqa: E402
from graphllm.exporters.onnx import export_onnx  # noqa: E402
from graphllm.exporters.onnx.lowering import LoweringError, lower  # noqa: E402
from graphllm.runtime.session import OnnxModel, positions  # noqa: E402
from tests.support.tiny_models import presents as carried  # noqa: E402
from tests.support.tiny_nemotron import SMALL  # noqa: E402

ATOL, STEPS, PAD, LONG = 1e-4, 16, 3, 11
STATES = ("conv_state", "recurrent_state")


@pytest.fixture(scope="module")
def exported(tiny_nemotron, tmp_path_factory):
    m = tiny_nemotron("hybrid")
    path = tmp_path_factory.mktemp("nemotron_h-onnx") / "model.onnx"
    export_onnx(build_export_graph(m.cfg), path, weights=m.folder, ops="decomposed")
    return m, path, OnnxModel(path, device="cpu")


def _hf(m, ids, mask=None, pos=None, cache=None):
    t = torch.from_numpy
    with torch.no_grad():
        return m.model(
            t(ids),
            attention_mask=None if mask is None else t(mask),
            position_ids=None if pos is None else t(pos),
            cache=cache,
            use_cache=True,
        )


def test_the_states_are_inputs_and_outputs_of_their_own(exported):
    m, path, session = exported
    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)
    ins = {i.name for i in model.graph.input}
    outs = {o.name for o in model.graph.output}
    c = m.cfg
    carried_by = {
        i: ("conv_state", "recurrent_state") if c.layer_type(i) == "mamba2" else ("key", "value")
        for i in range(c.num_hidden_layers)
        if c.layer_block(i) == "mixer"  # an MLP or MoE layer carries nothing
    }
    assert carried_by == {0: STATES, 1: ("key", "value"), 4: STATES}
    for i, names in carried_by.items():
        for name in names:
            assert f"past_key_values.{i}.{name}" in ins and f"present.{i}.{name}" in outs
    assert len([k for k in ins if k.startswith("past_key_values.")]) == 6
    assert sorted(session.state_names) == sorted(
        f"past_key_values.{i}.{s}" for i in (0, 4) for s in STATES
    )
    assert "Einsum" in {n.op_type for n in model.graph.node}  # the chunked scan, loop-free
    assert not {"Scan", "Loop"} & {n.op_type for n in model.graph.node}
    assert "Conv" in {n.op_type for n in model.graph.node}


def test_prefill_longer_than_a_chunk_and_16_decode_steps(exported):
    m, _, session = exported
    ids = np.random.default_rng(0).integers(3, SMALL["vocab_size"], (2, LONG))
    ours, theirs, interp = session.forward(ids), _hf(m, ids), m.run(ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(ours["logits"], interp["logits"], atol=ATOL, rtol=0)
    for step in range(STEPS):
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        ours = session.forward(nxt, past=carried(ours))
        theirs = _hf(m, nxt, cache=theirs.cache)
        interp = m.run(nxt, past=carried(interp))
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )
        np.testing.assert_allclose(ours["logits"], interp["logits"], atol=ATOL, rtol=0)


def test_left_padded_batch(exported):
    m, _, session = exported
    ids = np.random.default_rng(1).integers(3, SMALL["vocab_size"], (2, 8))
    ids[1, :PAD] = 0
    mask = np.ones_like(ids)
    mask[1, :PAD] = 0
    pos = positions(mask, 8)
    ours, theirs = session.forward(ids, mask, pos), _hf(m, ids, mask, pos)
    np.testing.assert_allclose(ours["logits"][0], theirs.logits.numpy()[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(
        ours["logits"][1, PAD:], theirs.logits.numpy()[1, PAD:], atol=ATOL, rtol=0
    )
    # the padded row is its prompt alone: padding reaches neither attention nor the states
    alone = m.run(ids[1:, PAD:])["logits"][0]
    np.testing.assert_allclose(ours["logits"][1, PAD:], alone, atol=ATOL, rtol=0)
    for step in range(STEPS):
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
        pos = positions(mask, 1)
        ours = session.forward(nxt, mask, pos, past=carried(ours))
        theirs = _hf(m, nxt, mask, pos, cache=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )


def test_generate_feeds_the_states_back(exported):
    m, _, session = exported
    ids = np.random.default_rng(2).integers(3, SMALL["vocab_size"], (1, 6))
    new = session.generate(ids, 5)  # BoundCache: the presents fed back as OrtValues
    theirs, ref = _hf(m, ids), []
    for _ in range(5):  # transformers' greedy tokens, eos or not
        ref.append(theirs.logits.numpy()[:, -1].argmax(-1)[:, None])
        theirs = _hf(m, ref[-1], cache=theirs.cache)
    np.testing.assert_array_equal(new, np.concatenate(ref, axis=1))


@pytest.mark.parametrize(
    ("case", "ops", "attention"),
    [("hybrid", "standard", "Attention"), ("mamba-bias", "ort", "GroupQueryAttention")],
)
def test_the_fused_default_lowering_is_exact(tiny_nemotron, tmp_path, case, ops, attention):
    """opset 23's Attention (the MoE's relu^2 experts are beyond onnxruntime's MoE op) or, without
    an MoE layer, onnxruntime's GroupQueryAttention on the NoPE layers, the decomposed rows
    elsewhere: the padded batch and 16 decode steps as above."""
    from graphllm.exporters.onnx import default_lowering

    m = tiny_nemotron(case)
    graph = build_export_graph(m.cfg)
    assert default_lowering(graph) == ops
    export_onnx(graph, tmp_path / "model.onnx", weights=m.folder, ops=ops)
    session = OnnxModel(tmp_path / "model.onnx", device="cpu")
    assert attention in {n.op_type for n in onnx.load(str(tmp_path / "model.onnx")).graph.node}
    ids = np.random.default_rng(3).integers(3, SMALL["vocab_size"], (2, LONG))
    ids[1, :PAD] = 0
    mask = np.ones_like(ids)
    mask[1, :PAD] = 0
    pos = positions(mask, LONG)
    ours, theirs = session.forward(ids, mask, pos), _hf(m, ids, mask, pos)
    np.testing.assert_allclose(ours["logits"][0], theirs.logits.numpy()[0], atol=ATOL, rtol=0)
    np.testing.assert_allclose(
        ours["logits"][1, PAD:], theirs.logits.numpy()[1, PAD:], atol=ATOL, rtol=0
    )
    for step in range(STEPS):
        nxt = theirs.logits.numpy()[:, -1].argmax(-1)[:, None]
        mask = np.concatenate([mask, np.ones_like(nxt)], axis=1)
        pos = positions(mask, 1)
        ours = session.forward(nxt, mask, pos, past=carried(ours))
        theirs = _hf(m, nxt, mask, pos, cache=theirs.cache)
        np.testing.assert_allclose(
            ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0, err_msg=f"step {step}"
        )


def test_ort_refuses_the_relu2_experts_in_one_line(exported):
    m, _, _ = exported
    with pytest.raises(LoweringError, match="the ort lowering cannot express") as e:
        lower(build_export_graph(m.cfg), "ort")
    assert "relu2" in str(e.value) and "\n" not in str(e.value)


def test_a_one_token_prompt_clamps_and_its_next_step_does_not(exported):
    """transformers runs a one-token prompt through the chunked form (dt clamped) and the next
    token through the recurrent step (not clamped): the export tells them apart by the mask."""
    m, _, session = exported
    ids = np.array([[5], [9]])
    ours, theirs = session.forward(ids), _hf(m, ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    nxt = np.array([[7], [11]])
    ours, theirs = session.forward(nxt, past=carried(ours)), _hf(m, nxt, cache=theirs.cache)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("ops", "quantize"), [("decomposed", None), ("standard", None), ("standard", "int8")]
)
def test_in_proj_read_per_group_is_stored_once(ops, quantize):
    """in_proj's weight, read through its per-group row view (head-parallel TP): the export
    stores it once, in the checkpoint's order where the view runs, else already regrouped."""
    from graphllm.exporters.onnx.quantize import Quantization
    from graphllm.models.config import config_from_dict

    tiny = dict(SMALL, model_type="nemotron_h", hybrid_override_pattern="M*-EM")
    cfg = config_from_dict(tiny, "nemotron_h")
    q = None if quantize is None else Quantization(quantize, 32)
    _, plan = lower(build_export_graph(cfg), ops, quantize=q)
    mine = [i.name for i in plan if i.name.startswith("backbone.layers.0.mixer.in_proj")]
    want = {
        "decomposed": ["backbone.layers.0.mixer.in_proj.weight"],
        "standard": ["backbone.layers.0.mixer.in_proj.weight_view.T"],
    }
    if quantize is None:
        assert mine == want[ops]
    else:
        assert not any(n.endswith(("in_proj.weight", ".T")) for n in mine) and mine
