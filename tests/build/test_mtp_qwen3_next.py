"""issue 19: Qwen3-Next's multi-token-prediction layer through the one MTP mechanism
(build_graph(..., mtp=True)), with its checkpoint's layout: mtp.pre_fc_norm_embedding,
mtp.pre_fc_norm_hidden, mtp.fc over [embedding; hidden], mtp.layers.0 (a full-attention layer
with the MoE), mtp.norm, and the main model's embed_tokens and lm_head, as vLLM's
qwen3_next_mtp.py loads and runs it. transformers has no MTP module for Qwen3-Next, so the
reference is tests/support/mtp_qwen3_next.py's module assembled from transformers'
Qwen3NextDecoderLayer and Qwen3NextRMSNorm: logits of the numpy interpreter and of the ONNX
export on a tiny random checkpoint (a prefill longer than a chunk, then cached steps carrying the
states and the MTP layer's own KV cache), and the MTP part's matmul FLOPs under FlopCounterMode.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import graphllm  # noqa: E402
from graphllm.errors import ConfigError  # noqa: E402
from graphllm.passes import run  # noqa: E402
from tests.support.flop_counter import DEEPSEEK_WORKLOADS, qwen3_next_models  # noqa: E402
from tests.support.mtp import (  # noqa: E402
    assert_mtp_export_matches,
    assert_mtp_matches_reference,
    assert_mtp_tokens_move_only_later,
    counted_mtp_flops,
    draw_ids,
    mtp_matmul_flops,
    mtp_mixing,
)
from tests.support.mtp_qwen3_next import Qwen3NextMTPReference, TinyQwen3NextMTP  # noqa: E402
from tests.support.tiny_qwen3_next import LONG, SMALL  # noqa: E402

ATOL, STEPS = 1e-4, 3
VOCAB = SMALL["vocab_size"]


@pytest.fixture(scope="module")
def next_mtp(tiny_qwen3_next):
    base = tiny_qwen3_next("qwen3_next")
    assert base.cfg.num_nextn_predict_layers == 1 and base.cfg.mtp_moe_layers == (True,)
    return TinyQwen3NextMTP(base)


def test_mtp_logits_equal_the_reference_prefill_and_cached_steps(next_mtp):
    assert_mtp_matches_reference(next_mtp, VOCAB, LONG, STEPS, ATOL)


def test_mtp_tokens_move_only_their_own_and_later_positions(next_mtp):
    """Perturbing one position of either token input changes the MTP logits at that position
    and after it only; the MTP block mixes by its attention, the main model also by its conv
    and recurrences, as the tokens pass finds."""
    seq = 8
    assert_mtp_tokens_move_only_later(
        next_mtp, draw_ids(VOCAB, 3, seq), draw_ids(VOCAB, 4, seq), VOCAB
    )
    g, mixing = mtp_mixing(next_mtp.base.cfg, seq)
    assert any(n.startswith("mtp.layers.0.self_attn.") for n in mixing)
    assert {g[n].op for n in mixing if n.startswith("mtp.")} == {"scores", "softmax", "pv"}


def test_mtp_export_equals_the_interpreter_and_the_reference(next_mtp, tmp_path):
    assert_mtp_export_matches(next_mtp, tmp_path / "qwen3-next-mtp.onnx", VOCAB, LONG, STEPS, ATOL)


def test_mtp_follows_the_main_model_shares_its_head_and_is_counted_apart():
    cfg = graphllm.load_config("qwen3-next-80b-a3b")
    g = graphllm.build_graph(cfg, graphllm.Workload(seq_len=4), mtp=True)
    assert g["mtp.pre_fc_norm_hidden"].inputs[0].node == "model.norm"
    assert g["mtp.fc_concat"].inputs[0].node == "mtp.pre_fc_norm_embedding"  # [embedding; hidden]
    assert g["mtp.lm_head"].inputs[1].node == "lm_head.weight"
    assert g["mtp.embed_tokens"].inputs[1].node == "model.embed_tokens.weight"
    assert "mtp.layers.0.self_attn.q_proj.weight" in g and "mtp.layers.0.mlp.gate.weight" in g
    assert "past_key_values.48.key" not in g and "present.48.key" in g.outputs
    p = run(g, ["params"])["params"]
    # Qwen/Qwen3-Next-80B-A3B-Instruct's checkpoint total; the main model is the meta model's
    assert (p.total, p.mtp) == (81_324_862_720, 1_650_471_424)
    assert p.total - p.mtp == 79_674_391_296


def test_mtp_is_one_layer():
    cfg = graphllm.load_config("qwen3-next-80b-a3b")
    from dataclasses import replace

    deeper = replace(cfg, num_nextn_predict_layers=2, mtp_moe_layers=(True, True))
    with pytest.raises(ConfigError, match=r"one MTP layer \(mtp\.layers\.0\), not 2"):
        graphllm.build_graph(deeper, mtp=True)


# -- FLOPs: the published config cut to 4 layers (three linear, one attention) -----------------


@pytest.mark.parametrize("workload", DEEPSEEK_WORKLOADS.values(), ids=DEEPSEEK_WORKLOADS.keys())
def test_mtp_matmul_flops_equal_flop_counter(workload):
    cfg, model = qwen3_next_models(4)

    def make_ref():
        return Qwen3NextMTPReference(model.config, model.model.embed_tokens, model.lm_head)

    assert mtp_matmul_flops(cfg, workload) == counted_mtp_flops(model, make_ref, workload) > 0
