"""Traced `delta` and `conv` events (graphllm.trace.kernels) -> the rows graphllm's hand-built
hybrids use.

- `delta`: transformers' gated delta rule on q, k (B, T, key heads, d_k), v (B, T, value heads,
  d_v), the log decay g and beta (B, T, value heads), after the layer's carried state where it has
  one. Its form is transformers' own choice at the workload (the recurrent form for one new token
  after a state, else the chunked one), so a trace made at other lengths lowers to what runs at
  this one. `use_qk_l2norm_in_kernel` is the l2normalize row on q and k first (eps 1e-6, FLA's).
  A decay per key channel (B, T, H, d_k) is Kimi Delta Attention's (FLA's chunk_kda and
  fused_recurrent_kda): the `kda_*` rows.
- `ssm`: Mamba2's selective scan (mamba_ssm's chunked contract), in the form transformers
  runs at the workload (its recurrent step for one new token after a state).
- `ssm1`: Mamba-1's selective scan (mamba_ssm's `selective_scan_fn`, channels first) from a
  zero state; at one new token after a past, transformers' step from the layer's carried state
  (`selective_state_update`), the cache input the scan's final state is copied into.
- `lightning`: MiniMax-01's lightning attention (graphllm.trace.loops): q, k, v (B, H, T, d),
  the layer's rate (H, 1, 1), its decay tables, the carried state or None. From a zero state
  transformers loops over blocks (`lightning_attention`), from the state over tokens
  (`lightning_attention_past`). The tables are powers of the rate, which the rows compute:
  they stay parameters of the graph (the checkpoint holds them), read by no row.
- `wkv`: RWKV-4's WKV recurrence (transformers' `rwkv_linear_attention`), from the state
  handed in (a layer's cache entries) or transformers' default.
- `lru`: the RG-LRU's linear recurrence h_t = a_t h_{t-1} + x_t (RecurrentGemma's `_rnn_scan`),
  from the layer's carried state where transformers passes one (its first step's zeros too).
- `conv`: the depthwise causal conv on transformers' channels-first (B, C, S), from a zero
  start (transformers puts the cache's conv state before the new inputs itself, and keeps its
  last K positions, in ops of its own). The rows take channels last, so the input and output
  are transposed around it. `padded_to`: a first step's conv, which transformers' cache pads
  to K positions when shorter (graphllm.trace.kernels); the row convolves the step alone.
"""

from __future__ import annotations

import math
from typing import Any

from graphllm.errors import ConfigError
from graphllm.ir import Dim, Graph, Node, Ref, TensorType
from graphllm.ops.generic import generic_row
from graphllm.trace.capture import Event, Recording, Val

# a conv's activation, as transformers names it -> graphllm's row
_ACTIVATIONS = {"silu": "silu", "swish": "silu"}
# ops that pass a whole tensor on unchanged but for its dtype
_MOVES = {"_to_copy", "clone", "alias", "detach", "to", "lift_fresh", "lift_fresh_copy"}


def lower_delta(g: Graph, p: str, ins: list[Ref | None], attrs: dict[str, Any], out_t: Dim):
    """The gated delta rule of scope `p`: returns the (output, final state) node."""
    q, k, v, decay, beta, state = ins
    if attrs.get("l2norm"):
        q = Ref(g.add("l2normalize", f"{p}.q_l2norm", (q,), {"eps": 1e-6}).name)
        k = Ref(g.add("l2normalize", f"{p}.k_l2norm", (k,), {"eps": 1e-6}).name)
    args: tuple[Ref, ...] = (q, k, v, decay, beta)  # type: ignore[assignment]
    # a decay per key channel (B, T, H, d_k) is KDA's; one per head (B, T, H), the gated rule's
    family = "kda" if g.type_of(decay).rank == 4 else "gated_delta"  # type: ignore[arg-type]
    if state is None:
        form = "chunked"
    else:
        args += (state,)
        # transformers steps token by token for one new token after a state, else chunks
        form = "step" if g.bindings["T"] == 1 else "chunked_state"
    row_attrs = {"axes": {"t": out_t}, "chunk": attrs["chunk"]}
    return g.add(f"{family}_{form}", f"{p}.core", args, row_attrs)


def lower_ssm(g: Graph, p: str, ins: list[Ref | None], attrs: dict[str, Any], out_t: Dim):
    """Mamba2's scan of scope `p` on (x, dt, A, B, C, D, dt_bias, the state or None): returns
    the (y, final state) node. The model hands the scan A itself (a_is_rate)."""
    *args, state = ins
    form = "recurrent" if state is not None and g.bindings["T"] == 1 else "chunked"
    attrs = {"axes": {"t": out_t}, **attrs, "form": form, "a_is_rate": True}
    op = "ssm_scan" if state is None else "ssm_scan_past"
    inputs = tuple(args) + (() if state is None else (state,))
    return g.add(op, f"{p}.scan", inputs, attrs)


