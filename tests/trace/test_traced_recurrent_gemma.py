"""RecurrentGemma (Griffin): its RG-LRU's scan recorded as one unit (the linear_recurrence rows),
its causal conv, local attention and soft-capped logits traced, and the states it keeps on its
modules carried as cache entries; the traced model against transformers' forward (prefill,
several tokens after a past, one token after a past: the conv reads its carried inputs for one
only) and on onnxruntime."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")
from graphllm.cli.main import main
from graphllm.errors import ConfigError
from graphllm.models.workload import Workload
from graphllm.passes import run
from graphllm.trace import kernels, traced_graph
from graphllm.trace.capture import Event, Recording, Val
from graphllm.trace.recurrences import padded_conv_reader
from tests.support.traced import P, assert_recurrent_equal, check_traced, onnx_against_transformers

_IDS = dict(pad_token_id=0, bos_token_id=0, eos_token_id=0)
# two recurrent layers, a local attention layer, a recurrent one (the published 2:1 pattern)
RGEMMA = dict(
    model_type="recurrent_gemma",
    vocab_size=96,
    hidden_size=32,
    lru_width=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    attention_window_size=64,
    conv1d_width=4,
    **_IDS,
)


@pytest.mark.parametrize(("past", "new"), [(0, 5), (0, 2), (P, 5), (P, 1)])
def test_traced_recurrent_gemma_equals_transformers(past, new):
    """Parameters, matmul FLOPs (FlopCounterMode), the conv's FLOPs, logits. After a past the
    scan starts from the layer's carried state; the conv reads its carried inputs for one new
    token and starts from zeros for several, as transformers' two branches do."""
    c = check_traced(RGEMMA, past, new)
    assert_recurrent_equal(c, new)
    g, tokens = c.graph, c.results["tokens"].to_dict()
    scans = {n.op for n in g.nodes() if n.op.startswith("linear_recurrence")}
    # the layer's state is handed in at every step (transformers' zeros at the first)
    assert scans == {"linear_recurrence_state"}
    assert "linear_recurrence_state" in tokens["mixing_ops"]
    assert "causal_conv1d_bias" in tokens["mixing_ops"]
    assert any(n.op == "one_token_state" for n in g.nodes()) == bool(past)
    for layer in (0, 1, 3):  # the recurrent layers' states, as cache outputs
        for attr in ("conv1d_state", "recurrent_states"):
            assert g.output_role(f"present.{layer}.{attr}") == "state"
    assert g.output_role("present.2.key") == "cache"
    assert any(n.op.startswith("aten.tanh") for n in g.nodes())  # the logits' soft cap
    # the recurrent blocks' weights (projections, conv, RG-LRU gates) count as a linear
    # recurrence's, not an MLP's: 3 layers of 2 * 1056 + 1056 + 160 + 608
    assert c.results["params"].by_kind["linear_attention"] == 3 * 3936


def test_past_the_local_attention_window():
    """Past attention_window_size keys transformers' cache keeps the last W - 1 of the local
    attention layer: the trace probes that regime, the recurrent layers' states unchanged."""
    for past, new in ((70, 1), (70, 5)):
        assert_recurrent_equal(check_traced(RGEMMA, past, new), new)


def test_the_cached_states_carry_through_the_past_inputs():
    """A cached step reads each recurrent layer's conv inputs and RG-LRU state as inputs
    named as its outputs are."""
    g = traced_graph(RGEMMA, Workload(batch=2, seq_len=1, past_len=P, dtype="fp32"))
    inputs = {n.name for n in g.nodes("input")}
    for layer in (0, 1, 3):
        assert f"past_key_values.{layer}.conv1d_state" in inputs
        assert f"past_key_values.{layer}.recurrent_states" in inputs


@pytest.mark.parametrize("new", [1, 5])
def test_traced_recurrent_gemma_export_equals_transformers(new, tmp_path):
    """One export (made at one token after a past) on onnxruntime: `new` tokens after 4 cached
    ones, and all of them from an empty cache, against transformers' forward of the whole
    sequence. Several new tokens after a past are transformers' own cached step instead, whose
    conv starts from zeros: the coverage sweep checks that one."""
    decode, prefill = onnx_against_transformers(RGEMMA, tmp_path, new)
    assert prefill < 1e-4, prefill
    if new == 1:
        assert decode < 1e-4, decode


