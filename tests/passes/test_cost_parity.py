"""The cost pass's `flops["matmul"]` == torch's FlopCounterMode on transformers' own model, exactly.

Each preset is cut to 2 layers by editing its published config dict (so derived per-layer fields
stay consistent), and the same dict goes to `config_from_dict` and to `AutoConfig.for_model`. The
transformers model is built on the meta device with sdpa attention (and `batched_mm` experts for
MoE, which computes exactly the B*T*k routed token-expert pairs); one forward is counted. For a
cached step, a P-token prefill fills the cache outside the counter and only the new T tokens are
counted; `logits="last"` is transformers' `logits_to_keep=1`.

On meta, sdpa takes the math path, so attention shows up as two `aten.bmm` over the full T x S
score matrix whatever the mask: a sliding window shorter than T counts the same as none. In a
cached step both caches roll once P exceeds the window: a window layer holds the last W - 1 past
keys, so its S is min(P, W - 1) + T on both sides.
"""

from __future__ import annotations

import functools
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from graphllm import Workload, build_graph  # noqa: E402
from graphllm.models.config import PRESETS_DIR, config_from_dict  # noqa: E402
from graphllm.passes import run  # noqa: E402
from tests.support.flop_counter import count_forward  # noqa: E402
from tests.support.llama4_configs import SCOUT_TEXT  # noqa: E402

LAYERS = 2

# id -> preset, config overrides; what each one exercises
MODELS: dict[str, tuple[str, dict]] = {
    "llama3-8b": ("llama3-8b", {}),  # GQA, llama3 rope
    "llama2-7b": ("llama2-7b", {}),  # MHA
    "mistral-7b": ("mistral-7b", {}),  # sliding window 4096 (wider than any sequence here)
    "qwen2-7b": ("qwen2-7b", {}),  # q/k/v bias: addmm counts the matmul only
    "gemma-2b": ("gemma-2b", {}),  # tied head, MQA, head_dim 256
    "phi3-mini": ("phi3-mini", {}),  # fused qkv and gate_up
    "mixtral-8x7b": ("mixtral-8x7b", {}),  # 8 experts, top 2
    "qwen1.5-moe-a2.7b": ("qwen1.5-moe-a2.7b", {}),  # shared expert and its sigmoid gate
    "qwen3-30b-a3b": ("qwen3-30b-a3b", {}),  # q/k norm, 128 experts, top 8
    "phi4-mini": ("phi4-mini", {}),  # partial rotary, longrope: no matmul of their own
    "granite-3.3-8b": ("granite-3.3-8b", {}),  # muP multipliers: no matmul of their own
    # a NoPE layer among the two; with a cache, as the published use_cache=false leaves the
    # prefill without one and transformers' packed-sequence check cannot run on meta tensors
    "smollm3-3b": ("smollm3-3b", {"no_rope_layers": [1, 0], "use_cache": True}),
    # issue 16
    "olmo2-7b": ("olmo2-7b", {}),  # post-norms only, q/k norms over the whole projection
    "command-r-35b": ("command-r-35b", {}),  # parallel block, tied head, logit_scale after it
    "command-r-qk-norm": ("command-r-35b", {"use_qk_norm": True}),  # per-head q/k LayerNorms
    # a sliding layer then a global NoPE one
    "command-r7b": ("command-r7b", {"sliding_window_pattern": 2}),
    # a sliding layer then a global one, four norms, soft-capped scores and logits (no matmul of
    # their own); transformers has no sdpa path for the cap, so eager attention (same matmuls)
    "gemma2-9b": ("gemma2-9b", {}),
    # issue 16: Gemma 3, a local layer (its own RoPE base) then a global one, per-head q/k norms
    "gemma3-1b": ("gemma3-1b", {"sliding_window_pattern": 2}),
    # the multimodal config: its text decoder, linearly scaled global RoPE, a score scale of
    # query_pre_attn_scalar 168 (no matmul of their own); text tokens only reach the decoder
    "gemma3-27b": ("gemma3-27b", {}),
    # issue 18: GLM-4.5, a dense layer then one of DeepSeek-V3's MoE layers (160 experts top 8, a
    # shared expert), partial RoPE, QKV bias, per-head q/k norms (no matmul of their own)
    "glm4.5": ("glm4.5", {"first_k_dense_replace": 1}),
    "glm4.5-air": ("glm4.5-air", {}),  # 128 experts, no q/k norm
    # issue 18: MiniMax-M2, 256 experts top 8 in both layers, q/k norms over the projection
    "minimax-m2": ("minimax-m2", {"attn_type_list": [1, 1]}),
    # issue 18: gpt-oss, a window-128 layer with sinks then a full one, biased q/k/v/o and
    # router, 32 (128) experts top 4 with biases; eager attention (transformers has no sdpa path
    # for the sinks, which are no matmul)
    "gpt-oss-20b": ("gpt-oss-20b", {}),
    "gpt-oss-120b": ("gpt-oss-120b", {}),
}
# a window shorter than the sequence, so that the mask really slides
WINDOWED: dict[str, tuple[str, dict]] = {
    "mistral-7b-window32": ("mistral-7b", {"sliding_window": 32}),
    "phi3-mini-window32": ("phi3-mini", {"sliding_window": 32}),
    # SmolLM3's NoPE layer slides, its RoPE layer attends fully: one cache rolls, one does not
    "smollm3-3b-window32": (
        "smollm3-3b",
        {
            "no_rope_layers": [1, 0],
            "use_sliding_window": True,
            "sliding_window": 32,
            "layer_types": ["full_attention", "sliding_attention"],
            "use_cache": True,
        },
    ),
    # issue 16: a window-32 layer and a global NoPE one
    "command-r7b-window32": ("command-r7b", {"sliding_window": 32, "sliding_window_pattern": 2}),
    # issue 16: Gemma 2, a window-32 layer and a global one
    "gemma2-9b-window32": ("gemma2-9b", {"sliding_window": 32}),
    # issue 16: Gemma 3, a window-32 layer and a global one
    "gemma3-1b-window32": ("gemma3-1b", {"sliding_window": 32, "sliding_window_pattern": 2}),
    # issue 18: gpt-oss, a window-32 layer with sinks and a full one
    "gpt-oss-20b-window32": ("gpt-oss-20b", {"sliding_window": 32}),
}