def lower_ssm1(g: Graph, p: str, ins: list[Ref | None], out_t: Dim, carried: Ref | None) -> Node:
    """Mamba-1's scan of scope `p` on (u, dt, A, B, C, D, z, dt_bias): returns the (y, final
    state) node. `carried`: the layer's state in the past cache, which transformers steps from
    for one new token; a scan of several tokens starts from zeros (selective_scan_fn takes no
    state), so the recording of several never reads it."""
    attrs = {"axes": {"t": out_t}}
    if carried is not None and g.bindings["T"] == 1:
        return g.add("selective_state_update", f"{p}.scan", (*ins, carried), attrs)
    return g.add("selective_scan", f"{p}.scan", tuple(ins), attrs)


def lower_lightning(
    g: Graph, p: str, ins: list[Ref | None], attrs: dict[str, Any], out_t: Dim
) -> Node:
    """Lightning attention of scope `p` on (q, k, v, rate, the three decay tables, the state or
    None): returns the (output, final state) node."""
    q, k, v, rate, *_, state = ins
    assert rate is not None
    heads = g.type_of(rate).dims[0]
    rate = _view(g, f"{p}.rate", rate, (heads,), "a b c -> a", {})
    row_attrs = {"axes": {"t": out_t}, "block": attrs["block"]}
    if state is None:
        return g.add("lightning_attention", f"{p}.core", (q, k, v, rate), row_attrs)
    return g.add("lightning_attention_past", f"{p}.core", (q, k, v, rate, state), row_attrs)


def lower_wkv(g: Graph, p: str, ins: list[Ref], out_t: Dim) -> Node:
    """RWKV's WKV recurrence of scope `p` on (key, value, time_decay, time_first[, num, den,
    max]): returns the (output, num, den, max) node, from the carried state where one is
    handed in."""
    op = "wkv4_scan_state" if len(ins) > 4 else "wkv4_scan"
    return g.add(op, f"{p}.wkv", tuple(ins), {"axes": {"t": out_t}})


def lower_lru(g: Graph, p: str, ins: list[Ref | None], out_t: Dim) -> Node:
    """The RG-LRU's scan of scope `p` on x, the decay a (B, T, D) and the carried state (B, D)
    or None: returns the (y, final state) node."""
    x, decay, state = ins
    attrs = {"axes": {"t": out_t}}
    if state is None:
        return g.add("linear_recurrence", f"{p}.scan", (x, decay), attrs)
    return g.add("linear_recurrence_state", f"{p}.scan", (x, decay, state), attrs)


def padded_conv_reader(rec: Recording, ev: Event) -> Event | None:
    """For torch's causal depthwise conv1d (nn.Conv1d, groups = C, padded by K-1 on both sides:
    S + K - 1 outputs), the slice that keeps its first S outputs, where that slice is the only
    event reading it; else None. The K-1 outputs past the input's end see the right padding,
    which no causal conv computes: the pair is the causal conv on the S input positions."""
    x, w = ev.args[:2]
    stride, padding, dilation, transposed, _, groups = ev.args[3:9]
    channels, per_group, k = rec.shapes[w.vid]
    plain = list(stride) == [1] and list(dilation) == [1] and not transposed
    depthwise = per_group == 1 and groups == channels == rec.shapes[x.vid][1]
    if not (plain and depthwise and list(padding) == [k - 1] and len(rec.shapes[x.vid]) == 3):
        return None
    out = ev.outs[0]
    readers = [e for e in rec.events if out in _vids(e.args) or out in _vids(e.kwargs)]
    if len(readers) != 1 or readers[0].op != "aten.slice.Tensor":
        return None
    _, dim, start, *rest = readers[0].args
    step = rest[1] if len(rest) > 1 else 1
    if dim not in (2, -1) or start not in (0, None) or step != 1:
        return None
    if rec.shapes[readers[0].outs[0]] != rec.shapes[x.vid]:
        return None
    return readers[0]


