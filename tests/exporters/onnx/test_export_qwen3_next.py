"""issue 19: Qwen3-Next's ONNX export on onnxruntime == transformers == the numpy interpreter
(fp32, 1e-4): a prefill longer than one chunk, 16 decode steps carrying the conv and recurrent
states as `past_key_values.{i}.conv_state|recurrent_state` -> `present.{i}.*`, and a left-padded
batch of 2 (the padded positions zeroed before each linear layer, from attention_mask)."""

from __future__ import annotations

import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from graphllm.build.builder import build_export_graph  # noqa: E402
from graphllm.exporters.onnx.lowering import LoweringError, lower  # noqa: E402
from tests.support.stateful_onnx import StatefulExportParity, exported_decomposed  # noqa: E402
from tests.support.tiny_qwen3_next import LONG, SMALL  # noqa: E402


@pytest.fixture(scope="module")
def exported(tiny_qwen3_next, tmp_path_factory):
    return exported_decomposed(
        tiny_qwen3_next("qwen3_next"), tmp_path_factory.mktemp("qwen3_next-onnx")
    )


def test_the_states_are_inputs_and_outputs_of_their_own(exported):
    m, path, session = exported
    model = onnx.load(str(path), load_external_data=False)
    onnx.checker.check_model(model)
    ins = {i.name for i in model.graph.input}
    outs = {o.name for o in model.graph.output}
    for i, kind in enumerate(m.cfg.layer_types):
        names = (
            ("conv_state", "recurrent_state") if kind == "linear_attention" else ("key", "value")
        )
        for name in names:
            assert f"past_key_values.{i}.{name}" in ins and f"present.{i}.{name}" in outs
    assert sorted(session.state_names) == sorted(
        f"past_key_values.{i}.{s}"
        for i, kind in enumerate(m.cfg.layer_types)
        if kind == "linear_attention"
        for s in ("conv_state", "recurrent_state")
    )
    assert "Scan" in {n.op_type for n in model.graph.node}  # the delta rule, token by token
    assert "Conv" in {n.op_type for n in model.graph.node}


class TestParity(StatefulExportParity):
    vocab, long = SMALL["vocab_size"], LONG


@pytest.mark.parametrize("ops", ["standard", "ort"])
def test_the_fused_lowerings_refuse_in_one_line_and_the_default_is_decomposed(exported, ops):
    from graphllm.exporters.onnx import default_lowering

    m, _, _ = exported
    graph = build_export_graph(m.cfg)
    with pytest.raises(LoweringError, match=f"the {ops} lowering cannot express") as e:
        lower(graph, ops)
    assert "\n" not in str(e.value)
    assert default_lowering(graph) == "decomposed"


def test_bench_runs_a_model_with_states(tmp_path):
    """`graphllm bench --config`: the export fed zeros for the prefill's states and its presents
    back, never bound in place; the budget counts the KV cache alone."""
    import json

    import yaml
    from click.testing import CliRunner

    from graphllm.cli import main

    tiny = {k: v for k, v in SMALL.items() if not k.endswith("token_id")}
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump({"model_type": "qwen3_next", **tiny, "num_hidden_layers": 2}))
    args = ["bench", "--config", str(f), "--prompt-len", "8", "--new-tokens", "4"]
    r = CliRunner().invoke(main, [*args, "--repeats", "1", "--no-predict", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["measured"]["decode_ms_per_token"] > 0
