"""issue 18: Kimi-K2, GLM-4.5, GLM-4.5-Air and MiniMax-M2 parameter counts, exact against the
published checkpoint totals and transformers' meta models, and each vendor's active figure under
its own convention.

Published totals, every stored tensor (main model; GLM's with its MTP layer as the checkpoint
holds it):
- Kimi-K2-Instruct 1,026,408,232,448: the paramCount of Fireworks' model listing (copied in
  public GitHub model tables) and independent recounts of the checkpoint's shard headers;
- GLM-4.5 352,797,829,024 (358,337,791,296 with the MTP layer 92) and GLM-4.5-Air
  106,852,251,264 (110,468,824,832 with layer 46): public parameter calculators' "base" and
  "includes the Hugging Face mtp block" figures and the Hub's safetensors counts they quote;
- MiniMax-M2 228,689,764,864: llama.cpp's model_n_params for MiniMax-M2 (its checkpoint holds no
  MTP weights).
"""

import json

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.models.config import PRESETS_DIR
from graphllm.passes import run

PUBLISHED = {
    "kimi-k2": 1_026_408_232_448,
    "glm4.5": 352_797_829_024,
    "glm4.5-air": 106_852_251_264,
    "minimax-m2": 228_689_764_864,
}
WITH_MTP = {"glm4.5": 358_337_791_296, "glm4.5-air": 110_468_824_832}
# the e_score_correction_bias values transformers keeps as buffers: one per expert per MoE layer
BUFFERS = {"kimi-k2": 60 * 384, "glm4.5": 89 * 160, "glm4.5-air": 45 * 128, "minimax-m2": 62 * 256}


def params(preset: str, mtp: bool = False):
    graph = build_graph(load_config(preset), Workload(seq_len=1), mtp=mtp)
    return run(graph, ["params"])["params"]


@pytest.mark.parametrize(("preset", "total"), PUBLISHED.items())
def test_total_matches_published(preset, total):
    assert params(preset).total == total


@pytest.mark.parametrize(("preset", "total"), WITH_MTP.items())
def test_glm_with_its_mtp_layer_matches_the_checkpoint(preset, total):
    p = params(preset, mtp=True)
    assert p.total == total and p.total - p.mtp == PUBLISHED[preset]


def test_each_vendors_active_figure_under_its_own_convention():
    # Moonshot: "32 billion activated parameters", every weight a token reads (as DeepSeek's
    # "37B activated" is read in test_params_deepseek.py)
    kimi = params("kimi-k2")
    assert kimi.active == 32_861_500_928 and kimi.active // 10**9 == 32
    # Z.ai: GLM-4.5 "355B total, 32B active", GLM-4.5-Air "106B total, 12B active", without the
    # embedding table and the output head
    glm, air = params("glm4.5"), params("glm4.5-air")
    assert glm.active_without_embedding_and_head == 32_080_373_664
    assert round(glm.active_without_embedding_and_head / 1e9) == 32
    assert air.active_without_embedding_and_head == 12_182_615_680
    assert round(air.active_without_embedding_and_head / 1e9) == 12
    assert round(air.active / 1e9) == 13  # the embedding and head are 1.24B more
    # MiniMax: "10B activated", under GLM's convention too (11.03B with them)
    mm = params("minimax-m2")
    assert round(mm.active_without_embedding_and_head / 1e9) == 10
    assert round(mm.active / 1e9) == 11


def test_counts_without_embedding_and_head_subtract_exactly_those_tables():
    p = params("glm4.5-air")
    embed = 151_552 * 4096
    assert p.active_without_embedding == p.active - embed
    assert p.active_without_embedding_and_head == p.active - 2 * embed
    tied = params("gemma-2b")  # the tied table is the head too: it stays without embedding
    assert tied.active_without_embedding == tied.active
    assert tied.active_without_embedding_and_head == tied.active - tied.by_kind["embedding"]


def _hf_dict(preset: str) -> dict:
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text())
    d = {k: v for k, v in d.items() if not k.startswith("_") and k != "quantization_config"}
    if d["model_type"] == "kimi_k2":  # transformers has no kimi_k2: DeepseekV3 from its fields
        d = {k: v for k, v in d.items() if k != "auto_map"} | {"model_type": "deepseek_v3"}
    return d


@pytest.mark.parametrize("preset", sorted(PUBLISHED))
def test_total_matches_transformers_meta_model(preset):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**_hf_dict(preset))
        )
    hf = sum(t.numel() for t in model.parameters())
    bias = sum(b.numel() for n, b in model.named_buffers() if "correction_bias" in n)
    assert bias == BUFFERS[preset]
    assert params(preset).total == hf + bias


def test_glm_mtp_block_matches_transformers_decoder_layer():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer

    d = _hf_dict("glm4.5")
    with torch.device("meta"):
        layer = Glm4MoeDecoderLayer(transformers.AutoConfig.for_model(**d), 92)
    block = sum(t.numel() for t in layer.state_dict().values())  # the correction bias too
    h, v = d["hidden_size"], d["vocab_size"]
    # enorm, hnorm, eh_proj, shared_head.norm and the layer's own embedding and head copies
    assert block + 2 * v * h + 2 * h * h + 3 * h == params("glm4.5", mtp=True).mtp