def conv_carried(rec: Recording, ev: Event) -> tuple[int, int] | None:
    """For a conv whose input its layer also keeps, padded to K-1 positions, as a state it
    carries to the next call (RecurrentGemma's `conv1d_state`, a cache output), the past input
    of that state and the padded tensor; None without a past."""
    x = ev.args[0].vid
    inputs = {name: vid for vid, (kind, name) in rec.sources.items() if kind == "input"}
    written = {vid: name for name, (vid, _) in rec.outputs.items() if name.startswith("present.")}
    for e in rec.events:
        if e.op != "aten.constant_pad_nd.default" or e.outs[0] not in written:
            continue
        if isinstance(e.args[0], Val) and e.args[0].vid == x:
            past = inputs.get("past_key_values." + written[e.outs[0]].split(".", 1)[1])
            if past is not None:
                return past, e.outs[0]
    return None


def lower_carried_conv(
    g: Graph, p: str, ins: list[Ref | None], state: Ref, span: Dim
) -> tuple[Ref, Ref]:
    """The causal conv of scope `p` on x (B, C, T), its weight (C, 1, K) and bias or None,
    after the layer's carried inputs `state` (B, C, K-1) as transformers reads them: for one
    new token only (one_token_state; several start from zeros). `span`: the K-1 + T positions
    of the state then the step. Returns the output (B, C, T) and the state after the step,
    the last K-1 of those positions (B, C, K-1)."""
    x, weight, bias = ins
    assert x is not None and weight is not None
    kernel = g.type_of(weight).dims[-1]
    start = Ref(g.add("one_token_state", f"{p}.carried", (state, x), {}).name)
    xt = _permute(g, f"{p}.channels_last", x)
    st = _permute(g, f"{p}.state_channels_last", start)
    cat = Ref(g.add("state_concat", f"{p}.conv_concat", (st, xt), {"axes": {"s": span}}).name)
    attrs = {"axes": {"t": g.type_of(xt).dims[1]}, "kernel": kernel.size, "with_state": True}
    attrs["one_token_state"] = True
    if bias is not None:
        conv = g.add("causal_conv1d_bias", f"{p}.conv1d", (cat, weight, bias), attrs)
    else:
        conv = g.add("causal_conv1d", f"{p}.conv1d", (cat, weight), attrs)
    keep = kernel.size - 1
    w_now = Dim("conv_w", "key_token", keep, positions=(f"P+T-{keep}", "P+T"))
    kept = Ref(g.add("conv_state", f"{p}.conv_state", (cat,), {"axes": {"w": w_now}}).name)
    y = _permute(g, f"{p}.channels_first", Ref(conv.name))
    return y, _permute(g, f"{p}.state_channels_first", kept)


def _vids(x: Any) -> set[int]:
    if isinstance(x, Val):
        return {x.vid}
    if isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (tuple, list)):
        return {v for item in x for v in _vids(item)}
    return set()


def carried_states(rec: Recording) -> dict[int, tuple[int, int | None]]:
    """Each Mamba-1 scan's final state (by tensor) -> the past cache input the step copies it
    into, and its index along axis 1 there where the layer stacks several scans' states (Zamba's
    heads), else None: the state a one-token step of that scan starts from."""
    made = {vid: ev for ev in rec.events for vid in ev.outs}
    finals = {ev.outs[1] for ev in rec.events if ev.op == "ssm1"}

    def origin(v: Any) -> int | None:  # back through casts and copies of the whole tensor
        while isinstance(v, Val) and v.vid not in finals and v.vid in made:
            ev = made[v.vid]
            if _kind(ev) not in _MOVES:
                return v.vid
            v = ev.args[0]
        return v.vid if isinstance(v, Val) else None

    out: dict[int, tuple[int, int | None]] = {}
    for ev in rec.events:
        dst, src = (ev.args + (None, None))[:2]
        if _kind(ev) != "copy_" or not isinstance(dst, Val):
            continue
        if rec.sources.get(dst.vid, ("",))[0] != "input":
            continue
        vid = origin(src)
        if vid in finals:
            out[vid] = (dst.vid, None)
        elif vid in made and made[vid].op == "aten.stack.default" and _stack_dim(made[vid]) == 1:
            for h, part in enumerate(made[vid].args[0]):
                if origin(part) in finals:
                    out[origin(part)] = (dst.vid, h)  # type: ignore[index]
    return out


def _kind(ev: Event) -> str:
    return ev.op.split(".")[1] if ev.op.startswith("aten.") else ""


def _stack_dim(ev: Event) -> int:
    return int(ev.args[1] if len(ev.args) > 1 else ev.kwargs.get("dim", 0))


def select_head(g: Graph, name: str, x: Ref, index: int) -> Ref:
    """x[:, index]: one head's state of a state stacked by heads on axis 1."""
    src = g.type_of(x)
    dims = (src.dims[0], *src.dims[2:])
    shape = tuple(int(s) for s in TensorType(dims, src.dtype).shape(g.bindings))
    attrs = _attrs("select", (None, 1, index), src.dtype, shape)
    return Ref(g.add(generic_row("select", "a b c d -> a c d"), name, (x,), attrs).name)


