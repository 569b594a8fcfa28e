"""issue 18: GLM-4.5's multi-token-prediction layer through the one MTP mechanism (build_graph(...,
mtp=True)), with GLM's checkpoint layout: layer L = num_hidden_layers (92 for GLM-4.5, 46 for
GLM-4.5-Air) holds enorm, hnorm, eh_proj, shared_head.norm, shared_head.head, its own
embed_tokens and a Glm4MoeDecoderLayer (MoE), as vLLM's glm4_moe_mtp.py and SGLang's
glm4_moe_nextn.py load and run it. transformers' glm4_moe skips those tensors
(_keys_to_ignore_on_load_unexpected), so the reference is tests/support/mtp.py's module assembled
from transformers' Glm4MoeDecoderLayer and Glm4MoeRMSNorm: logits of the numpy interpreter and of
the ONNX export on a tiny random checkpoint (prefill and cached steps), and the MTP part's matmul
FLOPs under FlopCounterMode on the meta device.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformers.models.glm4_moe import modeling_glm4_moe as hf_glm  # noqa: E402

import graphllm  # noqa: E402
from graphllm.models.config import PRESETS_DIR, config_from_dict  # noqa: E402
from graphllm.passes import run  # noqa: E402
from tests.support.flop_counter import DEEPSEEK_WORKLOADS  # noqa: E402
from tests.support.mtp import (  # noqa: E402
    MTPReference,
    TinyMTP,
    assert_mtp_export_matches,
    assert_mtp_matches_reference,
    counted_mtp_flops,
    mtp_matmul_flops,
)
from tests.support.tiny_models import SEQ, SMALL, TinyModel  # noqa: E402

ATOL, STEPS = 1e-4, 3
GLM = (hf_glm.Glm4MoeDecoderLayer, hf_glm.Glm4MoeRMSNorm)


@pytest.fixture(scope="module")
def glm_mtp(tmp_path_factory):
    base = TinyModel("glm4_moe", tmp_path_factory.mktemp("glm-mtp"))
    assert base.cfg.num_nextn_predict_layers == 1 and base.cfg.mtp_moe_layers == (True,)
    return TinyMTP(base, *GLM)


def test_glm_mtp_logits_equal_the_reference_prefill_and_cached_steps(glm_mtp):
    assert_mtp_matches_reference(glm_mtp, SMALL["vocab_size"], SEQ, STEPS, ATOL)


def test_glm_mtp_export_equals_the_interpreter_and_the_reference(glm_mtp, tmp_path):
    assert_mtp_export_matches(glm_mtp, tmp_path / "glm-mtp.onnx", SMALL["vocab_size"], SEQ)


# -- FLOPs: GLM-4.5 cut to 2 layers (a dense one, a MoE one); the MTP layer is layer 2 --------


def _glm45_two_layers():
    d = json.loads((PRESETS_DIR / "glm4.5.json").read_text())
    d = {k: v for k, v in d.items() if not k.startswith("_")}
    d |= {"num_hidden_layers": 2, "first_k_dense_replace": 1}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**d),
            attn_implementation="sdpa",
            experts_implementation="batched_mm",
        )
    return config_from_dict(dict(d), "glm4.5"), model.eval()


@pytest.mark.parametrize("workload", DEEPSEEK_WORKLOADS.values(), ids=DEEPSEEK_WORKLOADS.keys())
def test_glm_mtp_matmul_flops_equal_flop_counter(workload):
    cfg, model = _glm45_two_layers()
    layer = model.config.num_hidden_layers
    counted = counted_mtp_flops(model, lambda: MTPReference(model.config, layer, *GLM), workload)
    assert mtp_matmul_flops(cfg, workload) == counted > 0


def test_glm_mtp_follows_the_main_model_and_is_counted_apart():
    g = graphllm.build_graph(
        graphllm.load_config("glm4.5-air"), graphllm.Workload(seq_len=4), mtp=True
    )
    assert [m["prefix"] for m in g.meta["mtp"]] == ["model.layers.46"]
    assert g["model.layers.46.hnorm"].inputs[0].node == "model.norm"
    assert "model.layers.46.mlp.gate.e_score_correction_bias" in g  # the layer is MoE
    p = run(g, ["params"])["params"]
    assert p.total - p.mtp == 106_852_251_264  # the main model, counted apart
