"""DeepSeek parameter counts: exact against the published totals and transformers' models."""

import json

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.models.config import PRESETS_DIR
from graphllm.passes import run
from tests.support.meta_models import published_meta_model

# every stored tensor of the main model (V3: without the multi-token-prediction layer 61)
PUBLISHED = {"deepseek-v2-lite": 15_706_484_224, "deepseek-v3": 671_026_419_200}
# the e_score_correction_bias values transformers keeps as buffers, not parameters
BUFFERS = {"deepseek-v2-lite": 0, "deepseek-v2": 0, "deepseek-v3": 58 * 256}


def params(preset: str):
    return run(build_graph(load_config(preset), Workload(seq_len=1)), ["params"])["params"]


@pytest.mark.parametrize(("preset", "total"), PUBLISHED.items())
def test_total_matches_published(preset, total):
    assert params(preset).total == total


def test_v3_router_holds_weight_and_correction_bias():
    p = params("deepseek-v3")
    assert p.by_kind["router"] == 58 * 256 * (7168 + 1)
    assert p.by_kind["shared_experts"] == 58 * 3 * 7168 * 2048
    assert p.by_kind["mlp"] == 3 * 3 * 7168 * 18432  # the three dense first layers


def test_active_is_k_of_e_routed_experts_plus_everything_else():
    for preset, k, e in [("deepseek-v3", 8, 256), ("deepseek-v2-lite", 6, 64)]:
        p = params(preset)
        experts = p.by_kind["moe_experts"]
        assert p.active == p.total - experts + experts * k // e
    assert params("deepseek-v3").active == 37_552_297_472  # "37B activated"
    assert params("deepseek-v2").active == 21_375_800_320  # "21B activated"


@pytest.mark.parametrize("preset", sorted(BUFFERS))
def test_total_matches_transformers_meta_model(preset):
    model = published_meta_model(preset)
    hf = sum(t.numel() for t in model.parameters())
    assert params(preset).total == hf + BUFFERS[preset]
    bias = sum(b.numel() for n, b in model.named_buffers() if "correction_bias" in n)
    assert bias == BUFFERS[preset]


# DeepSeek-V3 with its multi-token-prediction layer (model.layers.61): the MTP module is the
# decoder block plus enorm, hnorm, eh_proj and its own copies of the embedding and output head
MTP_V3 = 13_463_426_304


def test_v3_with_mtp_main_model_unchanged_and_mtp_exact():
    p = run(build_graph(load_config("deepseek-v3"), Workload(seq_len=1), mtp=True), ["params"])
    p = p["params"]
    assert p.total - p.mtp == PUBLISHED["deepseek-v3"]  # 671B, as published
    assert p.mtp == MTP_V3 and p.total == 684_489_845_504
    # README_WEIGHTS.md: "11.5B unique parameters (excluding the shared 0.9B Embedding and
    # 0.9B output Head)": the block is 11.51B, eh_proj and the norms 0.10B more
    embed = 129_280 * 7168
    assert p.mtp - 2 * embed == 11_610_068_224
    assert p.by_kind["mtp_proj"] == 2 * 7168 * 7168


def test_v3_mtp_block_matches_transformers_decoder_layer():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    d = json.loads((PRESETS_DIR / "deepseek-v3.json").read_text())
    d = {k: v for k, v in d.items() if not k.startswith("_") and k != "quantization_config"}
    with torch.device("meta"):
        layer = DeepseekV3DecoderLayer(transformers.AutoConfig.for_model(**d), 61)
    block = sum(t.numel() for t in layer.state_dict().values())  # the correction bias too
    h, v = d["hidden_size"], d["vocab_size"]
    assert block + 2 * v * h + 2 * h * h + 3 * h == MTP_V3