def lower_conv(g: Graph, p: str, ins: list[Ref | None], unit: dict[str, Any]) -> Ref:
    """The causal conv of scope `p` on x (B, C, S) from a zero start, its weight (C, K) or
    (C, 1, K) and bias or None, `unit` the event's attrs: returns the output (B, C, S)."""
    x, weight, bias = ins
    assert x is not None and weight is not None
    activation = unit["activation"]
    kernel = g.type_of(weight).dims[-1]
    xt = _permute(g, f"{p}.channels_last", x)
    w = weight
    if g.type_of(weight).rank == 2:  # (C, K), as a kernel takes it: nn.Conv1d's (C, 1, K)
        c, one = g.type_of(weight).dims[0], Dim("one", "hidden", 1)
        w = _view(g, f"{p}.conv_weight", weight, (c, one, kernel), "a b -> a c b", {"c": one})
    attrs = {"axes": {"t": g.type_of(xt).dims[1]}, "kernel": kernel.size, "with_state": False}
    if unit.get("padded_to"):
        attrs["padded_to"] = unit["padded_to"]
    if bias is not None:
        conv = g.add("causal_conv1d_bias", f"{p}.conv1d", (xt, w, bias), attrs)
    else:
        conv = g.add("causal_conv1d", f"{p}.conv1d", (xt, w), attrs)
    y = Ref(conv.name)
    if activation is not None:
        act = _ACTIVATIONS.get(str(activation))
        if act is None:
            raise ConfigError(f"{p}: a causal conv with activation {activation!r}")
        y = Ref(g.add(act, f"{p}.act", (y,)).name)
    return _permute(g, f"{p}.channels_first", y)


def _permute(g: Graph, name: str, x: Ref) -> Ref:
    """(a, b, c) -> (a, c, b)."""
    src = g.type_of(x)
    dims = (src.dims[0], src.dims[2], src.dims[1])
    shape = tuple(int(s) for s in TensorType(dims, src.dtype).shape(g.bindings))
    attrs = _attrs("permute", (None, (0, 2, 1)), src.dtype, shape)
    return Ref(g.add(generic_row("permute", "a b c -> a c b"), name, (x,), attrs).name)


def _view(g: Graph, name: str, x: Ref, dims: tuple[Dim, ...], sig: str, axes: dict) -> Ref:
    src = g.type_of(x)
    shape = tuple(int(s) for s in TensorType(dims, src.dtype).shape(g.bindings))
    attrs = _attrs("view", (None, shape), src.dtype, shape) | {"axes": axes}
    return Ref(g.add(generic_row("view", sig), name, (x,), attrs).name)


def _attrs(kind: str, args: tuple, dtype: str, shape: tuple[int, ...]) -> dict[str, Any]:
    return {
        "args": args,
        "sym_args": args,
        "kwargs": {},
        "aten": kind,
        "dtypes": [dtype],
        "shape": shape,
        "shapes": [shape],
    }


def reference_conv_flops(g: Graph) -> int:
    """The FLOPs of the graph's causal convs as transformers' torch code computes them, for a
    comparison with torch's FlopCounterMode: a conv1d padded by K-1 on both sides, so S+K-1
    outputs of which it keeps S, 2 C K B (S+K-1), S at least the length transformers' cache
    pads a first step to (`padded_to`). RecurrentGemma's conv after its carried inputs
    (`one_token_state`) is the new tokens' torch conv for several, and none for one. graphllm counts the S outputs a causal-conv kernel
    computes (the rows' flops_fn)."""
    total = 0
    for n in g.nodes():
        if n.op in ("causal_conv1d", "causal_conv1d_bias"):
            b, s, c = (int(x) for x in g.type_of(n.inputs[0]).shape(g.bindings))
            s = max(s, int(n.attrs.get("padded_to", 0)))
            k = int(n.attrs["kernel"])
            if n.attrs.get("one_token_state"):  # the step alone, padded (a sum of products
                # for one token, which FlopCounterMode counts as none)
                total += 0 if s == k else 2 * c * k * b * s
                continue
            total += 2 * c * k * b * (s + k - 1)
        elif n.op.startswith("aten.convolution["):  # torch's own: the outputs it keeps
            out = g.type_of(Ref(n.name)).shape(g.bindings)
            taps = g.type_of(n.inputs[1]).shape(g.bindings)[1:]
            total += 2 * int(math.prod(out)) * int(math.prod(taps))
    return total
