"""transformers' models of published configs on the meta device: parameter counts to check
graphllm's against, with no weights allocated. torch and transformers are imported when called,
so that a test module importing this runs its other tests without them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from graphllm.models.config import PRESETS_DIR


def published_meta_model(preset: str) -> Any:
    """transformers' model of the preset's published config.json (its quantization_config left
    out: the parameters as the architecture has them), on the meta device; skips the test
    without torch or transformers."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text())
    d = {k: v for k, v in d.items() if not k.startswith("_") and k != "quantization_config"}
    with torch.device("meta"):
        return transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**d))
