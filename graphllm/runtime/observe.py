"""Token mixing observed by execution: perturb one input position at a time and watch which output
positions change. The check of the tokens pass that does not trust the op table."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from graphllm.build.builder import build_export_graph, build_graph
from graphllm.build.weights import random_weights
from graphllm.errors import GraphllmError
from graphllm.exporters.onnx import export_onnx
from graphllm.files import temporary_folder
from graphllm.ir import STATE, Graph
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.ops import OPS
from graphllm.passes import run
from graphllm.passes.parallel.partition import Strategy
from graphllm.runtime.budget import require_interpreted
from graphllm.runtime.interpret import run_graph
from graphllm.runtime.session import OnnxModel
from graphllm.trace import traced_graph


def small_instance(
    cfg: ModelConfig, seq_len: int = 12, strategy: Strategy | None = None
) -> ModelConfig:
    """The same architecture at toy sizes: its family, features, GQA sharing, MoE routing and
    per-layer attention kinds, with a sliding window (and a chunk) shrunk below `seq_len` so it
    shows. With `strategy`, every size the strategy splits that it divides in `cfg` (heads, KV
    heads, ffn widths, the vocabulary, experts under ep, layers under pp) is one it divides in
    the small instance too, so the small instance partitions the way the model does."""
    tp = strategy.tp if strategy is not None else 1
    layers = min(cfg.num_hidden_layers, 4)
    if strategy is not None:  # a stage needs a layer at least
        layers = min(cfg.num_hidden_layers, max(layers, strategy.pp))
    experts = min(cfg.num_experts, 8)
    if strategy is not None and strategy.ep > 1 and cfg.num_experts % strategy.ep == 0:
        experts = math.lcm(experts, strategy.ep)

    def width(small: int, full: int) -> int:
        """`small`, or the next multiple of tp where tp divides the model's `full`."""
        return _split_like(small, full, tp) if full else 0

    small = replace(
        cfg,
        **_small_attention(cfg, seq_len, tp),
        **_small_rope(cfg),
        name=f"{cfg.name} (small instance)",
        vocab_size=_small_vocab(cfg, strategy),
        hidden_size=32,
        num_hidden_layers=layers,
        intermediate_size=width(48, cfg.intermediate_size),
        layer_types=cfg.layer_types[:layers],
        rope_layers=cfg.rope_layers[:layers],
        num_experts=experts,
        num_experts_per_tok=min(cfg.num_experts_per_tok, experts),
        moe_intermediate_size=width(16, cfg.moe_intermediate_size),
        shared_expert_intermediate_size=width(24, cfg.shared_expert_intermediate_size),
        moe_layers=cfg.moe_layers[:layers],
        layer_blocks=cfg.layer_blocks[:layers],  # Nemotron-H's one sub-layer a layer
        embedding_multiplier=32**0.5 if cfg.embedding_multiplier != 1.0 else 1.0,
    )
    small = replace(small, **_small_linear(cfg, seq_len, tp), **_small_mamba(cfg, seq_len, tp))
    return replace(small, **_small_mla(cfg, experts)) if cfg.is_mla else small


