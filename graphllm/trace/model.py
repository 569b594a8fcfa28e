"""A config.json -> its traced Graph at a workload: record at the probes, fit, lower."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from typing import Any

from graphllm.errors import ConfigError
from graphllm.ir import Graph
from graphllm.models.quantization import Quantization
from graphllm.models.workload import Workload
from graphllm.ops.generic import ensure_row
from graphllm.trace.capture import Val
from graphllm.trace.forward import record
from graphllm.trace.hf import causal_lm, checkpoint_names, hf_config, parallel_plans
from graphllm.trace.layers import expand, representatives
from graphllm.trace.lower import Fitted, lower
from graphllm.trace.relation import read_relation
from graphllm.trace.store import load as load_stored
from graphllm.trace.store import lowered_key, stored_key
from graphllm.trace.store import save as save_stored
from graphllm.trace.stored import quantized_modules, traced_quantization
from graphllm.trace.symbolic import (
    DECODE_PROBES,
    PREFILL_PROBES,
    Point,
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
    quantization: Quantization | None = None  # how its checkpoint stores the weights
    is_mla: bool = False
    num_nextn_predict_layers: int = 0
    norm_weight_offset: float = 0.0  # random norm weights are drawn about 1 (build.weights)
    num_hidden_layers: int = 0
    vocab_size: int = 0
    sliding_rope: None = None
    frontend: str = FRONTEND
    max_position_embeddings: int = 0
    latent_attention: bool = False  # transformers' MLA, traced in its naive form
    # the config.json fields it was traced from: what traces it again at another workload
    raw: dict[str, Any] | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

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
    quantization = traced_quantization(raw)  # refused before any tracing
    dtype = "fp32" if values else _trace_dtype(wl.act_dtype)
    spans = _spans_of(raw)
    points = probes(wl, spans)
    stored = stored_key(raw, points, dtype, values)
    label = str(name or raw.get("_name_or_path") or raw.get("model_type"))
    lowered = lowered_key(stored, wl.to_dict(), label)
    graph = load_stored(lowered)
    if isinstance(graph, Graph):  # this workload lowered before: a read
        for n in graph.nodes():
            ensure_row(n.op)
        return graph
    fitted = load_stored(stored)
    if not isinstance(fitted, Fitted):
        fitted = _fitted(hf_config(raw), points, dtype, values)
        save_stored(stored, fitted)
    fitted.name = label
    # a graph that runs computes at its dtype; the reader of its weights still needs the
    # checkpoint's formats (graphllm.build.weights)
    storage = None if values else quantization
    fitted.meta = dict(
        fitted.meta,
        config=replace(fitted.meta["config"], name=label, raw=raw, quantization=quantization),
        workload=wl,
        frontend=FRONTEND,
        act_dtype=wl.act_dtype,
        stream_dtype=wl.stream_dtype,
        # a quantized checkpoint's weights are as it stores them (graphllm.trace.stored)
        weight_dtype=storage.weights.dtype if storage else wl.weight_dtype,
        kv_dtype=wl.kv_dtype,
        quantization=storage,
        mla=None,
    )
    if values and quantization is not None:
        fitted.meta["checkpoint_quantization"] = quantization
    graph = lower(fitted, (wl.batch, wl.seq_len, wl.past_len))
    save_stored(lowered, graph)
    return graph


def _fitted(cfg: Any, points: tuple, dtype: str, values: bool) -> Fitted:
    """Record the model at `points`, fit its sizes, write its repeated layers out and read
    its masks' relations: all a lowering at any workload of the phase needs."""
    model = causal_lm(cfg, values, dtype)
    recs = [record(model, p) for p in points]
    shapes, args = fit_recordings(recs, points)
    long = check_point(points, _span(cfg), _windowed(points, _spans(cfg)))
    check_fit(recs[0], record(model, long), shapes, long, points[0])
    rec = recs[0]
    args = expand(rec, args, shapes, rec.layers)
    read = _read_tensors(rec)
    _refuse_unread(model, {name for v, (kind, name) in rec.sources.items() if v in read})
    for ev in rec.events:
        if ev.op == "mask":  # the function itself does not outlive this process
            # a mask no layer reads (Qwen2-MoE's sliding one, with no sliding layer) says nothing
            used = ev.outs[0] in read
            relation = read_relation(ev.kwargs["function"]) if used else {}
            ev.kwargs = {"relation": relation, "additive": bool(ev.kwargs.get("additive"))}
    meta = {"config": traced_config(cfg, cfg.model_type), "window": _windowed(points, _spans(cfg))}
    meta["stored_as"] = checkpoint_names(model)
    meta["quantized_modules"] = quantized_modules(model)
    # each repeating layer -> the first layer of its kind (the report's layer kinds)
    meta["layer_kinds"] = dict(representatives(model))
    meta |= parallel_plans(model)
    return Fitted(rec, shapes, args, size_roles(cfg), points[0], meta=meta)


