"""issue 19: Nemotron-H-8B and Nemotron-3-Nano-30B-A3B, parameters exact against transformers'
meta model (NemotronHForCausalLM on the meta device, plus the e_score_correction_bias values it
keeps as buffers: one per expert per MoE layer) and NVIDIA's published figures: Nemotron-3-Nano
31.6B total and 3.2B active without the embedding (3.5B with it; its model card and the
technical report's "31.6B total / 3.2B active"), Nemotron-H-8B "8B"."""

import json

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.models.config import PRESETS_DIR
from graphllm.passes import run

TOTAL = {"nemotron-h-8b": 8_100_852_736, "nemotron-3-nano-30b-a3b": 31_577_940_288}
ACTIVE = {"nemotron-h-8b": 8_100_852_736, "nemotron-3-nano-30b-a3b": 3_580_076_352}


def _params(preset: str):
    return run(build_graph(load_config(preset), Workload(seq_len=1)), ["params"])["params"]


@pytest.mark.parametrize("preset", sorted(TOTAL))
def test_total_and_active(preset):
    p = _params(preset)
    assert (p.total, p.active) == (TOTAL[preset], ACTIVE[preset])
    card = {"nemotron-h-8b": (8.1, 7.6), "nemotron-3-nano-30b-a3b": (31.6, 3.2)}[preset]
    assert (round(p.total / 1e9, 1), round(p.active_without_embedding / 1e9, 1)) == card


def test_nano_by_kind():
    p = _params("nemotron-3-nano-30b-a3b")
    # 23 Mamba2 mixers and 6 attention layers (the token mixers), 23 MoE layers of 128 experts
    # of 2 * 2688 * 1856 and a shared 2 * 2688 * 3712, no dense MLP layer
    assert p.by_kind["moe_experts"] == 23 * 128 * 2 * 2688 * 1856
    assert p.by_kind["shared_experts"] == 23 * 2 * 2688 * 3712
    assert p.by_kind["router"] == 23 * (128 * 2688 + 128)
    assert p.by_kind["mlp"] == 0
    inner, conv = 64 * 64, 64 * 64 + 2 * 8 * 128
    mamba = 2688 * (inner + conv + 64) + conv * 4 + conv + 3 * 64 + inner * 2688
    attention = 2688 * 32 * 128 * 2 + 2 * 2688 * 2 * 128
    # the Mamba2 mixers count as the recurrent mixers' weights, apart from attention's
    assert (p.by_kind["linear_attention"], p.by_kind["attention"]) == (23 * mamba, 6 * attention)
    assert p.by_kind["norms"] == 52 * 2688 + 23 * inner + 2688


@pytest.mark.parametrize("preset", sorted(TOTAL))
def test_total_matches_transformers_meta_model(preset):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text())
    drop = ("model_type", "architectures", "auto_map", "transformers_version", "torch_dtype")
    d = {k: v for k, v in d.items() if not k.startswith("_") and k not in drop}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model("nemotron_h", **d)
        )
    params = sum(t.numel() for t in model.parameters())
    bias = sum(b.numel() for n, b in model.named_buffers() if "correction_bias" in n)
    assert params + bias == TOTAL[preset]


@pytest.mark.parametrize(
    ("alias", "preset"),
    [
        ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nemotron-3-nano-30b-a3b"),
        ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nemotron-3-nano-30b-a3b"),
        ("Nemotron-H-8B-Base-8K", "nemotron-h-8b"),
        ("nvidia/Nemotron-H-8B-Base-8K", "nemotron-h-8b"),
    ],
)
def test_hub_names_load_the_presets(alias, preset):
    assert load_config(alias) == load_config(preset)
