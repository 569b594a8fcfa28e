"""A fitted recording -> a graphllm Graph at one workload.

Units become the rows graphllm's builder uses (`linear`, `embedding`, and core attention as
scores, scale, mask, softmax and PV, with the mask's relation read from the model's mask
function); every other aten op becomes a generic row (graphllm.ops.generic) whose signature
says how its axes line up, so shapes, FLOPs, bytes and token mixing follow from the table's
rules. The mask's own computation is folded away: its relation is kept on the attention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from graphllm.errors import ConfigError, GraphError
from graphllm.ir import TOKEN_ROLES, Dim, Graph, Node, Ref, TensorType
from graphllm.ir.signature import SCALAR
from graphllm.ops import OPS
from graphllm.ops.generic import ATEN, generic_row
from graphllm.trace.capture import Event, Recording, Val
from graphllm.trace.experts import lower_experts, lower_experts_map, lower_experts_reduce
from graphllm.trace.recurrences import (
    carried_states,
    conv_carried,
    lower_carried_conv,
    lower_conv,
    lower_delta,
    lower_lightning,
    lower_lru,
    lower_ssm,
    lower_ssm1,
    lower_wkv,
    padded_conv_reader,
    select_head,
)
from graphllm.trace.scopes import param_kind, scope_kinds
from graphllm.trace.selection import Selection, follow, select, selected_keys
from graphllm.trace.stored import checkpoint_form, stored_form
from graphllm.trace.symbolic import Expr, Point, concrete

NEW = ("P", "P+T")
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_POINTWISE_MOVES = {"clone", "alias", "detach", "lift_fresh", "lift_fresh_copy", "copy"}
_VIEWS = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze"}
_CREATION_FILL = {"zeros": 0, "zeros_like": 0, "new_zeros": 0, "ones": 1, "ones_like": 1}
_CREATION_FILL |= {"new_ones": 1, "empty": 0, "empty_like": 0, "new_empty": 0}


@dataclass
class Fitted:
    """A recording with its sizes as functions of the workload (graphllm.trace.symbolic)."""

    rec: Recording
    shapes: dict[int, tuple[Expr, ...]]
    args: list[Any]
    size_roles: dict[int, tuple[str, str]]  # a constant size -> (dim name, role)
    probe: Point  # the point `rec` was recorded at
    name: str = "model"
    meta: dict[str, Any] = field(default_factory=dict)


def lower(fitted: Fitted, point: Point) -> Graph:
    """The Graph of `fitted` at workload point (B, T, P)."""
    return _Lowering(fitted, point).run()


class _Lowering:
    def __init__(self, fitted: Fitted, point: Point) -> None:
        self.f, self.rec, self.point = fitted, fitted.rec, point
        self.g = Graph(fitted.name, self._bindings())
        self.refs: dict[int, Ref] = {}
        self.masks: dict[int, dict[str, Any]] = {}
        self.selections: dict[int, Selection] = {}  # graphllm.trace.selection
        self.dims: dict[Expr, Dim] = {}
        # (tensor, axis) -> its dim where the size alone does not say it (a fixed number of
        # positions cut from the end of a token axis)
        self.axis_dims: dict[tuple[int, int], Dim] = {}
        self.scopes = scope_kinds(self.rec.modules)
        for ev in self.rec.events:  # RWKV's RwkvSelfAttention runs a recurrence, no attention
            if ev.op == "wkv":
                self.scopes[ev.scope] = "linear_attention"
        self.unit_scopes: set[tuple[str, str]] = set()
        self.carried: dict[int, tuple[int, int | None]] | None = None  # Mamba-1's, on first use
        self.lowered: set[int] = set()  # events lowered with an earlier one (by id)
        self.g.meta.update(fitted.meta)
        self.g.meta["scopes"] = self.scopes

    def _bindings(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for shape in self.f.shapes.values():
            for e in shape:
                if not e.constant:
                    out[e.name] = e.value(*self.point)
        b, t, p = self.point
        out.update(B=b, T=t, P=p, S=p + t)
        return out

    # -- dims ------------------------------------------------------------------------------------
    def dim(self, e: Expr) -> Dim:
        d = self.dims.get(e)
        if d is None:
            d = self.dims[e] = self._make_dim(e)
            if not e.constant:  # what a symbolic export computes it from
                self.g.meta.setdefault("sizes", {})[d.name] = e
        return d

    def const_dim(self, size: int) -> Dim:
        """The axis of a constant size, named as a recorded one of that size is."""
        name, role = self.f.size_roles.get(size, (str(size), "hidden"))
        return Dim(name, role, size)

    def _make_dim(self, e: Expr) -> Dim:
        window = self.f.meta.get("window")
        if window is not None and e.b == 0 and e.p == 0 and e.c == window - 1 and e.t in (0, 1):
            return self._window_dim(e, window - 1)
        if e.constant:
            return self.const_dim(e.c)
        if e.t == 0 and e.p == 0:
            return Dim(e.name, "batch")
        if e.c == 0 and e.t == 1 and e.p == 0:
            return Dim(e.name, "token", positions=NEW)
        if e.c == 0 and e.t == 1 and e.p == 1:
            return Dim(e.name, "key_token", positions=("0", "P+T"))
        if e.c == 0 and e.t == 0 and e.p == 1:
            return Dim(e.name, "key_token", positions=("0", "P"))
        return Dim(e.name, "token" if e.t else "key_token")

    def _window_dim(self, e: Expr, kept: int) -> Dim:
        """Past a sliding window: a windowed layer's cache (its last W - 1 keys) and the keys
        it attends over in a step (those and the T new ones)."""
        past = self.point[2] > 0
        if e.t:  # W - 1 + T keys, the last W - 1 past ones and the new
            return Dim(e.name, "key_token", positions=(f"P-{kept}", "P+T"))
        where = (f"P-{kept}", "P") if past else (f"P+T-{kept}", "P+T")
        return Dim("P_w" if past else "T_w", "key_token", kept, positions=where)

    def type_of(self, vid: int) -> TensorType:
        dims = tuple(
            self.axis_dims.get((vid, i)) or self.dim(e) for i, e in enumerate(self.f.shapes[vid])
        )
        return TensorType(dims, self.rec.dtypes[vid])

    def after_state(self, ev: Event, types: list[TensorType], args: Any) -> None:
        """A cat of a carried state's c entries (a past input: a conv state's last inputs)
        and the new tokens along their axis holds positions P-c .. P+T."""
        a = concrete(args, self.point)
        dim = (a[1] if len(a) > 1 else 0) % types[0].rank
        e = self.f.shapes[ev.outs[0]][dim]
        axes = [t.dims[dim] for t in types]
        if len(types) != 2 or e.t != 1 or e.p or e.b or e.c <= 0 or axes[1].positions != NEW:
            return
        if axes[0].size != e.c:
            return
        name = f"{e.name}_past"
        self.g.bindings[name] = e.value(*self.point)
        self.g.meta.setdefault("sizes", {})[name] = e
        span = Dim(name, "key_token", positions=(f"P-{e.c}", "P+T"))
        self.axis_dims[(ev.outs[0], dim)] = span

    def last_positions(self, ev: Event, src: TensorType, args: Any) -> None:
        """A slice keeping the last c positions of a token axis (a conv's state: the last K
        inputs) keeps positions stop-c .. stop: a position axis, not c hidden entries."""
        a = concrete(args, self.point)
        dim = (a[1] if len(a) > 1 else 0) % src.rank
        e = self.f.shapes[ev.outs[0]][dim]
        d = src.dims[dim]
        if not e.constant or d.role not in TOKEN_ROLES or d.positions is None:
            return
        start, end = (a[2] if len(a) > 2 else 0), (a[3] if len(a) > 3 else None)
        size = d.size if d.size is not None else self.g.bindings.get(d.name)
        reaches_end = end is None or size is None or end >= size
        if not reaches_end or start is None or not (start < 0 or start == (size or 0) - e.c):
            return
        self.axis_dims[(ev.outs[0], dim)] = _last(e.c, d)

    def pad_positions(self, ev: Event, src: TensorType, args: Any) -> None:
        """Zeros put before a token axis to make it c positions long (a first step's conv
        state, K - T zeros before it; a negative pad cuts a longer step to its last K) keep
        positions stop-c .. stop, as a slice of the last c does."""
        a = concrete(args, self.point)
        pads, value = a[1], (a[2] if len(a) > 2 and a[2] is not None else 0)
        shape = self.f.shapes[ev.outs[0]]
        for i in range(len(pads) // 2):
            dim = src.rank - 1 - i
            e, d = shape[dim], src.dims[dim]
            plain = value == 0 and pads[2 * i + 1] == 0
            if plain and e.constant and d.role in TOKEN_ROLES and d.positions is not None:
                self.axis_dims[(ev.outs[0], dim)] = _last(e.c, d)

    # -- the walk --------------------------------------------------------------------------------
    def run(self) -> Graph:
        for i, ev in enumerate(self.rec.events):
            if id(ev) in self.lowered:
                continue
            try:
                self.event(ev, self.f.args[i])
            except GraphError as e:
                raise ConfigError(
                    f"cannot lower {ev.op} in {ev.scope or 'the model'}: {e}"
                ) from None
        for name, (vid, role) in self.rec.outputs.items():
            self.g.set_output(name, self.ref(vid), role)
        _drop_unread(self.g)
        self.g.meta["blocks"] = _blocks(self.g, self.scopes)
        return self.g

    def ref(self, vid: int) -> Ref:
        r = self.refs.get(vid)
        if r is not None:
            return r
        kind, name = self.rec.sources.get(vid, ("", ""))
        t = self.type_of(vid)
        if kind == "param":
            weight = param_kind(name, self.scopes)
            t = self.expert_axis(t, weight)
            extra: dict[str, Any] = {"stacked": "expert"} if weight == "moe_experts" else {}
            stored = self.f.meta.get("stored_as", {}).get(name)
            if stored is not None:  # what checkpoints call it
                extra["stored_as"] = stored
            t, form = self.stored_form(name, weight, t, stored)
            extra |= form
            node = self.g.param(name, t, kind=weight, **extra)
        elif kind == "input":
            node = self.g.input(name, t)
        elif kind == "constant":
            value = self.rec.values.get(vid)
            node = self.g.add(
                "constant", self.unique(name or "constant"), (), {"type": t, "value": value}
            )
        else:
            raise ConfigError(f"a traced tensor ({vid}) is used before it is made")
        self.refs[vid] = Ref(node.name)
        return self.refs[vid]

    def stored_form(
        self, name: str, weight: str, t: TensorType, stored: Any
    ) -> tuple[TensorType, dict[str, Any]]:
        """A param as its checkpoint stores it (graphllm.trace.stored): quantized where the
        graph models the storage; where it computes at its dtype (a graph that runs), the
        checkpoint's format of each param kept for the reader of its weights."""
        model = self.f.meta.get("quantized_modules", {})
        q = self.f.meta.get("quantization")
        if q is not None:
            return stored_form(q, name, weight, model, t, stored)
        q = self.f.meta.get("checkpoint_quantization")
        if q is not None:
            form = checkpoint_form(q, name, weight, model, t, stored)
            self.g.meta.setdefault("checkpoint_formats", {})[name] = form
        return t, {}

    def expert_axis(self, t: TensorType, weight: str) -> TensorType:
        """An experts' stack or a router's weight leads with the expert axis, whatever other
        size of the config it equals (Mixtral's 8 experts and 8 KV heads, Qwen3-30B-A3B's 128
        experts and head dim): the role by size alone takes the first field of that size."""
        experts = getattr(self.f.meta.get("config"), "num_experts", 0)
        if weight not in ("moe_experts", "router") or not experts or t.rank < 1:
            return t
        if t.dims[0].size != experts or t.dims[0].role == "expert":
            return t
        return TensorType((Dim("e", "expert", experts), *t.dims[1:]), t.dtype)

    def expert_carried(self, vid: int, ins: list[TensorType], scope: str) -> TensorType:
        """type_of `vid`, an axis of the size of an input's expert axis taken for that axis (a
        router's scores softmaxed, cast, compared), and in an MoE block's code an axis of the
        experts' count for the expert axis (Llama 4's tokens viewed per expert): named by its
        size alone, it would be another field's of that size."""
        t = self.type_of(vid)
        experts = {d.size: d for x in ins for d in x.dims if d.role == "expert"}
        count = getattr(self.f.meta.get("config"), "num_experts", 0)
        if count and _innermost_kind(self.scopes, scope) in ("experts", "router", "moe"):
            experts.setdefault(count, Dim("e", "expert", count))
        if not experts:
            return t
        for k, d in enumerate(t.dims):
            e = experts.get(d.size)
            if e is not None and d != e and d.size is not None and d.role not in TOKEN_ROLES:
                self.axis_dims[(vid, k)] = e
        return self.type_of(vid)

    def unique(self, name: str) -> str:
        if name not in self.g:
            return name
        i = 1
        while f"{name}_{i}" in self.g:
            i += 1
        return f"{name}_{i}"

    def unit_scope(self, ev: Event, default: str) -> str:
        """The scope of a unit's nodes: its module's, with _2, _3 ... for the unit's later
        calls there (a looped model runs a layer's conv more than once a forward)."""
        base = scope = ev.scope or default
        i = 1
        while (ev.op, scope) in self.unit_scopes:
            i += 1
            scope = f"{base}_{i}"
        self.unit_scopes.add((ev.op, scope))
        return scope

    def event(self, ev: Event, args: Any) -> None:
        if ev.op == "linear":
            self.linear(ev)
        elif ev.op == "attention":
            self.attention(ev)
        elif ev.op == "rmsnorm":
            ins = [self.ref(v.vid) for v in ev.args]
            self.out(ev, self.g.add("rmsnorm", self.unique(ev.scope or "norm"), ins, ev.kwargs))
            self.scopes.setdefault(ev.scope, "norms")
        elif ev.op == "experts":
            ins = [self.ref(v.vid) for v in ev.args]
            p = self.unit_scope(ev, "experts")
            out = lower_experts(self.g, p, ins, ev.kwargs, self.const_dim)
            self.refs[ev.outs[0]] = out
        elif ev.op in ("experts_map", "experts_reduce"):
            ins = [self.ref(v.vid) for v in ev.args]
            p = self.unit_scope(ev, ev.op)
            lowered = lower_experts_map if ev.op == "experts_map" else lower_experts_reduce
            self.refs[ev.outs[0]] = lowered(self.g, p, ins)
        elif ev.op == "mask":
            form = {"additive": True} if ev.kwargs.get("additive") else {}
            self.masks[ev.outs[0]] = {**ev.kwargs["relation"], **form}
        elif ev.op == "delta":
            ins = [None if v is None else self.ref(v.vid) for v in ev.args]
            out_t = self.type_of(ev.outs[0]).dims[1]
            node = lower_delta(self.g, self.unit_scope(ev, "delta"), ins, ev.kwargs, out_t)
            self.out(ev, node)
        elif ev.op == "ssm":
            ins = [None if v is None else self.ref(v.vid) for v in ev.args]
            out_t = self.type_of(ev.outs[0]).dims[1]
            self.out(ev, lower_ssm(self.g, self.unit_scope(ev, "ssm"), ins, ev.kwargs, out_t))
        elif ev.op == "ssm1":
            self.ssm1(ev)
        elif ev.op == "lightning":  # the decay tables beside the rate: parameters, unread
            ins = [None if v is None else self.ref(v.vid) for v in ev.args]
            out_t = self.type_of(ev.outs[0]).dims[2]
            p = self.unit_scope(ev, "lightning")
            self.out(ev, lower_lightning(self.g, p, ins, ev.kwargs, out_t))
        elif ev.op == "wkv":
            ins = [self.ref(v.vid) for v in ev.args]
            out_t = self.type_of(ev.outs[0]).dims[1]
            self.out(ev, lower_wkv(self.g, self.unit_scope(ev, "wkv"), ins, out_t))
        elif ev.op == "lru":
            ins = [None if v is None else self.ref(v.vid) for v in ev.args]
            out_t = self.type_of(ev.outs[0]).dims[1]
            self.out(ev, lower_lru(self.g, self.unit_scope(ev, "lru"), ins, out_t))
        elif ev.op == "conv":
            ins = [None if v is None else self.ref(v.vid) for v in ev.args]
            p = self.unit_scope(ev, "conv")
            out = lower_conv(self.g, p, ins, ev.kwargs)
            self.refs[ev.outs[0]] = out
        else:
            self.aten(ev, args)

    # -- units -----------------------------------------------------------------------------------
    def ssm1(self, ev: Event) -> None:
        if self.carried is None:
            self.carried = carried_states(self.rec)
        p = self.unit_scope(ev, "ssm")
        state: Ref | None = None
        step = self.g.bindings["T"] == 1 and self.g.bindings["P"] > 0
        if step and ev.outs[1] not in self.carried:  # transformers steps from a state: which?
            raise ConfigError(
                f"{p}: a one-token step reads the Mamba-1 scan's cached state, and graphllm "
                "does not find the cache entry it is kept in"
            )
        if step:  # what the step reads
            vid, head = self.carried[ev.outs[1]]
            state = self.ref(vid)
            if head is not None:
                state = select_head(self.g, f"{p}.carried_state", state, head)
        ins = [self.ref(v.vid) for v in ev.args]
        out_t = self.type_of(ev.outs[0]).dims[2]
        self.out(ev, lower_ssm1(self.g, p, ins, out_t, state))

    def causal_conv(self, ev: Event) -> bool:
        """torch's causal depthwise conv1d and the slice keeping its first S outputs, as the
        causal conv row (recurrences.padded_conv_reader); False where it is not that pair."""
        reader = padded_conv_reader(self.rec, ev)
        if reader is None:
            return False
        x, w, b = ev.args[:3]
        ins = [self.ref(x.vid), self.ref(w.vid), None if b is None else self.ref(b.vid)]
        p = self.unit_scope(ev, "conv")
        carried = conv_carried(self.rec, ev)
        if carried is None:
            conv = lower_conv(self.g, p, ins, {"activation": None})
        else:  # the state the layer keeps, which transformers reads for one new token
            state, written = carried
            keep = self.rec.shapes[w.vid][-1] - 1
            e = Expr(0, keep, 1, 0)
            name = f"{e.name}_past"
            self.g.bindings[name] = e.value(*self.point)
            self.g.meta.setdefault("sizes", {})[name] = e
            span = Dim(name, "key_token", positions=(f"P-{keep}", "P+T"))
            conv, self.refs[written] = lower_carried_conv(self.g, p, ins, self.ref(state), span)
        self.refs[reader.outs[0]] = conv
        self.lowered.add(id(reader))
        return True

    def linear(self, ev: Event) -> None:
        x, w, b = ev.args
        ins = [self.ref(x.vid), self.ref(w.vid)] + ([self.ref(b.vid)] if b is not None else [])
        op = "linear_bias" if b is not None else "linear"
        name = self.unique(ev.scope or "linear")
        self.out(ev, self.g.add(op, name, ins, {}))

    def attention(self, ev: Event) -> None:
        q, k, v, mask, sinks, *more = ev.args
        a = ev.kwargs
        extra = dict(zip(a.get("extra", ()), more, strict=True))
        p = f"{ev.scope}.core" if ev.scope else "attention"
        base, i = p, 1
        while f"{p}.scores" in self.g:  # the module attends twice (two groups of heads)
            i += 1
            p = f"{base}_{i}"
        self.scopes[p] = "core_attention"
        relation, masked_bias = self.attention_relation(ev, mask)
        if a.get("sliding_window") and not relation.get("window"):
            relation["window"] = int(a["sliding_window"])
        g = self.g
        qr, kr, vr = self.ref(q.vid), self.ref(k.vid), self.ref(v.vid)
        heads = g.type_of(qr).dims[1]
        if g.type_of(kr).dims[1] != heads:
            kr = Ref(g.add("repeat_kv", f"{p}.repeat_k", (kr,), {"axes": {"h": heads}}).name)
            vr = Ref(g.add("repeat_kv", f"{p}.repeat_v", (vr,), {"axes": {"h": heads}}).name)
        s = g.add("scores", f"{p}.scores", (qr, kr))
        scale = a.get("scaling")
        scale = scale if scale is not None else g.type_of(qr).dims[-1].size ** -0.5
        s = g.add("mul_const", f"{p}.scale", (s,), {"value": float(scale)})
        if a.get("softcap"):
            s = g.add("softcap", f"{p}.softcap", (s,), {"cap": float(a["softcap"])})
        if "position_bias" in extra:
            s = g.add("add", f"{p}.position_bias", (s, self.ref(extra["position_bias"].vid)))
        if masked_bias is not None:
            s = g.add("add", f"{p}.mask_bias", (s, masked_bias))
        selection = selected_keys(self, ev, extra.get("indices"))
        if selection is not None:  # within the relation, the keys a selecting module chose
            attrs = {**relation, "topk": selection.topk}
            s = g.add("mask_selected", f"{p}.mask", (s, selection.ref), attrs)
        else:
            s = g.add("mask", f"{p}.mask", (s,), relation)
        if sinks is not None:  # a sink logit a head, or one each query computes
            sink = self.ref(sinks.vid)
            op = "softmax_sink" if g.type_of(sink).rank == 1 else "softmax_token_sink"
            s = g.add(op, f"{p}.softmax", (s, sink))
        else:
            s = g.add("softmax", f"{p}.softmax", (s,))
        o = g.add("pv", f"{p}.pv", (s, vr))
        self.generic(
            ev, "permute", [Ref(o.name)], [g.type_of(Ref(o.name))], (None, (0, 2, 1, 3)), p
        )

    def attention_relation(self, ev: Event, mask: Val | None) -> tuple[dict[str, Any], Ref | None]:
        """The relation the attention's mask holds, and the mask itself where it is a bias the
        model's code made by applying the mask to values of its own (Doge's per-key dynamic
        mask, the minimum where the mask is False): added to the scores, then the relation."""
        relation = dict(self.masks.get(mask.vid, {})) if mask is not None else {}
        relation.pop("additive", None)
        if mask is not None and not relation:
            ref = self.ref(mask.vid)
            found = self.masked_by(ref)
            if found is None or self.g.type_of(ref).dtype == "bool":
                raise ConfigError(f"{ev.scope}: the attention mask is not one graphllm can read")
            return found, ref
        if not relation:
            relation = {"causal": bool(ev.kwargs.get("is_causal", True)), "window": None}
        return relation, None

    def masked_by(self, ref: Ref) -> dict[str, Any] | None:
        """The relation of the one `mask` row the tensor `ref` is computed from within its
        attention's module, else None."""
        scope = ref.node.rsplit(".", 1)[0]
        seen, todo, found = set(), [ref.node], []
        while todo:
            n = self.g[todo.pop()]
            if n.name in seen or not n.name.startswith(scope):
                continue
            seen.add(n.name)
            if n.op == "mask":
                found.append(dict(n.attrs))
            todo.extend(r.node for r in n.inputs)
        return found[0] if found and all(f == found[0] for f in found) else None

    # -- aten ops --------------------------------------------------------------------------------
    def aten(self, ev: Event, args: Any) -> None:
        kind = ev.op.split(".")[1]  # aten.<kind>.<overload>
        if kind.endswith("_") and not kind.endswith("__"):
            kind = kind[:-1]  # in place: its result is a new tensor here
        if kind in ("max", "min") and len(ev.outs) == 1:  # max.default: over every axis
            kind, args = f"a{kind}", (args[0], None, False)
        if kind == "log_sigmoid_forward":  # its second output is scratch for the backward
            kind, ev = "log_sigmoid", Event(ev.op, ev.args, ev.kwargs, ev.outs[:1], ev.scope)
        vals = _vals(args)
        if kind == "cat":  # an empty start (a cache's first keys) adds nothing
            vals = [v for v in vals if 0 not in self.rec.shapes[v.vid]]
        if kind == "topk" and "keep" in ev.kwargs:
            select(self, ev, self.ref(vals[0].vid))
            return
        if any(v.vid in self.masks for v in vals):
            self.fold_mask(ev, kind, vals)
            return
        if any(v.vid in self.selections for v in vals):
            follow(self, ev, kind, vals)
            return
        if kind not in ATEN:
            raise ConfigError(
                f"{ev.scope or 'the model'} runs aten.{kind}, which graphllm has no row for"
            )
        if kind in _POINTWISE_MOVES | {"_to_copy"} and self.fold_constant(ev, vals):
            return
        if kind == "embedding" and len(self.rec.shapes[vals[1].vid]) == 2:
            ins = [self.ref(vals[1].vid), self.ref(vals[0].vid)]
            self.out(ev, self.g.add("embedding", self.unique(ev.scope or "embedding"), ins))
            return
        if kind == "cat" and self.cache_append(ev, vals, args):
            return
        if kind == "convolution" and self.causal_conv(ev):
            return
        category = ATEN[kind][0]
        if category == "source":
            self.creation(ev, kind, args)
            return
        ins = [self.ref(v.vid) for v in vals]
        types = [self.g.type_of(r) for r in ins]
        if kind == "slice":
            self.last_positions(ev, types[0], args)
        if kind == "constant_pad_nd":
            self.pad_positions(ev, types[0], args)
        if kind == "cat" and self.rec.sources.get(vals[0].vid, ("",))[0] == "input":
            self.after_state(ev, types, args)
        if kind == "copy" and len(types) == 2 and self.type_of(ev.outs[0]).rank == types[1].rank:
            # copy_ into a buffer (a cache's state): what it holds is the source, axes and all
            for i, d in enumerate(types[1].dims):
                self.axis_dims[(ev.outs[0], i)] = d
        self.generic(ev, kind, ins, types, args)

    def cache_append(self, ev: Event, vals: list[Val], args: Any) -> bool:
        """A cat of a past cache input and the new keys (or values) along the key positions is
        the cache append the builder's kv_concat row is (new entries written behind the past
        where it lies), not a copy of the whole cache."""
        if len(vals) != 2 or self.rec.sources.get(vals[0].vid, ("",))[0] != "input":
            return False
        past, new = (self.ref(v.vid) for v in vals)
        pt, nt = self.g.type_of(past), self.g.type_of(new)
        dim = concrete(args, self.point)[1] % pt.rank if len(args) > 1 else 0
        # keys by head (B, heads, P, d), or one a position (an indexer's: B, P, d)
        op = {(4, 2): "kv_concat", (3, 1): "kv_concat_nohead"}.get((pt.rank, dim))
        if op is None or pt.dims[dim].role != "key_token" or nt.dims[dim].role != "token":
            return False
        out = self.type_of(ev.outs[0])
        axes = {"axes": {"s": out.dims[dim]}}
        node = self.g.add(op, self.unique(f"{ev.scope}.cache_append"), (past, new), axes)
        if node.out != out:
            self.g.erase(node)
            return False
        self.out(ev, node)
        return True

    def fold_constant(self, ev: Event, vals: list[Val]) -> bool:
        """A copy of a constant whose value is known (a Python number made a tensor) is that
        constant: no op."""
        if len(vals) != 1 or self.rec.sources.get(vals[0].vid, ("",))[0] != "constant":
            return False
        if vals[0].vid in self.refs and self.rec.values.get(vals[0].vid) is None:
            return False
        value = self.rec.values.get(vals[0].vid)
        vid = ev.outs[0]
        self.rec.sources[vid] = ("constant", f"{ev.scope or 'model'}.constant")
        self.rec.values[vid] = value
        return True

    def fold_mask(self, ev: Event, kind: str, vals: list[Val]) -> None:
        """A mask's bookkeeping (a slice, a cast, a copy, a negation of it) carries its
        relation on; the model's own attention applying it to its scores (adding it, filling
        or selecting by it) is the `mask` row with that relation."""
        relation = next(self.masks[v.vid] for v in vals if v.vid in self.masks)
        if kind in ("bitwise_not", "logical_not"):
            self.masks[ev.outs[0]] = {**relation, "negated": not relation.get("negated")}
            return
        if self.mask_form(ev, kind, vals, relation):
            return
        if kind in _VIEWS | _POINTWISE_MOVES | {"slice", "expand", "_to_copy", "select"}:
            for o in ev.outs:
                self.masks[o] = relation
            return
        scores = [v for v in vals if v.vid not in self.masks]
        # applied as the model means it: added (a 0/-inf mask), or filling where it is False
        negated = bool(relation.get("negated"))
        applies = (
            (kind == "add" and not negated)
            or (kind == "masked_fill" and negated and vals[0] in scores)
            or (kind == "where" and not negated and vals[0].vid in self.masks)
        )
        if not applies or len(scores) != 1 or not self.apply_mask(ev, scores[0], relation):
            raise ConfigError(
                f"{ev.scope or 'the model'} computes with its attention mask (aten.{kind}) "
                "outside the attention, which graphllm does not model"
            )

    def mask_form(self, ev: Event, kind: str, vals: list[Val], relation: dict[str, Any]) -> bool:
        """A mask turned into another form of itself: eager's (0 where a key is attended, the
        minimum where not) made bool or compared with 0 is True where a key is masked; sdpa's
        (True where attended) selecting between two numbers is eager's (Doge)."""
        plain = {k: v for k, v in relation.items() if k not in ("additive", "negated")}
        out = ev.outs[0]
        to_bool = kind == "_to_copy" and self.rec.dtypes[out] == "bool"
        nonzero = kind == "ne" and len(vals) == 1 and ev.args[1:2] == (0,)
        if relation.get("additive") and (to_bool or nonzero):
            self.masks[out] = {**plain, "negated": True}
            return True
        sdpa = not relation.get("negated") and not relation.get("additive")
        numbers = all(not self.rec.shapes[v.vid] for v in vals[1:])
        selects = kind == "where" and vals[0].vid in self.masks and numbers
        selects = selects and self.eager_fill(vals[1:])
        if sdpa and selects and self.rec.dtypes[out] != "bool":
            self.masks[out] = {**plain, "additive": True}
            return True
        return False

    def eager_fill(self, vals: list[Val]) -> bool:
        """Whether two numbers a mask selects between are eager's: 0 where attended, a
        dtype's minimum (fp16's -65504 or below) where not; any other pair is not a mask."""
        fill = [self.number(v.vid) for v in vals]
        if len(fill) != 2 or any(f is None for f in fill):
            return False
        return float(np.asarray(fill[0])) == 0.0 and float(np.asarray(fill[1])) <= -65504.0

    def number(self, vid: int) -> Any:
        """The value of a tensor of one number: a constant's, or the fill a creation made it
        with (scalar_tensor, full); None where the trace does not know it."""
        value = self.rec.values.get(vid)
        node = self.g[self.refs[vid].node] if value is None and vid in self.refs else None
        while node is not None and node.attrs.get("aten") in _COPIES and len(node.inputs) == 1:
            node = self.g[node.inputs[0].node]  # a copy of the number (detach, a cast)
        if node is not None:
            value = node.attrs.get("fill", node.attrs.get("value"))
        return value

    def apply_mask(self, ev: Event, scores: Val, relation: dict[str, Any]) -> bool:
        """The `mask` row on scores (B, H, T, S) with the mask's relation; False where the
        scores are not that (the mask is not applied to attention scores)."""
        x = self.ref(scores.vid)
        t = self.g.type_of(x)
        if t.rank not in (3, 4) or not all(d.role in TOKEN_ROLES for d in t.dims[-2:]):
            return False
        attrs = {k: v for k, v in relation.items() if k not in ("negated", "additive")}
        op = "mask" if t.rank == 4 else "mask_nohead"  # an indexer's scores: no heads
        node = self.g.add(op, self.unique(f"{ev.scope}.mask" if ev.scope else "mask"), (x,), attrs)
        if node.out != self.type_of(ev.outs[0]):
            self.g.erase(node)
            return False
        self.out(ev, node)
        return True

    def creation(self, ev: Event, kind: str, args: Any) -> None:
        a = concrete(args, self.point)
        kw = concrete(ev.kwargs, self.point)
        t = self.type_of(ev.outs[0])
        shape = tuple(int(e.value(*self.point)) for e in self.f.shapes[ev.outs[0]])
        fill = _CREATION_FILL.get(kind)
        if kind in ("full", "new_full"):
            fill = a[-1] if kind == "full" else a[2]
        elif kind == "full_like":
            fill = a[1]
        elif kind == "scalar_tensor":
            fill = a[0]
        attrs = {"type": t, "args": _plain(a), "shape": shape, "fill": fill, "dtype": t.dtype}
        attrs["sym_args"] = _plain(args)
        attrs["kwargs"] = _plain(kw)
        name = self.unique(f"{ev.scope}.{kind}" if ev.scope else kind)
        node = self.g.add(generic_row(kind, "-> ..."), name, (), attrs)
        self.out(ev, node)

    def generic(
        self, ev: Event, kind: str, ins: list[Ref], types: list[TensorType], args: Any, at: str = ""
    ) -> None:
        out_types = [self.expert_carried(o, types, ev.scope) for o in ev.outs]
        sig = _signature(kind, concrete(args, self.point), types, out_types, self.rec.shapes, ev)
        if sig.groups:
            shapes = [_shape(t, self.g.bindings) for t in (types[0], out_types[0])]
            sig.carries = _view_carries(sig, *shapes)
        name = generic_row(
            kind, sig.text, sig.same_position, sig.reduce, sig.carries, sig.shift != 0
        )
        attrs: dict[str, Any] = {
            "args": _plain(concrete(args, self.point)),
            "sym_args": _plain(args),
            "kwargs": _plain(concrete(ev.kwargs, self.point)),
            "aten": kind,
            "dtypes": [t.dtype for t in out_types],
            "shape": _shape(out_types[0], self.g.bindings),
            "shapes": [_shape(t, self.g.bindings) for t in out_types],
        }
        if kind == "_to_copy":
            attrs["dtype_to"] = out_types[0].dtype
        if kind == "convolution":  # its window's width, the relation's
            attrs["kernel"] = types[1].dims[-1].size
        if sig.shift:
            attrs["shift"] = sig.shift
        absent = tuple(i for i, v in enumerate(args) if v is None)
        if absent:  # a Python None, where the numpy references read None as a tensor
            attrs["absent"] = absent
        if kind == "index":
            attrs["indices"] = tuple(None if x is None else 0 for x in args[1])
        if sig.axes:
            attrs["axes"] = sig.axes
        base = at or ev.scope
        node = self.g.add(name, self.unique(f"{base}.{kind}" if base else kind), ins, attrs)
        self.out(ev, node)

    def out(self, ev: Event, node: Node) -> None:
        for i, vid in enumerate(ev.outs):
            self.refs[vid] = Ref(node.name, i)
            want, got = self.type_of(vid), node.outputs[i]
            if got == want or node.op not in OPS:
                continue
            if not _expert_of(got, want):
                raise ConfigError(
                    f"{node.name} ({node.op}): the trace says {want} {want.dtype}, the op "
                    f"table {got} {got.dtype}"
                )
            for k, (g, w) in enumerate(zip(got.dims, want.dims, strict=True)):
                if g != w:  # the expert axis carried from the weights, not named by its size
                    self.axis_dims[(vid, k)] = g


