"""Token mixing observed by execution: perturb one input position at a time and watch which output
positions change. The check of the tokens pass that does not trust the op table."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from graphllm.builder import build_graph
from graphllm.interpret import run_graph
from graphllm.model_config import ModelConfig
from graphllm.passes import run
from graphllm.weights import random_weights
from graphllm.workload import Workload


def small_instance(cfg: ModelConfig, seq_len: int = 12, max_layers: int = 4) -> ModelConfig:
    """The same architecture at toy sizes: its family, features, GQA sharing, MoE routing and
    per-layer attention kinds, with a sliding window shrunk below `seq_len` so it shows."""
    ratio = cfg.num_attention_heads // cfg.num_key_value_heads
    kv = 1 if ratio >= 4 else 2
    heads = kv * min(ratio, 4)
    layers = min(cfg.num_hidden_layers, max_layers)
    window = cfg.sliding_window
    if window is not None:
        window = min(window, max(2, seq_len // 4))
    experts = min(cfg.num_experts, 8)
    return replace(
        cfg,
        name=f"{cfg.name} (small instance)",
        vocab_size=97,
        hidden_size=32,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        head_dim=8,
        intermediate_size=48 if cfg.intermediate_size else 0,
        layer_types=cfg.layer_types[:layers],
        sliding_window=window,
        num_experts=experts,
        num_experts_per_tok=min(cfg.num_experts_per_tok, experts),
        moe_intermediate_size=16 if cfg.moe_intermediate_size else 0,
        shared_expert_intermediate_size=24 if cfg.shared_expert_intermediate_size else 0,
        moe_layers=cfg.moe_layers[:layers],
        embedding_multiplier=32**0.5 if cfg.embedding_multiplier != 1.0 else 1.0,
    )


@dataclass(frozen=True)
class MixingCheck:
    """Predicted and observed (T, T) matrices: output position x perturbed input position."""

    config: ModelConfig
    predicted: np.ndarray
    observed: np.ndarray

    @property
    def agrees(self) -> bool:
        return bool((self.predicted == self.observed).all())

    def differences(self) -> list[tuple[int, int, bool, bool]]:
        """(output t, input j, predicted, observed) for every cell that differs."""
        cells = np.argwhere(self.predicted != self.observed)
        return [
            (int(t), int(j), bool(self.predicted[t, j]), bool(self.observed[t, j]))
            for t, j in cells
        ]


def check_token_mixing(
    cfg: ModelConfig, seq_len: int = 12, seed: int = 0, shrink: bool = True
) -> MixingCheck:
    """Run a small instance of `cfg`, perturb each position in turn, compare with the tokens pass."""
    small = small_instance(cfg, seq_len) if shrink else cfg
    graph = build_graph(small, Workload(seq_len=seq_len, dtype="fp32"))
    predicted = run(graph, ["tokens"], exact_sets=True)["tokens"].dependence
    weights = random_weights(graph, seed=seed)
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, small.vocab_size, size=(1, seq_len))
    base = run_graph(graph, weights, ids)["logits"][0]
    observed = np.zeros((seq_len, seq_len), dtype=bool)
    for j in range(seq_len):
        changed = ids.copy()
        changed[0, j] = (changed[0, j] + 1 + rng.integers(small.vocab_size - 1)) % small.vocab_size
        logits = run_graph(graph, weights, changed)["logits"][0]
        # bit-exact comparison: a position that does not read input j computes the same bits
        observed[:, j] = (logits != base).any(axis=-1)
    return MixingCheck(small, predicted, observed)
