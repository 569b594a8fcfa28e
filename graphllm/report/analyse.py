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
from graphllm.models.workload import Workload
from graphllm.passes.registry import Results
from graphllm.report.reuse import reused_results
from graphllm.report.trace_report import analysed

DEFAULT_SEQ_LEN = 2048  # trace's: a typical prompt
ATTENTION = ("flash", "naive")
MLA = ("naive", "absorbed")


def analyse(
    config: ModelConfig | str | Path | dict,
    workload: Workload | Mapping[str, Any] | None = None,
    hardware: Hardware | str | Path | None = "h100",
    *,
    attention: str = "flash",
    training: bool = False,
    mla: str = "naive",
    mtp: bool = False,
    exact_sets: bool | None = None,
    ideal: bool = False,
    cuda_graphs: bool | None = None,
) -> Results:
    """Run `graphllm trace`'s analyses and return the reports `passes.run` would give.

    The result equals `passes.run(build_graph(config, workload, mla=mla, mtp=mtp), ["verify",
    "params", "tokens", "cost", "memory", "roofline"], hardware=..., attention=..., ...)` figure
    for figure, computed as `trace` computes it: one layer of each kind is analysed and stands
    for every layer of its kind (20-30 ms for Llama-3.1-405B at T=2048 rather than 0.2 s).
    Where one layer cannot stand for the rest, the full graph is built and analysed instead,
    with the same results: with `mtp=True` (the MTP modules read the main model's last hidden
    state), a model with one layer of each kind already, and a layer that reads another layer's
    nodes besides its predecessor's output (a value residual, a KV cache shared across layers).

    Args:
        config: a ModelConfig, or what `load_config` takes: a preset name, a config.json or
            YAML path, a checkpoint folder, or a dict of config.json's fields.
        workload: a Workload, or a dict of its fields (`seq_len`, `batch`, `past_len`, `dtype`,
            `weight_dtype`, `act_dtype`, `kv_dtype`, `logits`). None or a missing `seq_len`:
            T=2048, as `trace`; a YAML config's `workload:` section fills what is not given.
        hardware: a Hardware, a preset name (see `graphllm hardware`), a spec file, or `local`;
            None skips the roofline (its report is None).
        attention: "flash" (fused core attention) or "naive" (every op through memory).
        training: forward + backward FLOPs and time.
        mla: a DeepSeek model's latent attention, "naive" or "absorbed".
        mtp: build DeepSeek-V3's multi-token-prediction modules.
        exact_sets: the tokens pass's bit sets (True) or intervals (False); None: bit sets
            when the sequence is short.
        ideal: time on the data sheet's peaks (`trace --ideal`).
        cuda_graphs: kernels launched through CUDA graphs; None: for decode steps only.

    Returns:
        {pass name: its report} in `passes.run`'s order: "verify" ({"nodes", "edges"} of the
        full graph), "params" (ParamReport), "tokens" (TokenReport), "cost" (CostReport),
        "memory" (MemoryReport), "roofline" (RooflineReport, None without hardware).

    Raises:
        ConfigError: a config, workload, hardware or form that is not valid.
        PassError: an analysis that fails, named.
    """
    for name, value, known in (("attention", attention, ATTENTION), ("mla", mla, MLA)):
        if value not in known:
            raise ConfigError(f"{name} must be one of {', '.join(known)}, got {value!r}")
    cfg = config if isinstance(config, ModelConfig) else load_config(config)
    wl = _workload(config, workload)
    hw = _hardware(hardware, ideal, cuda_graphs)
    got = reused_results(cfg, wl, hw, attention, training, mla, mtp, exact_sets)
    if got is not None:
        return got
    return analysed(cfg, wl, hw, attention, training, mla, mtp, exact_sets)[1]


def _workload(config: Any, workload: Workload | Mapping[str, Any] | None) -> Workload:
    """The workload given, else trace's: the config file's section over T=2048."""
    if isinstance(workload, Workload):
        return workload
    section = load_workload_section(config) if isinstance(config, (str, Path)) else {}
    fields = {"seq_len": DEFAULT_SEQ_LEN} | dict(section) | dict(workload or {})
    return Workload.with_dtype(None, **fields)


def _hardware(
    hardware: Hardware | str | Path | None, ideal: bool, cuda_graphs: bool | None
) -> Hardware | None:
    if hardware is None:
        return None
    hw = hardware if isinstance(hardware, Hardware) else load_hardware(hardware)
    hw = hw.ideal() if ideal else hw
    return hw if cuda_graphs is None else replace(hw, cuda_graphs=cuda_graphs)
