"""Types of the coverage sweep (benchmarks/traced_coverage.py) whose tiny config broke the
type's own rules, and types refused in one line naming what they do: Dory (a config that
halves its layer counts), xLSTM (cache widths rounded up to 64), XLM (bidirectional unless
`causal`), Reformer and a causal XLM (a tensor's value read in Python); Ergo (RoPE angles in
float64, a checkpoint that stores tensors transposed)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.exporters.onnx import export_onnx
from graphllm.models.workload import Workload
from graphllm.runtime.interpret import Interpreter
from graphllm.trace import traced_graph
from graphllm.trace.forward import cache_tensors
from tests.support.benchmark_scripts import load_script

CHECKS = (
    "prefill_trace",
    "decode_trace",
    "params",
    "prefill_flops",
    "decode_flops",
    "prefill_logits",
    "decode_logits",
    "onnx",
)
PREFILL = Workload(batch=2, seq_len=5, past_len=0, dtype="fp32")


@pytest.fixture(scope="module")
def tc():
    return load_script("traced_coverage")


def test_dory_holds_every_check(tc):
    """Dory's layer counts given as its released configs give them (an attention and an "mlp"
    entry a layer) are halved by its config: the tiny config gives its four layers directly,
    one before and one after the two looped ones, each loop with its own cache."""
    from transformers import CONFIG_MAPPING

    raw = tc.tiny_config("dory")
    cfg = CONFIG_MAPPING["dory"](**{k: v for k, v in raw.items() if k != "model_type"})
    assert (cfg.n_input_layers, cfg.n_recurrent_layers, cfg.n_output_layers) == (1, 2, 1)
    row = tc.check("dory")
    assert all(row[k] is True for k in CHECKS), row


def test_xlstm_tiny_config_runs_and_its_cache_is_refused_by_name(tc):
    """xLSTM's cache rounds the q/k and v widths up to multiples of 64 and its layers do not:
    the tiny config's widths are multiples (transformers runs it); the trace then names the
    cache object of its mLSTM, a recurrence graphllm has no row for."""
    import torch

    raw = tc.tiny_config("xlstm")
    ref = tc._reference(raw)
    with torch.no_grad():
        assert ref(torch.zeros((2, 5), dtype=torch.long)).logits.shape == (2, 5, 128)
    with pytest.raises(ConfigError, match="does not read the cache object xLSTMCache"):
        traced_graph(raw, PREFILL)


def test_a_bidirectional_default_is_an_encoder(tc):
    """XLM's causal LM is a masked LM unless its config says `causal`: the sweep leaves it out
    as an encoder, and the trace refuses it in one line."""
    from transformers import CONFIG_MAPPING

    assert tc._encoder(CONFIG_MAPPING["xlm"]) == "not causal"
    assert tc._encoder(CONFIG_MAPPING["llama"]) is None
    assert tc._encoder(CONFIG_MAPPING["bert"]) == "encoder"
    with pytest.raises(ConfigError, match=r"bidirectional encoder here .*causal is False"):
        traced_graph(tc.tiny_config("xlm"), PREFILL)


@pytest.mark.parametrize(
    ("model_type", "fields", "line"),
    [
        # the axial position table cut at the largest position id
        ("reformer", {}, r"modeling_reformer.py:\d+: `max_position_id = position_ids.max\(\)"),
        # the padding lengths checked against the sequence's
        ("xlm", {"causal": True}, r"modeling_xlm.py:\d+: `assert lengths.max\(\).item\(\)"),
    ],
)
def test_a_value_read_in_python_is_refused_at_its_line(tc, model_type, fields, line):
    raw = tc.tiny_config(model_type) | fields
    with pytest.raises(ConfigError, match=r"reads a tensor's value in Python .*" + line):
        traced_graph(raw, PREFILL)


def test_ergo_holds_every_check(tc):
    """Ergo computes its RoPE angles in float64 (fp64 rows, DOUBLE in the export) and its
    checkpoint stores the router and the shared expert transposed (read back swapped)."""
    row = tc.check("ergo")
    assert all(row[k] is True for k in CHECKS), row
    with pytest.raises(ConfigError, match="fp64 is a dtype of a model's own ops"):
        Workload(dtype="fp64")  # a tensor's dtype in a trace, never a whole workload's


def test_fp64_angles_hold_at_far_positions(tc, tmp_path):
    """At position 3,000,000 an fp32 angle is off by ~0.1 rad (logits by ~3e-3): the
    interpreter and the ONNX export compute the angles in float64, as transformers does."""
    import onnxruntime as ort
    import torch

    raw = tc.tiny_config("ergo")
    ref = tc._reference(raw)
    ref.save_pretrained(tmp_path)
    weights = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    ids = np.random.default_rng(0).integers(0, raw["vocab_size"], (2, 5))
    pos = np.broadcast_to(np.arange(5) + 3_000_000, (2, 5)).copy()
    with torch.no_grad():
        want = ref(torch.tensor(ids), position_ids=torch.tensor(pos)).logits.numpy()
        cache = ref(torch.tensor(ids[:, :1]), use_cache=True).past_key_values
    g = traced_graph(raw, PREFILL, values=True)
    assert {n.out.dtype for n in g.nodes() if "rotary_emb" in n.name} >= {"fp64"}
    got = Interpreter(g, weights).run({"input_ids": ids, "position_ids": pos})["logits"]
    assert np.abs(got - want).max() < 1e-5
    g = traced_graph(raw, Workload(seq_len=1, past_len=1, dtype="fp32"), values=True)
    export_onnx(g, str(tmp_path / "m.onnx"), weights=tmp_path, ops="decomposed")
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": ids, "position_ids": pos, "attention_mask": np.ones((2, 5), np.int64)}
    feeds |= {k: t.numpy()[:, :, :0] for k, t, _ in cache_tensors(cache, "past_key_values")}
    names = {i.name for i in session.get_inputs()}
    got = session.run(["logits"], {k: v for k, v in feeds.items() if k in names})[0]
    assert np.abs(got - want).max() < 1e-5


def test_a_step_that_reads_the_whole_sequence_is_refused(tc):
    """CPM-Ant's generation feeds every cached step the whole sequence's ids (its forward
    drops the cached prefix itself): its prefill traces exactly, its cached step is refused."""
    raw = tc.tiny_config("cpmant")
    ref = tc._reference(raw)
    weights = {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}
    ids = np.random.default_rng(0).integers(0, raw["vocab_size"], (2, 5))
    row = tc._check_phase(raw, ref, weights, "prefill", ids, None)
    assert all(row[k] is True for k in ("prefill_trace", "params", "prefill_flops")), row
    assert row["prefill_logits"] is True, row
    with pytest.raises(ConfigError, match="cached step reads the whole sequence's ids"):
        traced_graph(raw, Workload(batch=2, seq_len=1, past_len=4, dtype="fp32"))
