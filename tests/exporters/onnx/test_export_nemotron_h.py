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
from graphllm.runtime.session import OnnxModel  # noqa: E402
from tests.support.stateful_onnx import (  # noqa: E402
    StatefulExportParity,
    assert_left_padded,
    carried,
    exported_decomposed,
    hf,
)
from tests.support.tiny_nemotron import SMALL  # noqa: E402

ATOL, STEPS, PAD, LONG = 1e-4, 16, 3, 11
STATES = ("conv_state", "recurrent_state")


@pytest.fixture(scope="module")
def exported(tiny_nemotron, tmp_path_factory):
    return exported_decomposed(tiny_nemotron("hybrid"), tmp_path_factory.mktemp("nemotron_h-onnx"))


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


class TestParity(StatefulExportParity):
    vocab, long, atol, steps, pad = SMALL["vocab_size"], LONG, ATOL, STEPS, PAD


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
    assert_left_padded(m, session, ids, PAD, STEPS, ATOL)


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
    ours, theirs = session.forward(ids), hf(m, ids)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)
    nxt = np.array([[7], [11]])
    ours, theirs = session.forward(nxt, past=carried(ours)), hf(m, nxt, cache=theirs.cache)
    np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("ops", "quantize"), [("decomposed", None), ("standard", None), ("standard", "int8")]
)
def test_in_proj_read_per_group_is_stored_once(ops, quantize):
    """in_proj's weight, read through its per-group row view (head-parallel TP): the export
    stores it once, in the checkpoint's order where the view runs, else already regrouped."""
    from graphllm.exporters.onnx.nbits import Quantization
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
