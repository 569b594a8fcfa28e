"""Whether a traced model fits its device, and if not the fewest devices a layout fits on.

The count comes from `plan`'s own search, not from a division: a layout's fullest device holds
its stage's weights, its share of the KV cache and the activations its program keeps, so the
smallest count is the first N, from the lower bound total / memory up, for which some legal
tensor x pipeline (x expert) layout fits. Data and context parallelism are left out: they copy
the weights, so they never make a model fit on fewer devices than TP and PP alone do.
"""

from __future__ import annotations

import math
from typing import Any

from graphllm.errors import GraphllmError
from graphllm.models.hardware import Hardware
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload
from graphllm.passes.parallel.partition import MAX_DEVICES
from graphllm.passes.parallel.plan import plan
from graphllm.passes.training import TrainingOptions

SEARCHED = 64  # device counts tried above the lower bound before giving up on a count
PINNED = {"cp": 1, "dp": 1}  # they replicate the weights: never fewer devices than without


def fit_section(
    config: ModelConfig,
    workload: Workload,
    hw: Hardware,
    memory: dict[str, Any],
    attention: str = "flash",
    mla: str = "auto",
) -> dict[str, Any]:
    """{'fits', 'needs', 'memory_bytes'} and, when it does not fit, 'devices' and 'layout' of the
    fewest devices a layout fits on (None when no count up to the search's end does, or the
    hardware has no interconnect to plan over); `mla` as plan takes it."""
    return _fit(config, workload, hw, memory["total"], {}, attention, mla=mla)


TRAINING_PARTS = ("weights", "gradients", "optimizer", "activations", "activations_working")


def training_fit_section(
    config: ModelConfig, workload: Workload, hw: Hardware, attention: str = "flash"
) -> dict[str, Any]:
    """A training step's memory on one device (the default TrainingOptions: Adam with fp32
    state, no recomputation, no ZeRO; plan's own figures), whether it fits, and if not the fewest
    devices a layout holds it on, as `fit_section` gives them for inference."""
    opts = TrainingOptions()
    one = one_device(config, workload, hw, opts, attention)
    parts = {k: one["stages"][0][k] for k in TRAINING_PARTS}
    known = {"parts": parts, "options": {"recompute": opts.recompute, "zero": opts.zero}}
    return _fit(config, workload, hw, one["memory_bytes"], known, attention, opts)


def one_device(
    config: ModelConfig,
    workload: Workload,
    hw: Hardware,
    training: TrainingOptions | None = None,
    attention: str = "flash",
    mla: str = "auto",
) -> dict[str, Any]:
    """Plan's layout of the whole step on one device (its memory, fitting or not): where a count
    of devices starts, since no fewer can hold what one would need."""
    report = plan(config, workload, 1, hw, training, attention, mla=mla)
    return (report.candidates or report.too_big)[0]


def _fit(
    config: ModelConfig,
    workload: Workload,
    hw: Hardware,
    needs: float,
    known: dict[str, Any],
    attention: str,
    training: TrainingOptions | None = None,
    mla: str = "auto",
) -> dict[str, Any]:
    """Whether `needs` bytes fit one device (with `known` figures beside it), and if not the
    fewest devices a layout of the step holds it on."""
    out: dict[str, Any] = {"fits": needs <= hw.memory_bytes, "needs": needs}
    out["memory_bytes"] = hw.memory_bytes
    out |= known
    if out["fits"]:
        return out
    out["devices"] = out["layout"] = out["layout_memory_bytes"] = None
    if hw.interconnect_bandwidth is None:
        out["unplanned"] = f"{hw.name} has no links to lay a model out over"
        return out
    low = max(2, math.ceil(needs / hw.memory_bytes))
    found = fewest_devices(config, workload, hw, low, training, attention, mla=mla)
    if isinstance(found, str):
        out["unplanned"] = found
        return out
    n, best = found
    s = best["strategy"]
    out["devices"] = n
    out["layout"] = {k: s[k] for k in ("tp", "pp", "ep") if s[k] > 1}
    out["layout_memory_bytes"] = best["memory_bytes"]
    return out


def fewest_devices(
    config: ModelConfig,
    workload: Workload,
    hw: Hardware,
    low: int,
    training: TrainingOptions | None = None,
    attention: str = "flash",
    pinned: dict[str, int] | None = None,
    mla: str = "auto",
) -> tuple[int, dict[str, Any]] | str:
    """The fewest devices from `low` up that a tensor x pipeline (x expert) layout of the model
    (with the sizes `pinned`) fits on, and plan's best layout of them; else why none was found
    (the search's end)."""
    top = min(low + SEARCHED, MAX_DEVICES)
    pins = PINNED | (pinned or {})
    for n in range(low, top + 1):
        try:
            report = plan(config, workload, n, hw, training, attention, pins, mla=mla)
        except GraphllmError:
            continue  # no legal layout of n devices (heads or layers do not divide)
        if report.candidates:
            return n, report.candidates[0]  # the fastest that fits, as plan lists it first
    return f"no layout of {low} to {top} devices fits"
