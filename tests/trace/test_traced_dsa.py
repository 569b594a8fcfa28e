"""DeepSeek Sparse Attention traced (DeepSeek-V3.2 and the families that copy its indexer): the
indexer's top-k over the keys is the `topk_select` row with the k it keeps, the attention that
reads its indices masks with `mask_selected`; tiny random models whose top-k is smaller than the
keys, so the selection changes the logits, against transformers' forward (prefill, several
tokens after a past, one token after a past) and on onnxruntime; the engine's count of a
selected-keys attention (k keys a query) beside the dense count FlopCounterMode gives."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("transformers")
from graphllm.models.workload import Workload
from graphllm.ops import OPS
from graphllm.passes import run
from graphllm.runtime.interpret import Interpreter
from graphllm.runtime.observe import MixingCheck, traced_mixing_check
from graphllm.trace import traced_graph
from tests.support.traced import MLA, P, check_traced, onnx_against_transformers

TOPK = 3
# MLA and DeepSeek's MoE, an indexer of 8 heads of 8 channels keeping 3 keys a query
DSA = dict(
    MLA,
    model_type="deepseek_v32",
    moe_intermediate_size=16,
    n_group=1,
    topk_group=1,
    first_k_dense_replace=1,
    index_n_heads=8,
    index_head_dim=8,
    index_topk=TOPK,
)

# GLM-5's option: a layer reuses the selection of the layer before (its indexer skipped), here
# the first layer's, handed on by the second to the third
SHARED = dict(DSA, model_type="glm_moe_dsa", num_hidden_layers=3)
SHARED["indexer_types"] = ["full", "shared", "shared"]


@pytest.mark.parametrize(("past", "new"), [(0, 9), (P, 5), (P, 1)])
def test_traced_dsa_equals_transformers(past, new):
    """Parameters, matmul FLOPs (FlopCounterMode: transformers' eager attention is dense, its
    mask kept where the indexer chose) and logits within 1e-4, with 3 keys kept of up to 9."""
    c = check_traced(DSA, past, new)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    np.testing.assert_allclose(c.logits, c.want, atol=1e-4, rtol=0)
    g = c.graph
    select = [n for n in g.nodes() if n.op == "topk_select"]
    masks = [n for n in g.nodes() if n.op == "mask_selected"]
    assert len(select) == len(masks) == 2 and {n.attrs["topk"] for n in select} == {TOPK}
    assert all(g[m.inputs[1].node] in select for m in masks)
    # the selection reads every score of its query (a mixing op), the indexer's scores masked
    # causally before it
    assert "topk_select" in c.results["tokens"].to_dict()["mixing_ops"]
    assert {g[n.inputs[0].node].op for n in select} == {"mask_nohead"}


def test_a_dense_attention_would_not_give_transformers_logits():
    """The check above fails if the selection is dropped: the same weights with every key
    kept (index_topk past the prompt) differ from transformers' sparse logits."""
    c = check_traced(DSA, 0, 9)
    wl = Workload(batch=2, seq_len=9, dtype="fp32")
    dense = traced_graph(dict(DSA, index_topk=64), wl, values=True)
    weights = _weights(DSA)
    ids = np.random.default_rng(0).integers(0, 96, (2, 9))  # check_traced's prompt
    feeds = {"input_ids": ids, "position_ids": np.broadcast_to(np.arange(9), (2, 9)).copy()}
    got = Interpreter(dense, weights).run(feeds)["logits"]
    assert np.abs(got - c.want).max() > 1e-3


