"""Traced models of each kind against transformers' own forward: parameters, matmul FLOPs
(torch's FlopCounterMode), logits (prefill and a cached step), and the token mixing the tokens
pass derives from the traced ops' signatures."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from tests.support.traced import FAMILIES, P, check_traced


@pytest.mark.parametrize("past", [0, P], ids=["prefill", "decode"])
@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_traced_equals_transformers(kind, past):
    c = check_traced(FAMILIES[kind], past)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    np.testing.assert_allclose(c.logits, c.want, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_only_core_attention_mixes_tokens(kind):
    c = check_traced(FAMILIES[kind], P)
    tokens = c.results["tokens"].to_dict()
    assert sorted(tokens["mixing_ops"]) == ["pv", "scores", "softmax"]
    assert all(".core." in n["name"] for n in tokens["nodes"])


def test_roles_of_the_traced_dims():
    g = check_traced(FAMILIES["sliding"], P).graph
    assert [d.role for d in g["input_ids"].out.dims] == ["batch", "token"]
    past = g["past_key_values.0.key"].out
    assert [d.role for d in past.dims] == ["batch", "kv_head", "key_token", "head_dim"]
    assert [(d.name, d.role) for d in g["model.layers.0.self_attn.core.scores"].out.dims] == [
        ("B", "batch"),
        ("h", "head"),
        ("T", "token"),
        ("S", "key_token"),
    ]
    # the mask's relation comes from the model's own mask function: a window of 64
    assert g["model.layers.0.self_attn.core.mask"].attrs == {"causal": True, "window": 64}
    assert g.output_role("present.1.value") == "cache"
    # the projections are named by their modules, their weights by the checkpoint's names
    q = g["model.layers.1.self_attn.q_proj"]
    assert q.op == "linear" and q.inputs[1].node == "model.layers.1.self_attn.q_proj.weight"


@pytest.mark.parametrize(("seq", "past"), [(40, 0), (5, 40), (3, 100)])
def test_past_a_sliding_window(monkeypatch, seq, past):
    """Past the window each sliding layer keeps its last W - 1 keys: traced in that regime
    (probes past the window), the graph still gives transformers' logits and FLOPs."""
    import tests.support.traced as support

    monkeypatch.setattr(support, "T", seq)
    c = check_traced(dict(FAMILIES["sliding"], sliding_window=16), past)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    np.testing.assert_allclose(c.logits, c.want, atol=2e-5, rtol=1e-4)
    if past:  # the cache kept and read: the window's last 15 keys
        key = c.graph["past_key_values.0.key"].out.dims[2]
        assert (key.size, key.role, key.positions) == (15, "key_token", ("P-15", "P"))


def test_between_the_probes_and_the_window_is_refused():
    from graphllm.errors import ConfigError
    from graphllm.models.workload import Workload
    from graphllm.trace import traced_graph

    with pytest.raises(ConfigError, match="too short to trace"):
        traced_graph(dict(FAMILIES["sliding"], sliding_window=16), Workload(seq_len=3, past_len=8))
