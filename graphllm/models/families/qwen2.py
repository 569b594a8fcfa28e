"""Qwen2 and Qwen2-MoE (transformers' qwen2, qwen2_moe): biased q/k/v, the sliding window from
max_window_layers on, Qwen's MoE layer rule (mlp_only_layers, decoder_sparse_step) with a gated
shared expert."""

from __future__ import annotations

from graphllm.errors import ConfigError
from graphllm.models.family import FULL, SLIDING, Family, active_window
from graphllm.models.fields import Spec, common_fields, flag, int_list, nonneg_int, pos_int

QWEN_WINDOW = {
    "use_sliding_window": Spec(flag, False),
    "sliding_window": Spec(nonneg_int, 4096, nullable=True),
    "max_window_layers": Spec(nonneg_int, 28),
}
QWEN_MOE = {
    "num_experts": Spec(pos_int),
    "num_experts_per_tok": Spec(pos_int),
    "moe_intermediate_size": Spec(pos_int),
    "norm_topk_prob": Spec(flag, False),
    "decoder_sparse_step": Spec(pos_int, 1),
    "mlp_only_layers": Spec(int_list, []),
    # only the dense layers (mlp_only_layers, decoder_sparse_step) read it
    "intermediate_size": Spec(pos_int, None),
}


def qwen2_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # qwen2 / qwen3: the layers from max_window_layers on slide
    w = active_window(v, v["use_sliding_window"])
    n, first = v["num_hidden_layers"], v["max_window_layers"]
    return tuple(SLIDING if w and i >= first else FULL for i in range(n)), w


def _qwen2_moe_window(v: dict) -> tuple[tuple[str, ...], int | None]:
    # qwen2_moe (transformers 5): every other layer below max_window_layers slides
    w = active_window(v, v["use_sliding_window"])
    n, last = v["num_hidden_layers"], v["max_window_layers"]
    return tuple(SLIDING if w and (i + 1) % 2 and i < last else FULL for i in range(n)), w


def qwen_moe(v: dict) -> dict:
    n, only, step = v["num_hidden_layers"], v["mlp_only_layers"], v["decoder_sparse_step"]
    if any(i >= n for i in only):
        bad = next(i for i in only if i >= n)
        raise ConfigError(f"mlp_only_layers names layer {bad} but num_hidden_layers is {n}")
    # the rule in Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer
    only = set(only)  # a long list scanned once per layer would take quadratic time
    moe = tuple(i not in only and (i + 1) % step == 0 for i in range(n))
    dense = [i for i, m in enumerate(moe) if not m]
    if dense and v["intermediate_size"] is None:
        raise ConfigError(f"intermediate_size is required: layers {dense[:4]} use a dense MLP")
    shared = v.get("shared_expert_intermediate_size", 0)
    return {
        "num_experts": v["num_experts"],
        "num_experts_per_tok": v["num_experts_per_tok"],
        "moe_intermediate_size": v["moe_intermediate_size"],
        "intermediate_size": v["intermediate_size"] if dense else 0,
        "norm_topk_prob": v["norm_topk_prob"],
        "shared_expert_intermediate_size": shared,
        "shared_expert_gate": shared > 0,  # a sigmoid(Linear(d, 1)) gate on the shared expert
        "moe_layers": moe,
    }


QWEN2 = Family(
    common_fields(max_position_embeddings=Spec(pos_int, 32768), **QWEN_WINDOW),
    derive=lambda v: {"qkv_bias": True},  # q/k/v always carry a bias, o_proj never
    windows=qwen2_window,
    reads_layer_types=True,
    genai_type="qwen2",
)

QWEN2_MOE = Family(
    common_fields(
        max_position_embeddings=Spec(pos_int, 32768),
        qkv_bias=Spec(flag, True),  # transformers 5 field; 4.x configs lack it and have bias
        shared_expert_intermediate_size=Spec(pos_int),
        **QWEN_WINDOW,
        **QWEN_MOE,
    ),
    derive=lambda v: {"qkv_bias": v["qkv_bias"]},
    windows=_qwen2_moe_window,
    reads_layer_types=True,
    moe=qwen_moe,
)


FAMILIES = {
    "qwen2": QWEN2,
    "qwen2_moe": QWEN2_MOE,
}