# id -> Workload fields
WORKLOADS: dict[str, dict] = {
    "prefill-b1-t128": {"batch": 1, "seq_len": 128},
    "prefill-b2-t128": {"batch": 2, "seq_len": 128},
    "prefill-b2-t128-last": {"batch": 2, "seq_len": 128, "logits": "last"},
    "decode-b1-p64": {"batch": 1, "seq_len": 1, "past_len": 64},
    "decode-b2-p64": {"batch": 2, "seq_len": 1, "past_len": 64},
    "extend-b2-t16-p64": {"batch": 2, "seq_len": 16, "past_len": 64},
}


def _config_dict(preset: str, overrides: dict) -> dict:
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text(encoding="utf-8"))
    d = {k: v for k, v in d.items() if not k.startswith("_")}  # graphllm's provenance notes
    d.pop("quantization_config", None)  # issue 18: FP8 storage, not the computation counted
    # a multimodal config (Gemma 3 27B) keeps its decoder's fields in text_config
    text = d
    if "text_config" in d:
        text = d["text_config"] = dict(d["text_config"])
    text["num_hidden_layers"] = LAYERS
    for key in ("layer_types", "mlp_only_layers"):  # per-layer fields, trimmed with the layers
        if isinstance(text.get(key), list):
            cut = (
                text[key][:LAYERS] if key == "layer_types" else [i for i in text[key] if i < LAYERS]
            )
            text[key] = cut
    text.update(overrides)
    return d


# issue 16: configs without a preset, id -> the whole config dict. Llama 4's attention on a dense
# decoder (no published one exists: its presets come with the MoE side, issue 18): Scout's
# text_config with no MoE layer, a chunked RoPE layer (chunk 32, shorter than the sequences, so
# a decode step's chunk cache rolls to 31 keys) and a NoPE layer with its temperature
CONFIGS: dict[str, dict] = {
    "llama4_text-dense-chunk32": {
        **SCOUT_TEXT,
        "num_hidden_layers": LAYERS,
        "moe_layers": [],
        "no_rope_layers": [1, 0],
        "attention_chunk_size": 32,
        # transformers 5's strict config takes the published 4 only as the bool it means
        "attn_temperature_tuning": True,
    },
}