def _refuse_unread(model: Any, read: set[str]) -> None:
    """A model whose text forward leaves some of its weights unread (an image encoder, a
    cross-attention to one, XLNet's segment embeddings) is more than the graph would hold:
    refused, naming them."""
    unread = {n: p.numel() for n, p in model.named_parameters() if n not in read}
    if not unread:
        return
    modules = [
        path
        for path, m in model.named_modules()
        if path
        and all(f"{path}.{n}" in unread for n, _ in m.named_parameters())
        and any(True for _ in m.parameters())
    ]
    tops = [p for p in modules if not any(p.startswith(q + ".") for q in modules)]
    named = ", ".join(tops[:3]) + (f" and {len(tops) - 3} more" if len(tops) > 3 else "")
    raise ConfigError(
        f"the model's text forward never reads {sum(unread.values())} of its parameters "
        f"({named or ', '.join(list(unread)[:3])}): what runs only on inputs graphllm does "
        "not model (another modality's encoder, a cross-attention to one, segment embeddings)"
    )


def _read_tensors(rec: Any) -> set[int]:
    """The tensors some event of `rec` reads."""
    out: set[int] = set()

    def walk(x: Any) -> None:
        if isinstance(x, Val):
            out.add(x.vid)
        elif isinstance(x, (tuple, list)):
            for v in x:
                walk(v)

    for ev in rec.events:
        walk(ev.args)
    return out


# config fields holding a span of positions past which transformers' cache code takes another
# path (a sliding-window layer keeps W - 1 past keys, a chunked one its chunk's)
_SPANS = ("sliding_window", "attention_chunk_size", "sliding_window_size", "local_window_size")
# past this many keys a layer attends to the ones it selects at run time (Doge's dynamic mask
# keeps each query's top keep_window_size keys): below it every key is attended
_SELECTING = "keep_window_size"
_SPANS += (_SELECTING,)


def _spans(cfg: Any) -> dict[str, int]:
    """The model's windows and chunks: config field -> positions."""
    return {f: v for f in _SPANS if isinstance(v := field_of(cfg, f, None), int) and v > 0}


def _span(cfg: Any) -> int | None:
    """The smallest window or chunk of the model's layers, if any."""
    spans = _spans(cfg)
    return min(spans.values()) if spans else None


def _spans_of(raw: dict[str, Any]) -> dict[str, int]:
    """`_spans` of the config `raw` describes, kept beside the traces so that a model read
    from the cache needs no transformers to choose its probes."""
    key = stored_key(raw, (), "spans", False)
    spans = load_stored(key)
    if not isinstance(spans, dict):
        spans = _spans(hf_config(raw))
        save_stored(key, spans)
    return spans


