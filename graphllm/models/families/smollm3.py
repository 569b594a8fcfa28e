"""SmolLM3 (transformers' smollm3: SmolLM3Config): Llama's block with NoPE layers."""

from __future__ import annotations

from graphllm.errors import ConfigError
from graphllm.models.family import FULL, SLIDING, Family, active_window, attention_bias
from graphllm.models.fields import (
    Spec,
    common_fields,
    flag,
    int_list,
    malformed,
    nonneg_int,
    pos_int,
)


def smollm3_rope_layers(v: dict) -> tuple[bool, ...]:
    """Per layer whether it rotates q and k, as SmolLM3Config says: no_rope_layers[i] is 1 for
    a RoPE layer and 0 for a NoPE one (at least one entry a layer; transformers reads the first
    num_hidden_layers), else every no_rope_layer_interval-th layer is NoPE."""
    n, given = v["num_hidden_layers"], v["no_rope_layers"]
    if given is None:
        step = v["no_rope_layer_interval"]
        return tuple((i + 1) % step != 0 for i in range(n))
    if len(given) < n:
        raise ConfigError(f"no_rope_layers has {len(given)} entries for {n} hidden layers")
    bad = next((x for x in given if x not in (0, 1)), None)
    if bad is not None:
        raise malformed("no_rope_layers", "a list of 0 (NoPE) and 1 (RoPE) per layer", bad)
    return tuple(x == 1 for x in given[:n])


def _smollm3_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # SmolLM3Config: with use_sliding_window, the NoPE layers slide and the RoPE ones attend fully
    w = active_window(v, v["use_sliding_window"])
    rope = smollm3_rope_layers(v)
    return tuple(SLIDING if w and not r else FULL for r in rope), w


def _smollm3(v: dict) -> dict:
    return attention_bias(v) | {"mlp_bias": v["mlp_bias"], "rope_layers": smollm3_rope_layers(v)}


SMOLLM3 = Family(
    common_fields(
        # missing: SmolLM3Config's 4; null: one K/V head per query head
        num_key_value_heads=Spec(pos_int, 4, nullable=True),
        max_position_embeddings=Spec(pos_int, 32768),
        tie_word_embeddings=Spec(flag, True),
        attention_bias=Spec(flag, False),
        mlp_bias=Spec(flag, False),
        use_sliding_window=Spec(flag, False),
        sliding_window=Spec(nonneg_int, None, nullable=True),
        no_rope_layers=Spec(int_list, None),
        no_rope_layer_interval=Spec(pos_int, 4),
        # the published SmolLM3-3B config.json carries both; SmolLM3Config defines neither
        # and the model reads neither (pretraining_tp=2 there changes nothing)
        max_window_layers=Spec(nonneg_int, None),
        pretraining_tp=Spec(pos_int, None),
    ),
    derive=_smollm3,
    windows=_smollm3_window,
    reads_layer_types=True,
    default_theta=2e6,
    genai_type="smollm3",
)


FAMILIES = {
    "smollm3": SMOLLM3,
}