@functools.cache
def _models(model_id: str):
    """(graphllm ModelConfig, transformers meta model) for one id, built once per session."""
    if model_id in CONFIGS:
        preset, d = model_id, dict(CONFIGS[model_id])
    else:
        preset, overrides = {**MODELS, **WINDOWED}[model_id]
        d = _config_dict(preset, overrides)
    cfg = config_from_dict(dict(d), preset)
    # Gemma 2 soft-caps its scores, which transformers' sdpa path cannot do
    # (and gpt-oss's sinks)
    kwargs = {
        "attn_implementation": "eager" if d["model_type"] in ("gemma2", "gpt_oss") else "sdpa"
    }
    if {"num_experts", "num_local_experts", "n_routed_experts"} & set(d):
        kwargs["experts_implementation"] = "batched_mm"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**d), **kwargs
        )
    return cfg, model.eval()


def graphllm_matmul(model_id: str, workload: dict) -> int:
    cfg, _ = _models(model_id)
    graph = build_graph(cfg, Workload(**workload))
    return round(float(run(graph, ["cost"])["cost"].flops["matmul"]))


def counted_flops(model_id: str, workload: dict) -> FlopCounterMode:
    """FlopCounterMode over one forward of the new tokens (a cache of P tokens filled first)."""
    return count_forward(_models(model_id)[1], workload)


def _check(model_id: str, workload: dict) -> None:
    counter = counted_flops(model_id, workload)
    per_op = {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}
    assert graphllm_matmul(model_id, workload) == counter.get_total_flops(), per_op


@pytest.mark.parametrize("workload", WORKLOADS.values(), ids=WORKLOADS.keys())
@pytest.mark.parametrize("model_id", MODELS)
def test_matmul_flops_equal_flop_counter(model_id, workload):
    _check(model_id, workload)


@pytest.mark.parametrize("workload", WORKLOADS.values(), ids=WORKLOADS.keys())
@pytest.mark.parametrize("model_id", CONFIGS)
def test_matmul_flops_equal_flop_counter_without_a_preset(model_id, workload):
    _check(model_id, workload)


WINDOW_CASES = [
    pytest.param(m, WORKLOADS[w], id=f"{m}-{w}", marks=marks)
    for m in WINDOWED
    for w, marks in (
        # the mask cuts the 128 x 128 scores to a band; both sides count the full square
        ("prefill-b1-t128", ()),
        ("prefill-b2-t128-last", ()),
        # a cached step: both caches roll, holding the last W-1 keys
        ("decode-b1-p64", ()),
        ("extend-b2-t16-p64", ()),
    )
]


@pytest.mark.parametrize(("model_id", "workload"), WINDOW_CASES)
def test_sliding_window_shorter_than_sequence(model_id, workload):
    _check(model_id, workload)


def test_sliding_window_cache_rolls_like_transformers():
    """A cached step over a window shorter than the past sees W-1 past keys, not P."""
    from graphllm import build_graph
    from graphllm.models.workload import Workload

    model_id, workload = "mistral-7b-window32", WORKLOADS["extend-b2-t16-p64"]
    cfg, _ = _models(model_id)
    graph = build_graph(cfg, Workload(**workload))
    assert graph.type_of(graph.outputs["present.0.key"]).shape(graph.bindings)[2] == 31 + 16


NUMBER_WORDS = {
    w: i + 1
    for i, w in enumerate(
        [
            "one",
            "two",
            "three",
            "four",
            "five",
            "six",
            "seven",
            "eight",
            "nine",
            "ten",
            "eleven",
            "twelve",
            "thirteen",
            "fourteen",
            "fifteen",
            "sixteen",
            "seventeen",
            "eighteen",
            "nineteen",
            "twenty",
            "twenty-one",
            "twenty-two",
            "twenty-three",
            "twenty-four",
            "twenty-five",
        ]
    )
}


def test_docs_count_the_models_table():
    # issue 16 audit: the pages said "twelve presets of ten families" long after the table grew
    import re

    from graphllm.models.config import load_config
    from tests.support.paths import REPO

    presets = {p for p, _ in MODELS.values()}
    families = {load_config(p).model_type for p in presets}
    for page in ("docs/costs.md", "docs/checked-against.md"):
        text = (REPO / page).read_text(encoding="utf-8")
        m = re.search(r"([\w-]+) presets of ([\w-]+) families", text)
        assert m, page
        assert (NUMBER_WORDS.get(m[1]), NUMBER_WORDS.get(m[2])) == (len(presets), len(families))