_COPIES = ("detach", "_to_copy", "clone", "alias", "lift_fresh_copy")


def _innermost_kind(scopes: dict[str, str], scope: str) -> str:
    """The kind of the innermost scope holding `scope` that has one; '' for none."""
    parts = scope.split(".")
    for k in range(len(parts), 0, -1):
        kind = scopes.get(".".join(parts[:k]))
        if kind is not None:
            return kind
    return ""


def _expert_of(got: TensorType, want: TensorType) -> bool:
    """Whether the op table's type is the trace's with an expert axis where the trace, naming
    axes by their sizes, took it for another field of the same size."""
    if got.dtype != want.dtype or got.rank != want.rank:
        return False
    return all(
        g == w or (g.role == "expert" and g.size is not None and g.size == w.size)
        for g, w in zip(got.dims, want.dims, strict=True)
    )


# -- signatures ----------------------------------------------------------------------------------
@dataclass
class _Sig:
    ins: list[list[str]]
    outs: list[list[str]]
    axes: dict[str, Dim]
    same_position: tuple[tuple[str, ...], ...] = ()
    reduce: tuple[str, ...] = ()
    carries: tuple[tuple[str, str], ...] = ()
    groups: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()  # a reshape's regroupings
    shift: int = 0  # a pad that moves the token axis by this many positions

    @property
    def text(self) -> str:
        def operand(letters: list[str]) -> str:
            return " ".join(letters) or SCALAR  # a 0-d tensor

        ins = ", ".join(operand(o) for o in self.ins)
        return f"{ins} -> " + ", ".join(operand(o) for o in self.outs)