@pytest.mark.parametrize(("past", "new"), [(0, 9), (P, 1)])
def test_a_layer_reusing_the_selection_before_it(past, new):
    """Layers 1 and 2 have no indexer: their attention reads layer 0's selection, which layer 1
    hands on unchanged (a layer output that is its input); logits equal transformers'."""
    c = check_traced(SHARED, past, new)
    assert c.results["params"].total == c.params
    assert c.results["cost"].flops["matmul"] == c.flops
    np.testing.assert_allclose(c.logits, c.want, atol=1e-4, rtol=0)
    g = c.graph
    (select,) = [n.name for n in g.nodes() if n.op == "topk_select"]
    masks = sorted(n.name for n in g.nodes() if n.op == "mask_selected")
    assert len(masks) == 3 and all(g[m].inputs[1].node == select for m in masks)
    assert select.startswith("model.layers.0.")


def _weights(raw: dict) -> dict[str, np.ndarray]:
    import torch
    import transformers

    cfg = transformers.CONFIG_MAPPING[raw["model_type"]](
        **{k: v for k, v in raw.items() if k != "model_type"}
    )
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    return {k: v.detach().float().numpy() for k, v in ref.state_dict().items()}


@pytest.mark.parametrize("new", [1, 5])
def test_traced_dsa_export_equals_transformers(new, tmp_path):
    """One export on onnxruntime (TopK with k = min(3, keys)): `new` tokens after 4 cached
    ones, and all of them from an empty cache, against transformers' whole-sequence forward."""
    decode, prefill = onnx_against_transformers(DSA, tmp_path, new)
    assert decode < 1e-4, decode
    assert prefill < 1e-4, prefill


def test_the_engine_pays_k_keys_a_query_and_the_indexer_the_prefix():
    """At 64 tokens keeping 3: the attention's scores count min(3, t + 1) keys for query t
    (the engine's sparse kernel), FlopCounterMode's dense count all 64; the indexer's scores
    count the causal prefix, t + 1 keys."""
    g = traced_graph(DSA, Workload(batch=1, seq_len=64, dtype="fp32"))
    run(g, ["verify", "cost"])
    scores = next(n for n in g.nodes() if n.op == "scores" and "layers.0" in n.name)
    c = scores.meta["cost"]
    assert c.matmul_causal * 64 * 64 == c.matmul * sum(min(TOPK, t + 1) for t in range(64))
    index = [n for n in g.nodes() if "layers.0.self_attn.indexer" in n.name and n.op != "linear"]
    index = [n for n in index if n.meta["cost"].matmul]
    assert index and all(
        n.meta["cost"].matmul_causal * 64 * 64 == n.meta["cost"].matmul * 64 * 65 // 2
        for n in index
    )


def test_the_selection_keeps_its_k_past_the_probes():
    """The trace records the indexer's top-k over every key with the k it keeps, so a
    workload longer than k (the probes are shorter) keeps k, not every key."""
    g = traced_graph(dict(DSA, index_topk=16), Workload(batch=1, seq_len=40, dtype="fp32"))
    sel = next(n for n in g.nodes() if n.op == "topk_select")
    assert sel.attrs["topk"] == 16
    scores = np.random.default_rng(1).standard_normal((1, 40, 40)).astype(np.float32)
    kept = OPS["topk_select"].impl([scores], sel.attrs)
    assert kept.dtype == bool and kept.sum(-1).tolist() == [[16] * 40]
    assert (kept == (scores >= np.sort(scores, -1)[..., -16:-15])).all()


def test_verify_tokens_holds_a_selection_to_its_bound():
    """Perturbing each position: what a query reads lies within the causal bound the tokens
    pass predicts, and the selection (3 keys of up to 12, in each of two layers) leaves some of
    the bound unread; a read outside the bound still fails the check."""
    check = traced_mixing_check(DSA, "dsa", Workload(batch=1, seq_len=12, dtype="fp32"))
    assert check.selects and check.agrees
    assert (check.predicted & ~check.observed).any()
    outside = check.observed.copy()
    outside[0, 5] = True  # the first position reading the sixth
    wrong = MixingCheck(check.config, check.predicted, outside, selects=True)
    assert not wrong.agrees and wrong.differences() == [(0, 5, False, True)]
