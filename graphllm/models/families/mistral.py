"""Mistral (transformers' mistral): Llama's block with a sliding window in every layer."""

from __future__ import annotations

from graphllm.models.family import Family, every_layer_window
from graphllm.models.fields import Spec, common_fields, nonneg_int, pos_int

MISTRAL = Family(
    common_fields(
        max_position_embeddings=Spec(pos_int, 131072),
        sliding_window=Spec(nonneg_int, 4096, nullable=True),
    ),
    derive=lambda v: {},
    windows=every_layer_window,
    genai_type="mistral",
)


FAMILIES = {
    "mistral": MISTRAL,
}