class _Fresh:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> str:
        n, self.n = self.n, self.n + 1
        return _LETTERS[n] if n < len(_LETTERS) else f"{_LETTERS[n % 26]}{n // 26}"


def _signature(
    kind: str,
    args: Any,
    ins: list[TensorType],
    outs: list[TensorType],
    shapes: dict[int, tuple[int, ...]],
    ev: Event,
) -> _Sig:
    fresh = _Fresh()
    category = ATEN[kind][0]
    if kind in ("mm", "bmm", "addmm", "baddbmm"):
        return _contraction(kind, ins, outs, fresh)
    if kind == "convolution":
        return _convolution(args, ins, outs, ev)
    if kind in ("permute", "transpose", "t"):
        letters = [fresh() for _ in ins[0].dims]
        order = _permutation(kind, args, len(letters))
        return _finish([letters], [[letters[i] for i in order]], ins, outs)
    if kind in _VIEWS:
        return _regroup(ins[0], outs[0], _probe_shape(ev, shapes, 0), shapes[ev.outs[0]], fresh)
    if kind == "native_layer_norm":
        return _layer_norm(args, ins, outs, fresh)
    if kind in ("_softmax", "cumsum"):
        letters = [fresh() for _ in ins[0].dims]
        dim = args[1] % len(letters)
        return _finish([letters], [letters], ins, outs, reduce=(letters[dim],))
    if category == "reduction":
        return _reduction(kind, args, ins, outs, fresh)
    if kind in ("slice", "select", "cat", "stack", "split", "split_with_sizes", "unbind"):
        return _along(kind, args, ins, outs, fresh)
    if kind in ("slice_scatter", "select_scatter"):  # the base's axes; the source's own
        base = [fresh() for _ in ins[0].dims]  # extent along the slice, or none at a row
        dim = args[2] % len(base)
        src = [fresh() if n == dim else x for n, x in enumerate(base)]
        if kind == "select_scatter":
            src = [x for n, x in enumerate(base) if n != dim]
        return _finish([base, src], [base], ins, outs)
    if kind == "constant_pad_nd":
        return _padded(args, ins, outs, fresh)
    if kind in ("index_select", "gather", "scatter", "index", "embedding", "repeat"):
        return _indexing(kind, args, ins, outs, fresh)
    if kind == "unfold":  # the windows along `dim` in its place, each window's entries last
        letters = [fresh() for _ in ins[0].dims]
        dim = args[1] % len(letters)
        src, out = ins[0].dims[dim].positions, outs[0].dims[dim].positions
        if args[3] != 1 or (src and out and src[1] != out[1]):  # the row's window: the K
            # positions that end at each output's, in a source that ends where the outputs do
            raise ConfigError(f"{ev.scope}: unfold {args[3]} apart over {src}: not a causal window")
        windows = [fresh() if i == dim else x for i, x in enumerate(letters)]
        return _finish([letters], [windows + [fresh()]], ins, outs)
    # pointwise: ELEMENTWISE rows, copies, expand, flip, tril/triu, where, masked_fill
    out = [fresh() for _ in outs[0].dims]
    operands = []
    for t in ins:
        k = len(out) - len(t.dims)
        operands.append(
            [out[k + j] if d == outs[0].dims[k + j] else fresh() for j, d in enumerate(t.dims)]
        )
    return _finish(operands, [out], ins, outs)