def _split_like(small: int, full: int, parts: int) -> int:
    """`small` rounded up to a multiple of `parts` where `parts` divides `full` (the split the
    model takes stays one the small instance takes), else `small` as it is."""
    if parts <= 1 or full % parts:
        return small
    return -(-small // parts) * parts


def _small_attention(cfg: ModelConfig, seq_len: int, tp: int) -> dict:
    """Heads (GQA sharing kept, tp's divisibility too), head_dim 8, window and chunk below T."""
    ratio = cfg.num_attention_heads // cfg.num_key_value_heads
    kv = 1 if ratio >= 4 else 2
    if tp > 1 and cfg.num_key_value_heads % tp == 0:
        kv = math.lcm(kv, tp)  # each tp rank holds KV heads of its own, as in the model
    elif tp > 1:
        kv = math.gcd(kv, tp)  # fewer KV heads than ranks: each replicated, as in the model
    heads = kv * min(ratio, 4)
    if tp > 1 and cfg.num_attention_heads % tp == 0:
        heads = math.lcm(heads, tp)
    window = cfg.sliding_window
    if window is not None:
        window = min(window, max(2, seq_len // 4))
    chunk = cfg.attention_chunk_size  # Llama 4's chunked layers
    if chunk is not None:
        chunk = min(chunk, max(2, seq_len // 3))
    return {
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": 8,
        "sliding_window": window,
        "attention_chunk_size": chunk,
    }


def _small_rope(cfg: ModelConfig) -> dict:
    """Partial rotary at about its share of the 8-wide head (Phi-4-mini: 6 of 8), and
    longrope's per-pair factors thinned to the pairs left, else the toy head could not hold
    them."""
    rotary = min(8, max(2, 2 * round(4 * cfg.rotary_dim / cfg.head_dim))) if cfg.rotary_dim else 0
    pairs = (rotary or 8) // 2

    def thin(factors: tuple[float, ...]) -> tuple[float, ...]:
        return factors[:: max(1, len(factors) // pairs)][:pairs] if factors else factors

    rope = replace(cfg.rope, short_factor=thin(cfg.rope.short_factor))
    return {"rotary_dim": rotary, "rope": replace(rope, long_factor=thin(cfg.rope.long_factor))}


def _small_vocab(cfg: ModelConfig, strategy: Strategy | None) -> int:
    """97 (prime: no size is mistaken for it), or a multiple of tp where tp shards the model's."""
    if strategy is None or strategy.whole_vocab:
        return 97
    return _split_like(97, cfg.vocab_size, strategy.tp)


def _small_linear(cfg: ModelConfig, seq_len: int, tp: int) -> dict:
    """Gated DeltaNet at toy sizes, its chunk shorter than the sequence so that the chunked
    form's boundaries show."""
    if not cfg.linear_num_key_heads:
        return {}
    r = min(cfg.linear_num_value_heads // cfg.linear_num_key_heads, 2)
    keys = _split_like(2, cfg.linear_num_key_heads, tp)
    return {
        "linear_num_key_heads": keys,
        "linear_num_value_heads": keys * r,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 6,
        "linear_chunk_size": min(cfg.linear_chunk_size, max(2, seq_len // 3)),
    }


def _small_mamba(cfg: ModelConfig, seq_len: int, tp: int) -> dict:
    """Mamba2 at toy sizes (heads in groups as the model has them, both split as tp splits the
    model's), its chunk shorter than the sequence so that the chunked form's boundaries show."""
    if not cfg.mamba_num_heads:
        return {}
    # tp splits the groups where it divides the model's (partition replicates them otherwise),
    # so the small instance's groups divide the same way, and the heads fill whole groups
    groups = _split_like(min(cfg.mamba_n_groups, 2), cfg.mamba_n_groups, tp)
    return {
        "mamba_num_heads": math.lcm(_split_like(4, cfg.mamba_num_heads, tp), groups),
        "mamba_head_dim": 4,
        "ssm_state_size": 4,
        "mamba_n_groups": groups,
        "mamba_chunk_size": min(cfg.mamba_chunk_size, max(2, seq_len // 3)),
    }


def _small_mla(cfg: ModelConfig, experts: int) -> dict:
    """MLA at toy sizes (head_dim 8 = 6 without RoPE + 2 with), its router's groups kept."""
    groups = min(cfg.n_group, 4)
    while experts % groups:
        groups -= 1
    top_groups = max(1, min(cfg.topk_group, groups - 1))
    k = min(cfg.num_experts_per_tok, experts)
    if groups > 1:  # the chosen groups must hold k experts
        k = min(k, top_groups * experts // groups)
    return {
        "num_experts_per_tok": k,
        "qk_nope_head_dim": 6,
        "qk_rope_head_dim": 2,
        "v_head_dim": 4,
        "kv_lora_rank": 12,
        "q_lora_rank": 16 if cfg.q_lora_rank else 0,
        "n_group": groups,
        "topk_group": top_groups,
        "attention_scale": 8**-0.5,
    }


@dataclass(frozen=True)
class MixingCheck:
    """Predicted and observed (T, T) matrices: output position x perturbed input position.
    Where the model selects the keys a query reads at run time (`selects`: a mask with a top-k
    within its relation), the prediction is a bound: a run reads within it, not all of it."""

    config: ModelConfig
    predicted: np.ndarray
    observed: np.ndarray
    selects: bool = False

    @property
    def agrees(self) -> bool:
        if self.selects:  # nothing outside the bound
            return bool((self.observed <= self.predicted).all())
        return bool((self.predicted == self.observed).all())

    def differences(self) -> list[tuple[int, int, bool, bool]]:
        """(output t, input j, predicted, observed) for every cell that differs (with a
        selection, every cell read outside the bound)."""
        wrong = self.observed & ~self.predicted if self.selects else self.predicted != self.observed
        cells = np.argwhere(wrong)
        return [
            (int(t), int(j), bool(self.predicted[t, j]), bool(self.observed[t, j]))
            for t, j in cells
        ]


@dataclass
class MixingCase:
    """A small instance of a config, its graph and the tokens pass's prediction, random token ids
    and past K/V: what `check_token_mixing` runs, in numpy or through onnxruntime."""

    small: ModelConfig
    workload: Workload
    graph: Graph
    predicted: np.ndarray  # (outputs, new positions)
    rng: np.random.Generator
    ids: np.ndarray  # (B, T)
    # every layer's past at the full length P; where a window layer's cache holds only the last
    # W-1 positions the ones before are zeros, which its window masks out
    past: dict[str, np.ndarray]

    def observe(self, logits: Callable[[np.ndarray], np.ndarray]) -> MixingCheck:
        """Perturb each new position in turn; `logits(ids)` is a run's (rows, vocab) logits of
        the first sequence."""
        t = self.workload.seq_len
        rows = np.arange(t) if self.workload.logits == "all" else np.array([t - 1])

        def full(x: np.ndarray) -> np.ndarray:
            out = logits(x)
            padded = np.zeros((t, out.shape[-1]), out.dtype)
            padded[rows] = out  # with logits for the last position only, the others stay empty
            return padded

        base, vocab = full(self.ids), self.small.vocab_size
        observed = np.zeros((t, t), dtype=bool)
        for j in range(t):
            changed = self.ids.copy()
            changed[0, j] = (changed[0, j] + 1 + self.rng.integers(vocab - 1)) % vocab
            # bit-exact comparison: a position that does not read input j computes the same bits
            observed[:, j] = (full(changed) != base).any(axis=-1)
        return MixingCheck(self.small, self.predicted, observed, selects_keys(self.graph))


def selects_keys(graph: Graph) -> bool:
    """Whether a mask of `graph` keeps at most k of the keys its relation allows, chosen at
    run time from the values (a sparse layer's selection)."""
    return any(OPS[n.op].relation is not None and n.attrs.get("topk") for n in graph.nodes())


def mixing_case(
    cfg: ModelConfig,
    seq_len: int = 12,
    seed: int = 0,
    shrink: bool = True,
    workload: Workload | None = None,
) -> MixingCase:
    """The case `check_token_mixing` runs (fp32; the small instance unless `shrink` is off)."""
    wl = workload or Workload(seq_len=seq_len)
    wl = replace(wl, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")
    small = small_instance(cfg, wl.seq_len) if shrink else cfg
    graph = build_graph(small, wl)
    # a run's values, and a second run's beside the first one's logits it is compared with
    require_interpreted(graph, f"the token-mixing check of {small.name} at B={wl.batch:,}", runs=2)
    predicted = run(graph, ["tokens"], exact_sets=True)["tokens"].dependence[:, wl.past_len :]
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, small.vocab_size, size=(wl.batch, wl.seq_len))
    p, past = wl.past_len, {}
    for n in graph.nodes("input"):
        if n.name.startswith("past_key_values."):
            present = n.name.replace("past_key_values.", "present.", 1)
            if graph.output_role(present) == STATE:  # a conv or recurrent state: any values
                shape = tuple(int(x) for x in n.out.shape(graph.bindings))
                past[n.name] = rng.standard_normal(shape).astype(np.float32) * 0.1
                continue
            b, h, held, e = (int(x) for x in n.out.shape(graph.bindings))
            kv = np.zeros((b, h, p, e), np.float32)
            kv[:, :, p - held :] = rng.standard_normal((b, h, held, e))
            past[n.name] = kv
    return MixingCase(small, wl, graph, predicted, rng, ids, past)


def traced_mixing_check(
    raw: dict[str, Any], name: str, workload: Workload, seed: int = 0
) -> MixingCheck:
    """`check_token_mixing` of a model traced from transformers' code (graphllm.trace), as the
    config gives it (a traced model has no small instance), in the numpy interpreter."""
    wl = replace(workload, weight_dtype="fp32", act_dtype="fp32", kv_dtype="fp32")
    graph = traced_graph(raw, wl, name, values=True)
    require_interpreted(graph, f"the token-mixing check of {name} at B={wl.batch:,}", runs=2)
    predicted = run(graph, ["tokens"], exact_sets=True)["tokens"].dependence[:, wl.past_len :]
    rng = np.random.default_rng(seed)
    config = graph.meta["config"]
    ids = rng.integers(0, config.vocab_size, size=(wl.batch, wl.seq_len))
    past = {
        n.name: rng.standard_normal(tuple(int(x) for x in n.out.shape(graph.bindings))).astype(
            np.float32
        )
        for n in graph.nodes("input")
        if n.name.startswith("past_key_values.")
    }
    case = MixingCase(config, wl, graph, predicted, rng, ids, past)
    weights = random_weights(graph, seed=seed)
    return case.observe(lambda x: run_graph(graph, weights, x, past or None)["logits"][0])


RUNTIMES = ("numpy", "onnxruntime")


def check_token_mixing(
    cfg: ModelConfig,
    seq_len: int = 12,
    seed: int = 0,
    shrink: bool = True,
    workload: Workload | None = None,
    runtime: str = "numpy",
) -> MixingCheck:
    """Run a small instance of `cfg`, perturb each new position in turn, compare with the tokens
    pass. With a past (P > 0) the cache is random K/V and only the new positions are perturbed;
    the matrices are then (outputs, new positions). `runtime` runs it in the numpy interpreter,
    or exported to an `.onnx` file (decomposed ops) on onnxruntime: the same small instance,
    random weights, token ids, past K/V and perturbations either way."""
    if runtime not in RUNTIMES:
        raise GraphllmError(f"runtime {runtime!r}: use one of {', '.join(RUNTIMES)}")
    case = mixing_case(cfg, seq_len, seed, shrink, workload)
    if runtime == "numpy":
        weights = random_weights(case.graph, seed=seed)
        return case.observe(
            lambda x: run_graph(case.graph, weights, x, case.past or None)["logits"][0]
        )
    with temporary_folder("graphllm-tokens") as tmp:
        path = tmp / "model.onnx"
        graph = build_export_graph(case.small, "fp32", case.workload.logits)
        export_onnx(graph, path, seed=seed, workload=case.workload, check=False, ops="decomposed")
        model = OnnxModel(path, device="cpu")
        return case.observe(lambda x: model.forward(x, past=case.past)["logits"][0])