def _conv_recording(reader: str, start: int = 0) -> tuple[Recording, Event]:
    """A depthwise conv of 4 taps padded by 3 (B, C, T) = (2, 8, 5) -> (2, 8, 8), then
    `reader` of its output."""
    rec = Recording()
    rec.shapes.update({0: (2, 8, 5), 1: (8, 1, 4), 2: (8,), 3: (2, 8, 8), 4: (2, 8, 5)})
    conv = Event(
        "aten.convolution.default",
        (Val(0), Val(1), Val(2), [1], [3], [1], False, [0], 8),
        {},
        (3,),
        "conv",
    )
    if reader == "slice":
        tail = Event("aten.slice.Tensor", (Val(3), 2, start, 5 + start), {}, (4,), "x")
    else:
        tail = Event("aten.mul.Tensor", (Val(3), 2.0), {}, (4,), "x")
    rec.events = [conv, tail]
    return rec, conv


def test_a_padded_conv_is_causal_only_where_its_first_outputs_are_kept():
    """torch's conv padded by K-1 on both sides computes K-1 outputs past the input's end: it
    is the causal conv only where a slice keeps its first S outputs and nothing else reads it."""
    rec, conv = _conv_recording("slice")
    assert padded_conv_reader(rec, conv) is rec.events[1]
    rec, conv = _conv_recording("slice", start=3)  # the last S: windows past the end
    assert padded_conv_reader(rec, conv) is None
    rec, conv = _conv_recording("mul")
    assert padded_conv_reader(rec, conv) is None


def test_a_scan_with_another_accumulator_is_refused():
    import torch

    with pytest.raises(ConfigError, match="accumulator other than fp32"):
        kernels._linear_recurrence(None, None, None, None, None, acc_dtype=torch.float64)


def test_diagrams_draw_the_recurrent_block_by_its_scan(tmp_path):
    """A traced RecurrentGemma's recurrent block says what it is (no Gated DeltaNet): its
    channels and conv taps."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(RGEMMA))
    out = tmp_path / "block.dot"
    r = CliRunner().invoke(
        main, ["render", "--config", str(path), "--view", "block", "-o", str(out)]
    )
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "recurrent block (RG-LRU)\\ntemporal_block\\n32 channels, conv 4" in text
    assert "DeltaNet" not in text


# the size of google/recurrentgemma-2b (RecurrentGemmaConfig's docstring checkpoint): its
# defaults, with an MLP of 15360 / 2 and one KV head (multi-query), which give the ~2.7B
# parameters the model is published with; the count is checked against transformers' own model
RGEMMA_2B = dict(
    model_type="recurrent_gemma",
    hidden_size=2560,
    intermediate_size=15360,
    num_hidden_layers=26,
    vocab_size=256000,
    num_attention_heads=10,
    num_key_value_heads=1,
    head_dim=256,
    lru_width=2560,
    attention_window_size=2048,
    conv1d_width=4,
    logits_soft_cap=30.0,
    block_types=["recurrent", "recurrent", "attention"],
    pad_token_id=0,
    bos_token_id=2,
    eos_token_id=1,
)


def test_recurrentgemma_2b_traces_at_full_size():
    """On the meta device, in bf16: transformers' own model's parameter count (its head tied to
    the embedding), and the cache of a step past the local window: each of the 18 recurrent
    layers' conv inputs (3, bf16) and RG-LRU state (fp32) of 2560 channels, each of the 8
    attention layers' last W - 1 keys and values. The past's prefill runs no Python loop over
    its 4096 tokens (the scan's stand-in), so this takes seconds."""
    import torch
    import transformers

    fields = {k: v for k, v in RGEMMA_2B.items() if k != "model_type"}
    with torch.device("meta"):
        ref = transformers.AutoModelForCausalLM.from_config(
            transformers.CONFIG_MAPPING["recurrent_gemma"](**fields)
        )
    g = traced_graph(RGEMMA_2B, Workload(seq_len=1, past_len=4096))
    res = run(g, ["params", "memory"])
    assert res["params"].total == sum(p.numel() for p in ref.parameters()) == 2_682_862_080
    assert res["memory"].state == 18 * 2560 * (3 * 2 + 4)
    assert res["memory"].kv_cache == 8 * 2 * 2047 * 256 * 2