def _finish(
    ins: list[list[str]],
    outs: list[list[str]],
    in_types: list[TensorType],
    out_types: list[TensorType],
    same: tuple[tuple[str, ...], ...] = (),
    reduce: tuple[str, ...] = (),
) -> _Sig:
    """The signature with `axes` giving every output letter no input has."""
    known = {x for o in ins for x in o}
    axes: dict[str, Dim] = {}
    for letters, t in zip(outs, out_types):
        for x, d in zip(letters, t.dims):
            if x not in known:
                axes[x] = d
    return _Sig(ins, outs, axes, same, reduce)


def _convolution(args: Any, ins: list[TensorType], outs: list[TensorType], ev: Event) -> _Sig:
    """A 1-d convolution over the token axis: stride 1, no padding or dilation (a valid conv
    over K-1 positions before the outputs', ZAYA's), its window the row's relation."""
    stride, padding, dilation, transposed = args[3:7]
    src, out = ins[0].dims[-1].positions, outs[0].dims[-1].positions
    plain = list(stride) == [1] and list(padding) == [0] and list(dilation) == [1]
    if ins[0].rank != 3 or not plain or transposed or (src and out and src[1] != out[1]):
        raise ConfigError(
            f"{ev.scope}: a convolution of stride {stride}, padding {padding}, dilation "
            f"{dilation} over {ins[0]}: not a causal window over the tokens"
        )
    # the letters _conv_flops reads: a b c, d e f -> a d g (B Cin L, Cout Cin/g K -> B Cout T)
    bias = [["d"]] if len(ins) > 2 else []
    return _finish([["a", "b", "c"], ["d", "e", "f"], *bias], [["a", "d", "g"]], ins, outs)


