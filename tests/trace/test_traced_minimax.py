"""MiniMax-01 traced: its lightning attention's loops over blocks (from a zero state) and over
tokens (after the cache's state) recorded as one unit (graphllm.trace.loops) and lowered onto the
lightning_attention rows; tiny random models against transformers' forward (prefill inside a
block and over several, several tokens and one after a past) and on onnxruntime, the states
its cache keeps in a list of its own; one lightning layer analysed for both; a method whose
source is not the stand-in's refused.
The rows themselves are checked against transformers' loops in tests/ops/test_lightning.py."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
from graphllm.errors import ConfigError
from graphllm.files import json_text
from graphllm.models.hardware import load_hardware
from graphllm.models.workload import Workload
from graphllm.report import reduced, reuse
from graphllm.report.trace_report import traced_report
from graphllm.trace import loops, traced_graph
from tests.support.traced import P, assert_recurrent_equal, check_traced, onnx_against_transformers

# full, lightning, lightning attention (the two lightning layers one kind, each its own decay
# rate), an MoE MLP in each; blocks of 4 positions, so that a prefill crosses them. The first
# layer is a full attention one: transformers reads the cache's length from layer 0's keys
MINIMAX = dict(
    model_type="minimax",
    vocab_size=96,
    hidden_size=32,
    intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_local_experts=4,
    num_experts_per_tok=2,
    layer_types=["full_attention", "linear_attention", "linear_attention"],
    block_size=4,
    pad_token_id=0,
    bos_token_id=0,
    eos_token_id=0,
)


@pytest.mark.parametrize(("past", "new"), [(0, 3), (0, 9), (P, 5), (P, 1)])
def test_traced_minimax_equals_transformers(past, new):
    """Parameters (the decay tables beside each rate among them), matmul FLOPs
    (FlopCounterMode: the block loop's at 9 positions, two blocks and one more; the token
    loop's after a past) and logits within 1e-4."""
    c = check_traced(MINIMAX, past, new)
    assert_recurrent_equal(c, new)
    g, tokens = c.graph, c.results["tokens"].to_dict()
    rule = "lightning_attention_past" if past else "lightning_attention"
    cores = [n for n in g.nodes() if n.op.startswith("lightning_attention")]
    assert [n.name for n in cores] == [
        "model.layers.1.self_attn.core",
        "model.layers.2.self_attn.core",
    ]
    assert {n.op for n in cores} == {rule}
    assert rule in tokens["mixing_ops"]
    # the cache as transformers holds it: each lightning layer's state (B, H, d, d) in the
    # cache's own list, the full attention layer's keys and values
    states = sorted(k for k in g.outputs if k.endswith("linear_cache"))
    assert states == ["present.1.linear_cache", "present.2.linear_cache"]
    assert all(g.output_role(k) == "state" for k in states)
    assert c.results["memory"].state == 2 * (2 * 4 * 8 * 8 * 4)


def test_the_decay_tables_are_parameters_no_row_reads():
    """transformers' query_decay, key_decay and diagonal_decay are powers of the layer's rate,
    which the rows compute: the checkpoint's tensors, counted, read by nothing."""
    g = traced_graph(MINIMAX, Workload(seq_len=8, dtype="fp32"))
    readers = {r.node for n in g.nodes() for r in n.inputs}
    tables = [n.name for n in g.nodes("param") if n.name.endswith("_decay")]
    assert len(tables) == 6 and not readers & set(tables)
    core = g["model.layers.2.self_attn.core"]
    rate = g[core.inputs[3].node]
    assert rate.inputs[0].node == "model.layers.2.self_attn.slope_rate"
    assert g.type_of(core.inputs[3]).shape(g.bindings) == (4,)


@pytest.mark.parametrize("new", [1, 5])
def test_traced_minimax_export_equals_transformers(new, tmp_path):
    """One export (made at one token after a past) on onnxruntime: `new` tokens after 4 cached
    ones, and all of them from an empty cache (a zero state), against transformers' forward of
    the whole sequence, whose block loop crosses blocks."""
    decode, prefill = onnx_against_transformers(MINIMAX, tmp_path, new)
    assert decode < 1e-4, decode
    assert prefill < 1e-4, prefill


def test_a_method_not_the_stand_ins_is_refused(monkeypatch):
    """A lightning attention whose transformers source differs from the one the stand-in
    reproduces is refused in one line, never traced as the older code."""
    monkeypatch.setenv("GRAPHLLM_TRACE_CACHE", "0")
    key = ("MiniMaxLightningAttention", "forward")
    _, stand_in = loops.METHODS[key]
    monkeypatch.setitem(loops.METHODS, key, ("0" * 16, stand_in))
    with pytest.raises(ConfigError, match=r"MiniMaxLightningAttention\.forward is not the code"):
        traced_graph(MINIMAX, Workload(seq_len=8, dtype="fp32"))


@pytest.mark.parametrize("wl", [Workload(seq_len=40), Workload(batch=2, seq_len=1, past_len=30)])
def test_one_lightning_layer_stands_for_the_others(wl):
    """trace's one-layer-of-each-kind analysis: the second lightning layer (its own rate and
    decay tables, its own cache entry) unrolled from the first gives the full document."""
    hw = load_hardware("h100")
    full = traced_graph(MINIMAX, wl, "minimax")
    assert reduced.reduced_traced(full)[1] == [0, 1, 1]
    got = reuse.reused_report(full.meta["config"], wl, hw)
    assert got is not None
    want, _ = traced_report(MINIMAX, "minimax", wl, hw)
    assert json.loads(json_text(got)) == json.loads(json_text(want))
