"""How serving engines run a step, where graphllm can compute it more than one way: which form of
MLA (DeepSeek-V2/V3 latent attention) a prefill and a decode step use.

vLLM's MLA backends compute a prefill in the "compute friendly" form (the cached latent
re-expanded to per-head keys and values: graphllm's 'naive') and a decode step in the "data-
movement friendly" form (the up projections folded into the query and the output, attention over
the latent itself: 'absorbed'), the two chosen by whether the scheduler labels a request prefill
or decode (vllm/v1/attention/backends/mla/common.py, its module docstring); SGLang and
TensorRT-LLM (FlashMLA, its absorbed decode kernel) do the same. A decode step in the naive form
re-expands every past position's keys and values in every layer, which no engine does: on
DeepSeek-V3 at batch 64 it priced a step some 20 times slower than absorbed.

The KV-cache dtype is the workload's, bf16 unless a config says otherwise: engines' default too
(vLLM's `kv_cache_dtype` 'auto' is the model's dtype; TensorRT-LLM's KvCacheConfig.dtype 'auto'
follows the checkpoint's kv_cache_quant_algo, absent in DeepSeek-V3's FP8 checkpoint), so the
cache is priced as an engine holds it unless it is told an FP8 cache is configured.
"""

from __future__ import annotations

from graphllm.build.mla import MLA_FORMS
from graphllm.errors import ConfigError
from graphllm.models.model_config import ModelConfig

MLA_CHOICES = ("auto", *MLA_FORMS)
# why 'auto' picks what it does, for the command's output
MLA_WHY = "as vLLM, SGLang and TensorRT-LLM run it: re-expanded for prefill, absorbed for decode"


def mla_why(mla: str) -> str:
    """Why a command's MLA forms are what they are: the engines' choice, or the flag."""
    return MLA_WHY if mla == "auto" else f"--mla {mla}"


def mla_form(config: ModelConfig, phase: str, mla: str = "auto") -> str:
    """The MLA form a step of `phase` ('prefill', 'decode' or 'training') is built in: `mla`
    where it names one, else the engines' choice (absorbed for decode only); 'naive' for a model
    without MLA under 'auto' (build_graph refuses 'absorbed' for one, as partition does)."""
    if mla not in MLA_CHOICES:
        raise ConfigError(f"mla must be one of {', '.join(MLA_CHOICES)}, got {mla!r}")
    if mla == "absorbed" and not config.is_mla:
        raise ConfigError(
            f"--mla absorbed: {config.name} has no latent attention (MLA: DeepSeek-V2/V3 and Kimi-K2 have it)"
        )
    if mla != "auto":
        return mla
    return "absorbed" if config.is_mla and phase == "decode" else "naive"
