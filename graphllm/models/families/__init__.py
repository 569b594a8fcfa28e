"""The model families graphllm reads, one module each, and the one registry built from them.

Each module declares `FAMILIES = {model_type: Family(...)}` and, where the family has a
multimodal checkpoint that loads as its text decoder, `MULTIMODAL = {model_type: Multimodal(...)}`.
Adding a family is adding a module here and naming it in `_MODULES`; everything that lists the
families (the model_types a config may name, the export's default lowerings) reads `FAMILY_TABLE`.
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


# model_type -> its Family, in the order of _MODULES (the order "supported: llama, ..." lists)
FAMILY_TABLE: dict[str, Family] = _registry("FAMILIES")
# model_type of a multimodal model -> the text decoder it loads as
MULTIMODAL: dict[str, Multimodal] = _registry("MULTIMODAL")

__all__ = ["FAMILY_TABLE", "MULTIMODAL"]
