"""The workload a user asks for: what they give over a YAML config's `workload:` section over
the defaults, and the checkpoint's stored weight format dropped when they name a weight dtype.
One merge for the command line (cli/common.resolve_sweep) and the Python API
(graphllm.analyse), so that the same request prices the same bytes in both."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from graphllm.errors import ConfigError
from graphllm.models.config import WORKLOAD_KEYS
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload

DEFAULT_SEQ_LEN = 2048  # new tokens T when neither the user nor the file says: a typical prompt
PER_KIND_DTYPES = ("weight_dtype", "act_dtype", "kv_dtype")


@dataclass(frozen=True)
class Requested:
    """The model and workloads a request resolves to.

    `dropped_quantization`: the checkpoint's quantization method that a weight dtype overrode
    (None: the stored format is kept); `overridden_by`: the given field that overrode it
    ('weight_dtype' or 'dtype'), None when the config's workload section did.
    """

    config: ModelConfig
    workloads: tuple[Workload, ...]
    dropped_quantization: str | None = None
    overridden_by: str | None = None


def merge_workload(
    config: ModelConfig,
    section: Mapping[str, Any],
    given: Mapping[str, Any],
    seq_lens: Sequence[int] = (),
    stored: bool = True,
) -> Requested:
    """The workloads of `given` (the user's fields; None: not given) over `section` (a YAML
    config's workload section) over T=DEFAULT_SEQ_LEN, one per entry of `seq_lens` (a sweep;
    empty: the merged seq_len).

    A `dtype` given resets the section's per-kind dtypes that are not given too: it names all
    three. With `stored` (the analysis models the checkpoint's storage), a weight dtype named
    anywhere overrides a quantized checkpoint's stored format, so `config` comes back without
    its quantization; an export, which computes at its dtype whatever the storage, passes False.

    Raises:
        ConfigError: a field that is not a workload's, or a value Workload refuses.
    """
    unknown = sorted(str(k) for k in given if k not in WORKLOAD_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown workload field {unknown[0]!r}; known: {', '.join(WORKLOAD_KEYS)}"
        )
    flags = {k: v for k, v in given.items() if v is not None}
    merged = {"seq_len": DEFAULT_SEQ_LEN} | dict(section) | flags
    if "dtype" in flags:
        for k in PER_KIND_DTYPES:
            if k not in flags:
                merged.pop(k, None)
    workloads = tuple(Workload.with_dtype(None, **(merged | {"seq_len": t})) for t in seq_lens) or (
        Workload.with_dtype(None, **merged),
    )
    named = merged.get("weight_dtype") or merged.get("dtype")
    if not (stored and config.quantization is not None and named):
        return Requested(config, workloads)
    by = next((k for k in ("weight_dtype", "dtype") if k in flags), None)
    method = config.quantization.method
    return Requested(replace(config, quantization=None), workloads, method, by)
