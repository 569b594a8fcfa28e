"""`analyse`: trace's analyses from Python, as fast as the command (one layer of each kind)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from graphllm.errors import ConfigError
from graphllm.models.config import load_config, load_workload_section
from graphllm.models.hardware import Hardware, load_hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import ATTENTION_FORMS, Workload
from graphllm.models.workload_merge import merge_workload
from graphllm.passes.parallel.engine import mla_form
from graphllm.passes.registry import Results
from graphllm.report.reuse import reused_results
from graphllm.report.trace_report import analysed


def analyse(
    config: ModelConfig | str | Path | dict,
    workload: Workload | Mapping[str, Any] | None = None,
    hardware: Hardware | str | Path | None = "h100",
    *,
    attention: str = "flash",
    training: bool = False,
    mla: str = "auto",
    mtp: bool = False,
    exact_sets: bool | None = None,
    ideal: bool = False,
    cuda_graphs: bool | None = None,
) -> Results:
    """Run `graphllm trace`'s analyses and return the reports `passes.run` would give.

    The result equals `passes.run(build_graph(config, workload, mla=form, mtp=mtp), ["verify",
    "params", "tokens", "cost", "memory", "roofline"], hardware=..., attention=..., ...)` figure
    for figure, computed as `trace` computes it: one layer of each kind is analysed and stands
    for every layer of its kind (about 20 ms for Llama-3.1-405B at T=2048 rather than 0.25 s).
    The full graph is analysed instead where one layer cannot stand for the rest: `mtp=True`,
    one layer of each kind already, a layer reading another's nodes (a shared KV cache).

    Args:
        config: a ModelConfig, or what `load_config` takes: a preset name, a config.json or
            YAML path, a checkpoint folder, or a dict of config.json's fields.
        workload: a Workload, taken as is (a quantized checkpoint's weights priced as
            stored, as `build_graph` does), or a dict of its fields (`seq_len`, `batch`,
            `past_len`, `dtype`, `weight_dtype`, `act_dtype`, `kv_dtype`, `logits`; None: not
            given) merged as `trace` merges its flags: over a YAML config's `workload:`
            section, over T=2048; a `dtype` replaces the section's per-kind dtypes, and a
            weight dtype named in either replaces a quantized checkpoint's stored format.
        hardware: a Hardware, a preset name (see `graphllm hardware`), a spec file, or `local`;
            None skips the roofline (its report is None).
        attention: "flash" (fused core attention) or "naive" (every op through memory).
        training: forward + backward FLOPs and time.
        mla: a DeepSeek model's latent attention: "auto" (the default, as `trace`'s: the form
            engines run the step in, absorbed for a decode step, naive for a prefill or a
            training step and for a model without MLA), "naive" (`build_graph`'s default) or
            "absorbed"; `form` above is the one it names.
        mtp: build DeepSeek-V3's multi-token-prediction modules.
        exact_sets: the tokens pass's bit sets (True) or intervals (False); None: bit sets
            when the sequence is short.
        ideal: time on the data sheet's peaks (`trace --ideal`).
        cuda_graphs: kernels launched through CUDA graphs; None: for decode steps only.

    Returns:
        {pass name: its report} in `passes.run`'s order: "verify" ({"nodes", "edges"}),
        "params", "tokens", "cost", "memory", "roofline" (None without hardware).

    Raises:
        ConfigError: a config, workload, hardware or form that is not valid (PassError: a pass).
    """
    _check_attention(attention)
    cfg, wl = _requested(config, workload)
    form = mla_form(cfg, "training" if training else wl.phase, mla)
    hw = _hardware(hardware, ideal, cuda_graphs)
    got = reused_results(cfg, wl, hw, attention, training, form, mtp, exact_sets)
    if got is not None:
        return got
    return analysed(cfg, wl, hw, attention, training, form, mtp, exact_sets)[1]


def _check_attention(attention: str) -> None:
    if attention not in ATTENTION_FORMS:
        raise ConfigError(
            f"attention must be one of {', '.join(ATTENTION_FORMS)}, got {attention!r}"
        )


def _requested(
    config: ModelConfig | str | Path | dict, workload: Workload | Mapping[str, Any] | None
) -> tuple[ModelConfig, Workload]:
    """The model and the workload given, else trace's: the fields given over the config
    file's section over T=2048, merged as the command line merges its flags."""
    cfg = config if isinstance(config, ModelConfig) else load_config(config)
    if isinstance(workload, Workload):
        return cfg, workload
    section = load_workload_section(config) if isinstance(config, (str, Path)) else {}
    got = merge_workload(cfg, section, workload or {})
    return got.config, got.workloads[0]


def _hardware(
    hardware: Hardware | str | Path | None, ideal: bool, cuda_graphs: bool | None
) -> Hardware | None:
    if hardware is None:
        return None
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    hw = hw.ideal() if ideal else hw
    return hw if cuda_graphs is None else replace(hw, cuda_graphs=cuda_graphs)