def probes(wl: Workload, spans: dict[str, int]) -> tuple[Point, ...]:
    """The probes of the workload's phase and regime: below every window, or (a sliding
    window's model asked for more positions than the window) past it, where each windowed
    layer keeps its last W - 1 keys and its sizes follow other lines."""
    points = DECODE_PROBES if wl.past_len else PREFILL_PROBES
    selects = spans.get(_SELECTING)
    if selects is not None and wl.key_len > selects:
        raise ConfigError(
            f"past {selects} keys ({_SELECTING}) each query attends to the {selects} keys its "
            "dynamic mask ranks highest (a top-k over the keys, chosen at run time): sparse "
            "attention, which graphllm does not model yet"
        )
    spans = {k: v for k, v in spans.items() if k != _SELECTING}
    if not spans:
        return points
    span = min(spans.values())
    grown = wl.past_len if wl.past_len else wl.seq_len
    if wl.key_len < span - 1:
        if max(t + p for _, t, p in points) >= span - 1:
            raise ConfigError(f"a window of {span} positions is too short to trace this model at")
        return points
    if set(spans) != {"sliding_window"} or grown < span - 1:
        raise ConfigError(
            f"the traced graph holds up to {span - 2} positions (its layers' window or chunk "
            f"is {span}) or, for a sliding window, from {span - 1} past (or new) tokens on; "
            f"this workload has {wl.key_len}: between the two, or past a chunk, the cache "
            "is cut in a way the trace does not model yet"
        )
    if wl.past_len:
        return tuple((b, t, span + p) for b, t, p in points)
    return tuple((b, span + t, 0) for b, t, _ in points)


def _windowed(points: tuple[Point, ...], spans: dict[str, int]) -> int | None:
    """The window whose far side `points` probe (the long regime's), else None."""
    if not spans or "sliding_window" not in spans:
        return None
    w = spans["sliding_window"]
    return w if min(max(t, p) for _, t, p in points) >= w - 1 else None


def field_of(cfg: Any, name: str, default: Any = None) -> Any:
    """A config field, or `default` where the config has none or no one value of it (Gemma 4's
    head_dim differs by layer, and its config refuses to give one)."""
    try:
        return getattr(cfg, name, default)
    except Exception:
        return default


def _trace_dtype(act: str) -> str:
    if act in ("fp32", "bf16", "fp16"):
        return act
    raise ConfigError(f"a traced model computes in fp32, bf16 or fp16, not {act}")


def size_roles(cfg: Any) -> dict[int, tuple[str, str]]:
    out: dict[int, tuple[str, str]] = {}
    for field, name, role in _SIZE_FIELDS:
        v = field_of(cfg, field, None)
        if field == "head_dim" and v is None and field_of(cfg, "num_attention_heads", None):
            v = cfg.hidden_size // cfg.num_attention_heads
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            out.setdefault(v, (name, role))
    return out


def traced_config(cfg: Any, name: str) -> TracedConfig:
    experts = next(
        (
            field_of(cfg, f)
            for f in ("num_local_experts", "num_experts", "n_routed_experts")
            if isinstance(field_of(cfg, f, None), int)
        ),
        0,
    )
    return TracedConfig(
        name=name,
        model_type=cfg.model_type,
        tie_word_embeddings=bool(field_of(cfg, "tie_word_embeddings", False)),
        num_experts=experts or 0,
        num_experts_per_tok=int(field_of(cfg, "num_experts_per_tok", 0) or 0),
        text_decoder_of=field_of(cfg, "multimodal_model_type", ""),
        num_hidden_layers=int(field_of(cfg, "num_hidden_layers", 0) or 0),
        vocab_size=int(field_of(cfg, "vocab_size", 0) or 0),
        max_position_embeddings=_int_field(cfg, "max_position_embeddings"),
        latent_attention=bool(_int_field(cfg, "kv_lora_rank")),
    )


def _int_field(cfg: Any, name: str) -> int:
    v = field_of(cfg, name, 0)
    return v if isinstance(v, int) and not isinstance(v, bool) else 0
