"""A field given under two spellings (a family's aliases: transformers' attribute_map, a published
file's legacy name): accepted when the two agree, refused naming both when they do not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from graphllm.errors import ConfigError
from graphllm.models.config import config_from_dict, load_config
from graphllm.models.families import FAMILY_TABLE

# google/gemma-2-9b-it's config.json as the Hub publishes it: sliding_window and the original
# release's sliding_window_size, both 4096
GEMMA2_9B = Path(__file__).resolve().parents[1] / "fixtures/hub/google/gemma-2-9b-it/config.json"


def _gemma2() -> dict:
    return json.loads(GEMMA2_9B.read_text())


def test_gemma2_published_config_with_both_spellings_loads() -> None:
    d = _gemma2()
    assert d["sliding_window"] == d["sliding_window_size"] == 4096  # the file as published
    cfg = load_config(GEMMA2_9B)
    assert cfg.model_type == "gemma2"
    assert cfg.sliding_window == 4096
    assert cfg.layer_types[:2] == ("sliding_attention", "full_attention")
    # the legacy spelling alone sets the window as well
    alone = {k: v for k, v in d.items() if k != "sliding_window"} | {"sliding_window_size": 1024}
    assert config_from_dict(alone, "x").sliding_window == 1024


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"sliding_window_size": 2048},
            "sliding_window_size=2048 disagrees with sliding_window=4096",
        ),
        # null switches the window off: it disagrees with a window under the other name
        ({"sliding_window": None}, "sliding_window_size=4096 disagrees with sliding_window=null"),
        (
            {"sliding_window_size": None},
            "sliding_window_size=null disagrees with sliding_window=4096",
        ),
    ],
)
def test_gemma2_disagreeing_spellings_are_refused(change: dict, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        config_from_dict(_gemma2() | change, "x")
    assert str(e.value) == message


def test_a_null_beside_a_value_of_a_non_nullable_field_is_not_given() -> None:
    # num_experts is Mixtral's alias of num_local_experts; null there means "not given"
    d = json.loads((GEMMA2_9B.parents[2] / "mistralai/Mixtral-8x7B-v0.1/config.json").read_text())
    assert config_from_dict(d | {"num_experts": None}, "x").num_experts == 8
    assert config_from_dict(d | {"num_experts": 8}, "x").num_experts == 8
    with pytest.raises(ConfigError, match="num_experts=4 disagrees with num_local_experts=8"):
        config_from_dict(d | {"num_experts": 4}, "x")


def test_every_alias_names_a_field_of_its_family() -> None:
    for mt, fam in FAMILY_TABLE.items():
        for alias, name in fam.aliases.items():
            assert name in fam.fields, (mt, alias)
            assert alias not in fam.fields, (mt, alias)  # else a spelling would shadow a field
