"""The graph of a model at a workload, whichever frontend made its config: graphllm's hand-built
family (a ModelConfig), or transformers' code traced on fake tensors (a TracedConfig, which
keeps the config.json fields it was traced from). The commands that build a model at many
workloads (serving's steps, the report's views) ask here."""

from __future__ import annotations

from typing import Any

from graphllm.build.builder import build_graph
from graphllm.errors import ConfigError
from graphllm.ir import Graph
from graphllm.models.workload import Workload
from graphllm.trace.model import traced_graph


def is_traced(config: Any) -> bool:
    return getattr(config, "frontend", "built") == "traced"


def model_graph(config: Any, workload: Workload, mla: str = "naive", mtp: bool = False) -> Graph:
    """The graph of `config` at `workload`; `mla` and `mtp` as build_graph takes them (a traced
    model computes as transformers' code does: its latent attention in the naive form only)."""
    if not is_traced(config):
        return build_graph(config, workload, mla=mla, mtp=mtp)
    require_traced_forms(config, mla, mtp)
    assert config.raw is not None, "a TracedConfig keeps the fields it was traced from"
    return traced_graph(config.raw, workload, config.name)


def require_traced_forms(config: Any, mla: str, mtp: bool = False) -> None:
    """One line for what a traced model cannot give: multi-token prediction, absorbed MLA."""
    if not is_traced(config):
        return
    if mla == "absorbed":
        raise ConfigError(
            f"--mla absorbed: {config.name} is traced from transformers' code, which "
            "re-expands the cached latent every step (the naive form); graphllm absorbs latent "
            "attention only in the families it builds"
        )
    if mtp:
        raise ConfigError(f"--mtp: {config.name} is traced, without its multi-token prediction")


def require_engine_form(config: Any, mla: str, phase: str = "decode", mtp: bool = False) -> None:
    """require_traced_forms, and one line for a traced model whose latent attention a decode
    step would cost in the naive form where engines run it absorbed, unless the user asked for
    the naive form."""
    require_traced_forms(config, mla, mtp)
    if phase != "decode":
        return
    if is_traced(config) and config.latent_attention and mla != "naive":
        raise ConfigError(
            f"{config.name}'s latent attention (MLA) is traced from transformers' code in the "
            "naive form, which re-expands the cached latent every step; engines absorb it in "
            "decode, and graphllm does so only in the families it builds: give --mla naive to "
            "size it in the naive form"
        )
