"""The FLOP reference: torch's FlopCounterMode over one forward of transformers' own model on the
meta device, and DeepSeek's presets cut to 2 layers as graphllm configs and such models (shared by
the cost pass's DeepSeek parity and the MTP module's FLOP test)."""

from __future__ import annotations

import functools
import json
from typing import Any

import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

from graphllm.models.config import PRESETS_DIR, _load_preset, config_from_dict


def count_forward(model: Any, workload: dict) -> FlopCounterMode:
    """FlopCounterMode over one forward of a meta-device model's new tokens, after P cached."""
    b, t, p = workload["batch"], workload["seq_len"], workload.get("past_len", 0)
    kwargs = {"logits_to_keep": 1} if workload.get("logits") == "last" else {}
    # no parameter needs a gradient here, and with one torch's module tracker hooks the inputs of
    # every module, transformers>=5.25's hub-kernel wrappers of the causal conv included, where a
    # parameter's meta view has no gradient function to hook
    model.requires_grad_(False)
    with torch.device("meta"), torch.no_grad():
        if p:
            prefill = model(input_ids=torch.zeros((b, p), dtype=torch.long), use_cache=True)
            kwargs |= {"cache": prefill.cache, "use_cache": True}
        counter = FlopCounterMode(display=False)
        with counter:
            model(input_ids=torch.zeros((b, t), dtype=torch.long), **kwargs)
    return counter


# DeepSeek presets -> config overrides on top of the published config cut to 2 layers
DEEPSEEK_MODELS = {
    "deepseek-v2-lite": {},  # one q_proj, greedy softmax routing, 64 experts top 6
    "deepseek-v2": {},  # q down/up projections, group-limited routing over 160 experts
    "deepseek-v3": {"first_k_dense_replace": 1},  # sigmoid, bias, grouped top-8 of 256
    "kimi-k2": {},  # issue 18: DeepSeek-V3's architecture, 384 experts, 64 heads
}
DEEPSEEK_WORKLOADS = {
    "prefill-b1-t64": {"batch": 1, "seq_len": 64},
    "prefill-b2-t32-last": {"batch": 2, "seq_len": 32, "logits": "last"},
    "decode-b2-p48": {"batch": 2, "seq_len": 1, "past_len": 48},
    "extend-b1-t8-p40": {"batch": 1, "seq_len": 8, "past_len": 40},
}


def deepseek_config_dict(preset: str) -> dict:
    """The preset's published config, cut to 2 layers (one dense, one MoE)."""
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text(encoding="utf-8"))
    d = {k: v for k, v in d.items() if not k.startswith("_") and k != "quantization_config"}
    return {**d, "num_hidden_layers": 2, **DEEPSEEK_MODELS[preset]}


@functools.cache
def deepseek_models(preset: str):
    """(graphllm ModelConfig, transformers meta model) for one preset, built once per session."""
    d = deepseek_config_dict(preset)
    cfg = config_from_dict(dict(d), preset)
    if d["model_type"] == "kimi_k2":  # transformers has no kimi_k2: DeepseekV3 from its fields
        d = {k: v for k, v in d.items() if k != "auto_map"} | {"model_type": "deepseek_v3"}
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**d),
            attn_implementation="sdpa",
            experts_implementation="batched_mm",
        )
    return cfg, model.eval()


@functools.cache
def qwen3_next_models(layers: int):
    """(graphllm ModelConfig, transformers meta model) of the published qwen3-next-80b-a3b
    config cut to `layers` layers, built once per session."""
    d, _ = _load_preset("qwen3-next-80b-a3b")
    d = {k: v for k, v in d.items() if not k.startswith("_")} | {"num_hidden_layers": layers}
    cfg = config_from_dict(dict(d), "qwen3-next-80b-a3b")
    drop = ("architectures", "model_type", "transformers_version", "torch_dtype")
    hf = transformers.Qwen3NextConfig(**{k: v for k, v in d.items() if k not in drop})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            hf, attn_implementation="sdpa", experts_implementation="batched_mm"
        )
    return cfg, model.eval()