def _contraction(kind: str, ins: list[TensorType], outs: list[TensorType], fresh: _Fresh) -> _Sig:
    if kind == "mm":
        i, k, j = fresh(), fresh(), fresh()
        return _finish([[i, k], [k, j]], [[i, j]], ins, outs)
    if kind == "bmm":
        z, i, k, j = fresh(), fresh(), fresh(), fresh()
        return _finish([[z, i, k], [z, k, j]], [[z, i, j]], ins, outs)
    if kind == "baddbmm":  # beta * input + alpha * (b1 @ b2), batched
        z, i, k, j = fresh(), fresh(), fresh(), fresh()
        out = [z, i, j]
        lead = len(out) - len(ins[0].dims)
        bias = [
            out[lead + n] if d == outs[0].dims[lead + n] else fresh()
            for n, d in enumerate(ins[0].dims)
        ]
        return _finish([bias, [z, i, k], [z, k, j]], [out], ins, outs)
    i, k, j = fresh(), fresh(), fresh()
    out = [i, j]
    bias = ins[0].dims
    lead = len(out) - len(bias)
    b = [out[lead + n] if d == outs[0].dims[lead + n] else fresh() for n, d in enumerate(bias)]
    return _finish([b, [i, k], [k, j]], [out], ins, outs)


