"""Types of the coverage sweep (benchmarks/traced_coverage.py) whose tiny config broke the
type's own rules, and types refused in one line naming what they do: Dory (a config that
halves its layer counts), xLSTM (cache widths rounded up to 64), XLM (bidirectional unless
`causal`), Reformer and a causal XLM (a tensor's value read in Python)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.models.workload import Workload
from graphllm.trace import traced_graph
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
