"""The model families graphllm reads, one module each, and the one registry built from them.

Each module declares `FAMILIES = {model_type: Family(...)}` and, where the family has a
multimodal checkpoint that loads as its text decoder, `MULTIMODAL = {model_type: Multimodal(...)}`.
Adding a family is adding a module here and naming it in `_MODULES`.
"""

from __future__ import annotations

from graphllm.models.families import (
    cohere,
    deepseek,
    gemma,
    gemma2,
    gemma3,
    glm4_moe,
    gpt_oss,
    granite,
    llama,
    llama4,
    minimax_m2,
    mistral,
    mixtral,
    nemotron_h,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3_next,
    smollm3,
)
from graphllm.models.family import Family, Multimodal
from graphllm.models.model_config import FAMILIES

_MODULES = (
    llama, mistral, mixtral, qwen2, qwen3, gemma, deepseek, phi3, granite, smollm3, olmo2, cohere,
    gemma2, gemma3, llama4, glm4_moe, minimax_m2, gpt_oss, qwen3_next, nemotron_h,
)  # fmt: skip


def _registry(attr: str) -> dict:
    """Every module's `attr` merged; a model_type two modules declare is a mistake."""
    out: dict = {}
    for module in _MODULES:
        for mt, entry in getattr(module, attr, {}).items():
            if mt in out:
                raise ValueError(f"model_type {mt!r} is declared twice ({module.__name__})")
            out[mt] = entry
    return out


def _in_order(table: dict[str, Family], order: tuple[str, ...]) -> dict[str, Family]:
    # ModelConfig's FAMILIES is the order the messages list them in ("supported: llama, ...")
    if set(table) != set(order):
        raise ValueError(f"families {sorted(set(table) ^ set(order))} in one list only")
    return {mt: table[mt] for mt in order}


# model_type -> its Family, in the order of model_config.FAMILIES
FAMILY_TABLE: dict[str, Family] = _in_order(_registry("FAMILIES"), FAMILIES)
# model_type of a multimodal model -> the text decoder it loads as
MULTIMODAL: dict[str, Multimodal] = _registry("MULTIMODAL")
# model_type of a multimodal model -> the checkpoint prefixes of its parts graphllm leaves unread
MULTIMODAL_UNUSED: dict[str, tuple[str, ...]] = {mt: w.unused for mt, w in MULTIMODAL.items()}

__all__ = ["FAMILY_TABLE", "MULTIMODAL", "MULTIMODAL_UNUSED"]