def _permutation(kind: str, args: Any, rank: int) -> list[int]:
    if kind == "t":
        return list(range(rank))[::-1]
    if kind == "permute":
        return [d % rank for d in args[1]]
    order = list(range(rank))
    a, b = args[1] % rank, args[2] % rank
    order[a], order[b] = order[b], order[a]
    return order


def _probe_shape(ev: Event, shapes: dict[int, tuple[int, ...]], i: int) -> tuple[int, ...]:
    return shapes[_vals(ev.args)[i].vid]


def _regroup(
    src: TensorType,
    dst: TensorType,
    src_probe: tuple[int, ...],
    dst_probe: tuple[int, ...],
    fresh: _Fresh,
) -> _Sig:
    """A reshape: the axes cut into groups of equal size (at the probe, whose sizes are
    distinct primes), each group one letter where it is one axis both sides, and positions kept
    where a token axis is regrouped with others."""
    a = [fresh() for _ in src.dims]
    b: list[str | None] = [None] * len(dst.dims)
    same: list[tuple[str, ...]] = []
    outer: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # regrouped axes, in and out
    i = j = 0
    while i < len(a) or j < len(b):
        gi, gj = [i] if i < len(a) else [], [j] if j < len(b) else []
        si = src_probe[i] if gi else 1
        sj = dst_probe[j] if gj else 1
        i, j = i + len(gi), j + len(gj)
        while si != sj:
            if si < sj and i < len(a):
                si *= src_probe[i]
                gi.append(i)
                i += 1
            elif j < len(b):
                sj *= dst_probe[j]
                gj.append(j)
                j += 1
            else:
                raise GraphError(f"reshape {src_probe} -> {dst_probe}: the sizes do not regroup")
        real_i = [n for n in gi if src_probe[n] != 1 or len(gi) == 1]
        real_j = [n for n in gj if dst_probe[n] != 1 or len(gj) == 1]
        if len(real_i) == 1 and len(real_j) == 1 and src.dims[real_i[0]] == dst.dims[real_j[0]]:
            b[real_j[0]] = a[real_i[0]]
        elif real_i and real_j:
            outer.append((tuple(gi), tuple(gj)))
        pos_in = [a[n] for n in gi if src.dims[n].role in ("token", "key_token", "slot")]
        for n in gj:
            if b[n] is None:
                b[n] = fresh()
                if dst.dims[n].role in ("token", "key_token", "slot") and pos_in:
                    same.append((b[n], *pos_in))
    sig = _finish([a], [[x for x in b if x is not None]], [src], [dst], tuple(same))
    sig.groups = tuple(outer)
    return sig


