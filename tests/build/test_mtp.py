"""DeepSeek-V3's multi-token-prediction module (build_graph(..., mtp=True)) against a reference
assembled in tests/support/mtp.py from transformers' own DeepseekV3 modules (DeepseekV3DecoderLayer,
DeepseekV3RMSNorm, nn.Embedding, nn.Linear) wired as vLLM's deepseek_mtp.py and SGLang's
deepseek_nextn.py run the published weights: logits of the numpy interpreter on a tiny random
checkpoint (prefill and cached decode steps), and the cost pass's matmul FLOPs under
FlopCounterMode on the meta device.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import graphllm  # noqa: E402
from graphllm.models.config import config_from_dict  # noqa: E402
from graphllm.passes import run  # noqa: E402
from tests.support.flop_counter import (  # noqa: E402
    DEEPSEEK_WORKLOADS,
    deepseek_config_dict,
    deepseek_models,
)
from tests.support.mtp import (  # noqa: E402
    MTPReference,
    assert_mtp_matches_reference,
    assert_mtp_tokens_move_only_later,
    counted_mtp_flops,
    draw_ids,
    mtp_matmul_flops,
    mtp_mixing,
)
from tests.support.tiny_deepseek import SEQ, SMALL  # noqa: E402

ATOL, STEPS = 1e-4, 3
VOCAB = SMALL["vocab_size"]


@pytest.mark.parametrize("mla", ["naive", "absorbed"])
def test_mtp_logits_equal_the_reference_prefill_and_cached_steps(tiny_mtp, mla):
    assert_mtp_matches_reference(tiny_mtp, VOCAB, SEQ, STEPS, ATOL, mla=mla)


def test_mtp_tokens_move_only_their_own_and_later_positions(tiny_mtp):
    """Perturbing one position of either token input changes the MTP logits at that position
    and after it only (causal attention is the only mixing, also in the MTP block)."""
    assert_mtp_tokens_move_only_later(
        tiny_mtp, draw_ids(VOCAB, 3, SEQ), draw_ids(VOCAB, 4, SEQ), VOCAB
    )
    g, mixing = mtp_mixing(tiny_mtp.base.cfg, SEQ)
    assert {g[n].op for n in mixing} == {"scores", "softmax", "pv"}
    assert any(n.startswith(f"model.layers.{tiny_mtp.layer}.self_attn.core") for n in mixing)


# -- FLOPs: the MTP part of the cost pass == FlopCounterMode on the reference, meta device ----
# (the main model's DeepSeek FLOP parity workloads: prefill, last-position logits, decode, extend)


def _mtp_matmul(workload: dict) -> int:
    cfg, _ = deepseek_models("deepseek-v3")  # cut to 2 layers; the MTP layer is layer 2
    return mtp_matmul_flops(cfg, workload)


def _counted(workload: dict) -> int:
    _, model = deepseek_models("deepseek-v3")
    layer = model.config.num_hidden_layers
    return counted_mtp_flops(model, lambda: MTPReference(model.config, layer), workload)


@pytest.mark.parametrize("workload", DEEPSEEK_WORKLOADS.values(), ids=DEEPSEEK_WORKLOADS.keys())
def test_mtp_matmul_flops_equal_flop_counter(workload):
    assert _mtp_matmul(workload) == _counted(workload) > 0


def test_a_checkpoint_without_the_mtp_tensors_is_one_line(tiny_deepseek, tmp_path):
    from click.testing import CliRunner

    from graphllm.cli import main

    base = tiny_deepseek("v3-noaux")  # transformers saves no MTP layer
    out = tmp_path / "m.onnx"
    r = CliRunner().invoke(main, ["export", "--weights", str(base.folder), "--mtp", "-o", str(out)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert "has no tensor model.layers.3." in r.stderr and not out.exists()


def test_two_mtp_depths_chain_each_on_the_block_output_before_it():
    d = {**deepseek_config_dict("deepseek-v3"), "num_nextn_predict_layers": 2}  # main layers 0-1
    g = graphllm.build_graph(config_from_dict(d, "v3-mtp2"), graphllm.Workload(seq_len=4), mtp=True)
    assert [m["depth"] for m in g.meta["mtp"]] == [1, 2]
    assert g["model.layers.2.hnorm"].inputs[0].node == "model.norm"  # depth 1: the main model's
    assert g["model.layers.3.hnorm"].inputs[0].node == "model.layers.2.mlp_residual"  # depth 2
    assert {"mtp.1.logits", "mtp.2.logits"} <= set(g.outputs)
    p = run(g, ["params"])["params"]
    one = p.mtp // 2
    assert (
        p.mtp == 2 * one
        and one
        == run(
            graphllm.build_graph(
                config_from_dict({**d, "num_nextn_predict_layers": 1}, "v3-mtp1"),
                graphllm.Workload(seq_len=4),
                mtp=True,
            ),
            ["params"],
        )["params"].mtp
    )
