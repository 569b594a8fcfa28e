"""A config.json -> its traced Graph at a workload: record at the probes, fit, lower."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from graphllm.errors import ConfigError
from graphllm.ir import Graph
from graphllm.models.workload import Workload
from graphllm.trace.forward import record
from graphllm.trace.hf import causal_lm, hf_config
from graphllm.trace.layers import expand
from graphllm.trace.lower import Fitted, lower
from graphllm.trace.relation import read_relation
from graphllm.trace.store import load as load_stored
from graphllm.trace.store import save as save_stored
from graphllm.trace.store import stored_key
from graphllm.trace.symbolic import (
    DECODE_PROBES,
    PREFILL_PROBES,
    check_fit,
    check_point,
    fit_recordings,
)

FRONTEND = "traced"


@dataclass(frozen=True)
class TracedConfig:
    """What the passes read of a model's config, for a traced model (a built one's is its
    ModelConfig): its name and type, tied head, routed experts."""

    name: str
    model_type: str
    tie_word_embeddings: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    text_decoder_of: str = ""
    quantization: None = None
    is_mla: bool = False
    num_nextn_predict_layers: int = 0
    norm_weight_offset: float = 0.0  # random norm weights are drawn about 1 (build.weights)
    num_hidden_layers: int = 0
    sliding_rope: None = None
    frontend: str = FRONTEND

    def rotates(self, layer: int) -> bool:
        """Whether a layer rotates q and k (RoPE): unknown of a traced model, so no layer is
        labelled NoPE."""
        return True


# config fields -> the dim name and role a constant size of that value gets, first match wins
_SIZE_FIELDS = (
    ("hidden_size", "d", "hidden"),
    ("vocab_size", "vocab", "vocab"),
    ("num_attention_heads", "h", "head"),
    ("num_key_value_heads", "h_kv", "kv_head"),
    ("head_dim", "d_h", "head_dim"),
    ("intermediate_size", "ffn", "ffn"),
    ("moe_intermediate_size", "ffn_e", "ffn"),
    ("num_local_experts", "e", "expert"),
    ("num_experts", "e", "expert"),
    ("n_routed_experts", "e", "expert"),
    ("num_experts_per_tok", "k", "topk"),
)


def traced_graph(
    raw: dict[str, Any],
    workload: Workload | None = None,
    name: str | None = None,
    values: bool = False,
) -> Graph:
    """The Graph of the causal LM that config.json fields `raw` describe, traced from
    transformers' code at `workload` (default: B=1, T=1, P=0). `values`: build the model with
    (random) values on the CPU, so the constants it computes (RoPE tables) are in the graph and
    it runs; otherwise on the meta device, any size."""
    wl = workload or Workload()
    dtype = "fp32" if values else _trace_dtype(wl.act_dtype)
    points = DECODE_PROBES if wl.past_len else PREFILL_PROBES
    stored = stored_key(raw, points, dtype, values)
    fitted = load_stored(stored)
    if not isinstance(fitted, Fitted):
        cfg = hf_config(raw)
        _check_window(_span(cfg), points, None)
        fitted = _fitted(cfg, points, dtype, values)
        save_stored(stored, fitted)
    _check_window(fitted.meta["span"], points, wl)
    label = str(name or raw.get("_name_or_path") or fitted.meta["config"].model_type)
    fitted.name = label
    fitted.meta = dict(
        fitted.meta,
        config=replace(fitted.meta["config"], name=label),
        workload=wl,
        frontend=FRONTEND,
        act_dtype=wl.act_dtype,
        stream_dtype=wl.stream_dtype,
        weight_dtype=wl.weight_dtype,
        kv_dtype=wl.kv_dtype,
        quantization=None,
        mla=None,
    )
    return lower(fitted, (wl.batch, wl.seq_len, wl.past_len))


def _fitted(cfg: Any, points: tuple, dtype: str, values: bool) -> Fitted:
    """Record the model at `points`, fit its sizes, write its repeated layers out and read
    its masks' relations: all a lowering at any workload of the phase needs."""
    model = causal_lm(cfg, values, dtype)
    recs = [record(model, p) for p in points]
    shapes, args = fit_recordings(recs, points)
    long = check_point(points, _span(cfg))
    check_fit(recs[0], record(model, long), shapes, long, points[0])
    rec = recs[0]
    args = expand(rec, args, shapes, rec.layers)
    for ev in rec.events:
        if ev.op == "mask":  # the function itself does not outlive this process
            ev.kwargs = {"relation": read_relation(ev.kwargs["function"])}
    meta = {"config": traced_config(cfg, cfg.model_type), "span": _span(cfg)}
    return Fitted(rec, shapes, args, size_roles(cfg), points[0], meta=meta)


# config fields holding a span of positions past which transformers' cache code takes another
# path (a sliding-window layer keeps W - 1 past keys, a chunked one its chunk's)
_SPANS = ("sliding_window", "attention_chunk_size", "sliding_window_size", "local_window_size")


def _span(cfg: Any) -> int | None:
    """The smallest window or chunk of the model's layers, if any."""
    spans = [v for f in _SPANS if isinstance(v := getattr(cfg, f, None), int) and v > 0]
    return min(spans) if spans else None


def _check_window(span: int | None, points: tuple, wl: Workload | None) -> None:
    """A traced graph holds while every layer keeps every past key: the probes and the
    workload both below the smallest window or chunk (beyond it the cache is cut, a branch on
    the length that one trace does not see)."""
    if span is None:
        return
    if max(t + p for _, t, p in points) >= span - 1:
        raise ConfigError(f"a window of {span} positions is too short to trace this model at")
    if wl is not None and wl.key_len >= span - 1:
        raise ConfigError(
            f"the traced graph holds up to {span - 2} positions (its layers' window or chunk "
            f"is {span}); this workload has {wl.key_len}: the cache of its windowed layers "
            "is cut past that, which the trace does not model yet"
        )


def _trace_dtype(act: str) -> str:
    if act in ("fp32", "bf16", "fp16"):
        return act
    raise ConfigError(f"a traced model computes in fp32, bf16 or fp16, not {act}")


def size_roles(cfg: Any) -> dict[int, tuple[str, str]]:
    out: dict[int, tuple[str, str]] = {}
    for field, name, role in _SIZE_FIELDS:
        v = getattr(cfg, field, None)
        if field == "head_dim" and v is None and getattr(cfg, "num_attention_heads", None):
            v = cfg.hidden_size // cfg.num_attention_heads
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            out.setdefault(v, (name, role))
    return out


def traced_config(cfg: Any, name: str) -> TracedConfig:
    experts = next(
        (
            getattr(cfg, f)
            for f in ("num_local_experts", "num_experts", "n_routed_experts")
            if isinstance(getattr(cfg, f, None), int)
        ),
        0,
    )
    return TracedConfig(
        name=name,
        model_type=cfg.model_type,
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        num_experts=experts or 0,
        num_experts_per_tok=int(getattr(cfg, "num_experts_per_tok", 0) or 0),
        text_decoder_of=getattr(cfg, "multimodal_model_type", ""),
        num_hidden_layers=int(getattr(cfg, "num_hidden_layers", 0) or 0),
    )
