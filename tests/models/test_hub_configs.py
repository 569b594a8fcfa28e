"""Published config.json files, byte for byte as the Hub serves them (tests/fixtures/hub), load as
they are. A family's own tests build configs by hand or from presets that carry notes; only the
published bytes show a key the family refuses (gemma-2's legacy sliding_window_size beside
sliding_window). Every supported model_type must have such a file here."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from graphllm import Workload, build_graph, load_config
from graphllm.models.config import SUPPORTED
from graphllm.passes import run

HUB = Path(__file__).resolve().parents[1] / "fixtures" / "hub"


# repo: (model_type, num_hidden_layers, hidden_size, total parameters or None). Layers and width are
# the published files' own; the totals are the published counts the preset tests already pin
# (tests/passes/test_params*.py), for the same architecture where the fixture is a sibling repo
PUBLISHED = {
    # Llama 3.1 8B changes only the RoPE scaling of Llama 3 8B: test_params' llama3-8b
    "meta-llama/Meta-Llama-3.1-8B": ("llama", 32, 4096, 8_030_261_248),
    "meta-llama/Llama-2-7b-hf": ("llama", 32, 4096, 6_738_415_616),
    "mistralai/Mixtral-8x7B-v0.1": ("mixtral", 32, 4096, 46_702_792_704),
    # Qwen2.5-7B is Qwen2-7B's architecture (its card: 7.61B): test_params' qwen2-7b
    "Qwen/Qwen2.5-7B": ("qwen2", 28, 3584, 7_615_616_512),
    "Qwen/Qwen3-8B": ("qwen3", 36, 4096, None),
    "Qwen/Qwen3-30B-A3B": ("qwen3_moe", 48, 2048, 30_532_122_624),
    # its config also gives qkv_bias, shared_expert_intermediate_size and use_qk_norm, which
    # Qwen3MoeForCausalLM never reads (accepted at the values it builds)
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": ("qwen3_moe", 62, 6144, None),
    # the Thinking and Instruct releases share one architecture: test_params_qwen3_next's MAIN
    "Qwen/Qwen3-Next-80B-A3B-Thinking": ("qwen3_next", 48, 2048, 79_674_391_296),
    # without the MTP layer, as test_params_deepseek pins it
    "deepseek-ai/DeepSeek-V3": ("deepseek_v3", 61, 7168, 671_026_419_200),
    "moonshotai/Kimi-K2-Instruct": ("kimi_k2", 61, 7168, 1_026_408_232_448),
    "openai/gpt-oss-120b": ("gpt_oss", 36, 2880, 116_829_156_672),
    "openai/gpt-oss-20b": ("gpt_oss", 24, 2880, 20_914_757_184),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": ("nemotron_h", 52, 2688, 31_577_940_288),
    "nvidia/Nemotron-H-56B-Base-8K": ("nemotron_h", 118, 8192, None),
    # the -it release is gemma-2-9b's architecture: test_params' gemma2-9b (the Hub's index total)
    "google/gemma-2-9b-it": ("gemma2", 42, 3584, 9_241_705_984),
    # transformers' own model of the preset with these values (test_params' META_ONLY smollm3-3b;
    # keras-hub's smollm3_3b_en metadata says 3,075,100,928)
    "HuggingFaceTB/SmolLM3-3B": ("smollm3", 36, 2048, 3_075_098_624),
    # M2.7 keeps M2's shapes (its copier's commit says so): test_params_moe3's minimax-m2
    "MiniMaxAI/MiniMax-M2.7": ("minimax_m2", 62, 3072, 228_689_764_864),
    "microsoft/phi-4": ("phi3", 40, 5120, None),
    # the wrapper's text_config: gemma3_text's decoder, the vision tower not modelled
    "google/gemma-3-4b-it": ("gemma3", 34, 2560, None),
    "mistralai/Mistral-7B-v0.1": ("mistral", 32, 4096, 7_241_732_096),
    "google/gemma-7b": ("gemma", 28, 3072, None),
    "deepseek-ai/DeepSeek-V2-Lite": ("deepseek_v2", 27, 2048, 15_706_484_224),
    # the text decoder alone, as test_params_llama4's TEXT pins it (the vision tower not modelled)
    "meta-llama/Llama-4-Scout-17B-16E": ("llama4", 48, 5120, 107_769_861_120),
}

# the cards' rounded figures (billions, digits after the point) where no exact total is pinned
CARD_BILLIONS = {"Qwen/Qwen3-8B": (8.2, 1), "Qwen/Qwen3-Coder-480B-A35B-Instruct": (480, 0)}


def _fixtures() -> dict[str, Path]:
    return {str(p.parent.relative_to(HUB)): p for p in sorted(HUB.glob("*/*/config.json"))}


def _blob_id(data: bytes) -> str:
    # git's blob id, which is also the Hub's oid for a file stored without LFS
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _sources() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in (HUB / "SOURCES.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and re.fullmatch(r"[0-9a-f]{40}", cells[5]):
            rows[cells[1]] = (cells[0], cells[5])
    return rows


def _model_types(raw: dict) -> set[str]:
    # a multimodal wrapper's file also carries its text family's config
    inner = raw.get("text_config")
    return {raw["model_type"]} | ({inner["model_type"]} if isinstance(inner, dict) else set())


def test_fixtures_are_the_published_list():
    assert set(_fixtures()) == set(PUBLISHED)
    assert set(_sources()) == set(PUBLISHED)


@pytest.mark.parametrize("repo", sorted(PUBLISHED))
def test_fixture_bytes_are_the_recorded_ones(repo):
    model_type, blob = _sources()[repo]
    data = (HUB / repo / "config.json").read_bytes()
    assert _blob_id(data) == blob, f"{repo}'s config.json is no longer the bytes SOURCES.md records"
    assert json.loads(data)["model_type"] == model_type == PUBLISHED[repo][0]


# Families whose published config.json no stored copy here holds verbatim (SOURCES.md lists where
# it was looked for); each still loads the config its preset was written from. The set must shrink
# as fixtures arrive, and a family added without a fixture fails below.
NO_VERBATIM_COPY_YET = {"cohere", "cohere2", "glm4_moe", "granite", "olmo2", "qwen2_moe"}


def test_every_supported_model_type_has_a_fixture():
    covered = set()
    for path in _fixtures().values():
        covered |= _model_types(json.loads(path.read_bytes()))
    missing = set(SUPPORTED) - covered
    assert missing == NO_VERBATIM_COPY_YET, (
        f"no published config.json under tests/fixtures/hub for "
        f"{sorted(missing - NO_VERBATIM_COPY_YET)}; covered now, so off the list: "
        f"{sorted(NO_VERBATIM_COPY_YET - missing)}"
    )


@pytest.mark.parametrize("repo", sorted(PUBLISHED))
def test_published_config_loads_as_served(repo):
    model_type, layers, hidden, _ = PUBLISHED[repo]
    raw = json.loads((HUB / repo / "config.json").read_bytes())
    text = raw.get("text_config", raw)
    assert (raw["model_type"], text["num_hidden_layers"], text["hidden_size"]) == (
        model_type,
        layers,
        hidden,
    )
    c = load_config(HUB / repo / "config.json")
    assert (c.num_hidden_layers, c.hidden_size) == (layers, hidden)


@pytest.mark.parametrize(
    "repo", sorted(r for r, v in PUBLISHED.items() if v[3] or r in CARD_BILLIONS)
)
def test_published_parameter_count(repo):
    c = load_config(HUB / repo / "config.json")
    total = run(build_graph(c, Workload(seq_len=4)), ["params"])["params"].total
    if PUBLISHED[repo][3] is not None:
        assert total == PUBLISHED[repo][3]
    else:
        billions, digits = CARD_BILLIONS[repo]
        assert round(total / 1e9, digits) == billions