def _view_carries(
    sig: _Sig, src: tuple[int, ...], dst: tuple[int, ...]
) -> tuple[tuple[str, str], ...]:
    """A split of a merged (or split) axis in blocks cuts its outermost factor alike (the heads
    of a projection's output viewed per head, and back; the batch of tokens flattened): the
    outermost axes of each regrouped group that are not 1 at this workload (tokens flattened
    from one sequence are cut as its positions are)."""
    out = []
    for gi, gj in sig.groups:
        i = next((n for n in gi if src[n] != 1), None)
        j = next((n for n in gj if dst[n] != 1), None)
        if i is not None and j is not None:
            out.append((sig.ins[0][i], sig.outs[0][j]))
    return tuple(out)


def _layer_norm(args: Any, ins: list[TensorType], outs: list[TensorType], fresh: _Fresh) -> _Sig:
    """x over its last len(normalized_shape) axes, with a weight and a bias of those axes."""
    x = [fresh() for _ in ins[0].dims]
    k = len(args[1])
    kept = [*x[:-k], *(fresh() for _ in range(k))]
    operands = [x] + [x[-k:] for _ in ins[1:]]
    return _finish(operands, [x, kept, kept], ins, outs, reduce=tuple(x[-k:]))


def _reduction(
    kind: str, args: Any, ins: list[TensorType], outs: list[TensorType], fresh: _Fresh
) -> _Sig:
    letters = [fresh() for _ in ins[0].dims]
    rank = len(letters)
    if kind == "topk":
        dim = (args[2] if len(args) > 2 else -1) % rank
        out = list(letters)
        out[dim] = fresh()
        return _finish([letters], [out, out], ins, outs)
    at = 2 if kind == "linalg_vector_norm" else 1  # (x, ord, dim, keepdim)
    dims = args[at] if len(args) > at and args[at] is not None else list(range(rank))
    dims = {d % rank for d in (dims if isinstance(dims, (list, tuple)) else [dims])} or set(
        range(rank)
    )
    keep = len(outs[0].dims) == rank
    out = (
        [fresh() if n in dims else x for n, x in enumerate(letters)]
        if keep
        else [x for n, x in enumerate(letters) if n not in dims]
    )
    return _finish([letters], [out] * len(outs), ins, outs)


