"""Parameter counts: exact against published totals and against transformers' own models."""

import json

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.models.config import PRESETS_DIR
from graphllm.passes import run

# totals as published on the models' cards / by their authors (every stored tensor, a tied head once)
PUBLISHED = {
    "llama2-7b": 6_738_415_616,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3.1-405b": 405_853_388_800,
    "llama3.2-1b": 1_235_814_400,
    "mistral-7b": 7_241_732_096,
    "mixtral-8x7b": 46_702_792_704,
    "mixtral-8x22b": 140_620_634_112,
    "qwen2-7b": 7_615_616_512,
    "qwen1.5-moe-a2.7b": 14_315_784_192,
    "qwen3-30b-a3b": 30_532_122_624,
    "gemma-2b": 2_506_172_416,
    "phi3-mini": 3_821_079_552,
    # the cards say 3.8B for both; these exact totals are transformers' meta models' (below)
    "phi3.5-mini": 3_821_079_552,
    "phi4-mini": 3_836_021_760,  # tied head, 200064-token vocabulary, 8 KV heads
    # the checkpoint's safetensors total, tied head once
    "granite-3.3-8b": 8_170_864_640,
    # issue 16. OLMo 2 7B: the card gives 7B, the Hub's safetensors index 7.30B; this exact sum
    # is also transformers' meta model's (test_total_matches_transformers_meta_model)
    "olmo2-7b": 7_298_617_344,
    # Command-R v01: the card gives 35B; the exact sum (a tied head) is transformers' meta model's
    "command-r-35b": 34_980_831_232,
    # Command R7B: the Hub's safetensors index 8.03B (a tied head)
    "command-r7b": 8_028_033_024,
    # Gemma 2 9B: the Hub's safetensors index total (a tied head, four norms per block)
    "gemma2-9b": 9_241_705_984,
    # Gemma 3 1B: keras-hub's gemma3_1b / gemma3_instruct_1b preset metadata
    # (keras-team/keras-hub, keras_hub/src/models/gemma3/gemma3_presets.py), a tied head
    "gemma3-1b": 999_885_952,
}
# presets without a published exact count that holds every stored tensor: transformers' own
# model only (keras-hub's smollm3_3b_en says 3,075,100,928, 2,304 = 36 x 64 above the
# checkpoint's tensors, which transformers' SmolLM3-3B holds). Gemma 3 27B: keras-hub's
# gemma3_27b_text says 27,009,002,240, 64 x 5376 below the 262,208-row embedding the Hub's
# text_config (and transformers' model) holds
META_ONLY = ["smollm3-3b", "gemma3-27b"]
# active per token, as the authors state them (rounded in their names: A2.7B, A3B, 12.9B)
ACTIVE_ROUNDED = {"mixtral-8x7b": 12.9e9, "qwen1.5-moe-a2.7b": 2.7e9, "qwen3-30b-a3b": 3.3e9}


def params(preset: str):
    return run(build_graph(load_config(preset), Workload(seq_len=1)), ["params"])["params"]


@pytest.mark.parametrize(("preset", "total"), PUBLISHED.items())
def test_total_matches_published(preset, total):
    p = params(preset)
    assert p.total == total
    assert sum(p.by_kind.values()) == total


@pytest.mark.parametrize(("preset", "active"), ACTIVE_ROUNDED.items())
def test_moe_active_matches_published_rounding(preset, active):
    p = params(preset)
    assert abs(p.active - active) / active < 0.02
    assert p.active < p.total


def test_active_is_k_of_e_experts_plus_everything_else():
    cfg = load_config("mixtral-8x7b")
    p = params("mixtral-8x7b")
    experts = p.by_kind["moe_experts"]
    assert p.active == p.total - experts + experts * cfg.num_experts_per_tok // cfg.num_experts
    assert p.active == 12_879_925_248


def test_tied_head_counted_once_and_dense_active_equals_total():
    p = params("llama3.2-1b")
    assert p.by_kind["lm_head"] == 0 and p.by_kind["embedding"] == 128256 * 2048
    assert p.active == p.total


def test_shared_expert_gate_counts_as_router():
    p = params("qwen1.5-moe-a2.7b")
    # per layer: router 60 x 2048, shared-expert gate 1 x 2048
    assert p.by_kind["router"] == 24 * (60 + 1) * 2048
    assert p.by_kind["shared_experts"] == 24 * 3 * 2048 * 5632


@pytest.mark.parametrize("preset", sorted([*PUBLISHED, *META_ONLY]))
def test_total_matches_transformers_meta_model(preset):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = PRESETS_DIR / f"{preset}.json"
    d = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    hf = transformers.AutoConfig.for_model(**d)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    tensors = dict(model.named_parameters())
    if load_config(preset).text_decoder_of:  # Gemma 3 27B: its text decoder, not the vision
        tensors = {n: t for n, t in tensors.items() if "language_model" in n or "lm_head" in n}
        assert len(tensors) < len(dict(model.named_parameters()))
    assert params(preset).total == sum(t.numel() for t in tensors.values())


def test_llama4_dense_scout_attention_matches_transformers_meta_model():
    # issue 16: Llama-4-Scout's text_config with no MoE layer (the MoE side is issue 18): the
    # dense FFN intermediate_size_mlp wide under feed_forward, the L2 QK-norm without weights;
    # no published dense Llama 4 exists, so transformers' model is the count
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from graphllm.models.config import config_from_dict
    from tests.support.llama4_configs import SCOUT_TEXT

    d = {**SCOUT_TEXT, "moe_layers": [], "num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0]}
    cfg = config_from_dict(d, "scout-dense")
    # transformers 5's strict config takes the published 4 only as the bool it means
    hf = transformers.AutoConfig.for_model(**{**d, "attn_temperature_tuning": True})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf)
    graph = build_graph(cfg, Workload(seq_len=1))
    names = {n.name for n in graph.nodes() if n.op == "param"}
    assert names == {k for k, _ in model.named_parameters()}  # feed_forward.*, no qk_norm weight
    p = run(graph, ["params"])["params"]
    assert p.total == sum(t.numel() for t in model.parameters()) == 3_327_308_800