def _along(
    kind: str, args: Any, ins: list[TensorType], outs: list[TensorType], fresh: _Fresh
) -> _Sig:
    """Ops along one axis (slice, select, cat, split, unbind): the other axes pass through;
    where the axis is a token axis each output position is one input position."""
    rank = len(ins[0].dims) if kind not in ("cat", "stack") else len(outs[0].dims)
    at_arg = 2 if kind in ("split", "split_with_sizes") else 1
    dim = (args[at_arg] if len(args) > at_arg and args[at_arg] is not None else 0) % rank
    base = [fresh() for _ in range(rank)]

    def at(d: Dim) -> list[str]:
        return [*base[:dim], fresh(), *base[dim + 1 :]]

    def token(t: TensorType) -> bool:
        return t.dims[dim].role in ("token", "key_token", "slot") if len(t.dims) > dim else False

    if kind == "stack":
        out = at(outs[0].dims[dim])
        operands = [[x for n, x in enumerate(base) if n != dim] for _ in ins]
        return _finish(operands, [out], ins, outs)
    if kind == "cat":
        operands = [at(t.dims[dim]) for t in ins]
        out = at(outs[0].dims[dim])
        group = [out[dim]] + [o[dim] for o, t in zip(operands, ins) if token(t)]
        same = (tuple(group),) if token(outs[0]) and len(group) > 1 else ()
        return _finish(operands, [out], ins, outs, same)
    src = base
    if kind in ("select", "unbind"):
        out = [x for n, x in enumerate(base) if n != dim]
        return _finish([src], [out] * len(outs), ins, outs)
    results = [at(t.dims[dim]) for t in outs]
    same = tuple((o[dim], src[dim]) for o, t in zip(results, outs) if token(t) and token(ins[0]))
    return _finish([src], results, ins, outs, same)


def _padded(args: Any, ins: list[TensorType], outs: list[TensorType], fresh: _Fresh) -> _Sig:
    """A constant pad: an axis whose size changes is a new axis, the same positions where
    both sides say which they hold (a conv state's last K, `pad_positions`). A token axis padded
    before by as many positions as are cut after (RWKV's time shift, ZeroPad2d((0, 0, 1, -1)))
    keeps its size and moves: a new axis, each output position reading the one `shift`
    before it (the row's relation)."""
    pads, dims = args[1], ins[0].dims
    moved = {
        len(dims) - 1 - i: pads[2 * i]
        for i in range(len(pads) // 2)
        if pads[2 * i]
        and pads[2 * i] == -pads[2 * i + 1]
        and dims[len(dims) - 1 - i].role in TOKEN_ROLES
    }
    x = [fresh() for _ in ins[0].dims]
    out = [
        x[n] if d == outs[0].dims[n] and n not in moved else fresh()
        for n, d in enumerate(ins[0].dims)
    ]
    same = tuple(
        (o, i)
        for n, (o, i, a, b) in enumerate(zip(out, x, ins[0].dims, outs[0].dims))
        if o != i and n not in moved and a.positions is not None and b.positions is not None
    )
    if len(moved) > 1:
        raise ConfigError(f"a pad that shifts two token axes of {ins[0]}, which is not modelled")
    sig = _finish([x], [out], ins, outs, same)
    sig.shift = next(iter(moved.values()), 0)
    return sig


def _indexing(
    kind: str, args: Any, ins: list[TensorType], outs: list[TensorType], fresh: _Fresh
) -> _Sig:
    """Gathers and repeats: the output axes a run-time index chooses read any input
    position."""
    x = [fresh() for _ in ins[0].dims]
    if kind == "index_select":
        dim = args[1] % len(x)
        idx = [fresh()]
        return _finish([x, idx], [[*x[:dim], idx[0], *x[dim + 1 :]]], ins, outs)
    if kind == "gather":
        dim = args[1] % len(x)
        idx = [fresh() if n == dim else v for n, v in enumerate(x)]
        return _finish([x, idx], [idx], ins, outs)
    if kind == "scatter":  # writes src at the index's places along dim into a copy of x
        dim = args[1] % len(x)
        idx = [
            fresh() if n == dim or ins[1].dims[n] != d else x[n] for n, d in enumerate(ins[0].dims)
        ]
        return _finish([x, idx, idx][: len(ins)], [x], ins, outs)
    if kind == "index":
        positions = [n for n, v in enumerate(args[1]) if v is not None]
        if positions != list(range(positions[0], positions[-1] + 1)):
            raise GraphError("indexing with tensors at axes apart is not modelled")
        rank = max(len(t.dims) for t in ins[1:])
        bcast = [fresh() for _ in range(rank)]
        operands = [x]
        for t in ins[1:]:
            k = rank - len(t.dims)
            operands.append([bcast[k + j] for j in range(len(t.dims))])
        out = [*x[: positions[0]], *bcast, *x[positions[-1] + 1 :]]
        return _finish(operands, [out], ins, outs)
    if kind == "embedding":
        idx = [fresh() for _ in ins[1].dims]
        return _finish([x, idx], [[*idx, x[1]]], ins, outs)
    # repeat: an axis whose size changes is a new axis; its extra axes come first (the input
    # lines up with the output's last axes)
    lead = len(outs[0].dims) - len(x)
    out = [
        x[n - lead] if n >= lead and ins[0].dims[n - lead] == d else fresh()
        for n, d in enumerate(outs[0].dims)
    ]
    return _finish([x], [out], ins, outs)


# -- helpers ---------------------------------------------------------------------------------------
def _last(c: int, d: Dim) -> Dim:
    """The last c positions of the token axis `d`."""
    stop = d.positions[1]  # type: ignore[index]
    return Dim(f"last{c}", "key_token", c, positions=(f"{stop}-{c}", stop))


def _vals(args: Any) -> list[Val]:
    out: list[Val] = []
    for a in args:
        if isinstance(a, Val):
            out.append(a)
        elif isinstance(a, tuple):
            out.extend(v for v in a if isinstance(v, Val))
    return out


def _plain(x: Any) -> Any:
    """Args as the numpy references read them: a tensor None, tuples kept."""
    if isinstance(x, Val):
        return None
    if isinstance(x, tuple):
        return tuple(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _shape(t: TensorType, bindings: dict[str, float]) -> tuple[int, ...]:
    return tuple(int(s) for s in t.shape(bindings))


def _drop_unread(g: Graph) -> None:
    """Erase what no output depends on: bookkeeping the model's code does beside its
    computation (a cache's token counter, a shape's arithmetic) and the past counters it came
    from. Parameters and the other inputs stay, read or not."""
    live = {r.node for r in g.outputs.values()}
    for n in reversed(g.topo()):
        if n.name in live:
            live.update(r.node for r in n.inputs)
    for n in reversed(g.topo()):
        counter = n.op == "input" and n.name.startswith("past_key_values.")
        if n.name not in live and (n.op not in ("input", "param") or counter):
            g.erase(n)


def _blocks(g: Graph, scopes: dict[str, str]) -> list[str]:
    """Each decoder layer's last node, in order (per-layer reports)."""
    layers = {p for p, k in scopes.items() if k == "layer"}
    last: dict[str, str] = {}
    for n in g.nodes():
        parts = n.name.split(".")
        for i in range(1, len(parts)):
            prefix = ".".join(parts[:i])
            if prefix in layers:
                last[prefix] = n.name
                break
    return [last[p] for p in scopes if p in last]
