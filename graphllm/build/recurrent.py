"""What hybrid layers share as the builder adds them: the zeroing of padded positions
before a recurrence, the causal conv with its carried state, and the carried states themselves.

A layer that carries state to the next step reads `past_key_values.{i}.conv_state` /
`past_key_values.{i}.recurrent_state` when the workload has a past (none: the state starts at
zero) and always writes `present.{i}.conv_state` / `present.{i}.recurrent_state`, graph outputs
of role STATE: fixed in size, replacing the past rather than appending to it. The export graph
(a past of symbolic length) always has them; the runtimes feed zeros for a prefill.
"""

from __future__ import annotations

from collections.abc import Callable

from graphllm.build.dims import B, S, T
from graphllm.build.emit import Emitter
from graphllm.ir import STATE, Dim, Node, Ref, TensorType

S_CONV = "S_conv"  # the conv's input with a past: the K-1 carried inputs and the T new ones


def conv_bindings(kernel: int, seq_len: int) -> dict[str, float]:
    """The bindings a graph with causal convs of `kernel` taps needs (its `S_conv`)."""
    return {S_CONV: kernel - 1 + seq_len}


def per_group(groups: int, per: int, start: int, width: int) -> list[int]:
    """Channels start .. start + width of each of `groups` blocks of `per`, group by group: the
    rows of a projection laid out per head group, as both recurrent mixers' are."""
    return [j * per + start + e for j in range(groups) for e in range(width)]


def attention_mask(b: Emitter) -> Node:
    """The graph input `attention_mask` (B, S) int64, 0 on padded positions (added once)."""
    if "attention_mask" in b.g:
        return b.g["attention_mask"]
    return b.g.input("attention_mask", TensorType((B, S), "int64"))


def zero_padding(b: Emitter, name: str, x: Node) -> Node:
    """x (B, T, C) with its padded positions zeroed from the attention mask, as transformers'
    apply_mask_to_padding_states does before a linear-attention or Mamba mixer."""
    return b.g.add("zero_padding", name, (x, attention_mask(b)))


def causal_conv(
    b: Emitter,
    p: str,
    x: Node | Ref,
    layer: int,
    kernel: int,
    bias: bool = False,
    weight_view: tuple[str, dict] | None = None,
) -> Node:
    """x (B, T, C) through the depthwise causal conv `{p}.conv1d` (weight (C, 1, K), a bias
    where `bias`), after the layer's conv state when the workload has a past; writes the
    present conv state (the last K-1 inputs, (B, K-1, C)) as output `present.{layer}.conv_state`.
    `weight_view` (op, attrs): the weight read through that op first (Qwen3-Next regroups its
    rows as it regroups the conv's input channels).
    """
    g = b.g
    # x may be one output of a split (Mamba2's xBC, a Ref) as well as a node
    c = (x.out if isinstance(x, Node) else g.type_of(x)).dims[-1]
    taps = (Dim("one", "hidden", 1), Dim("K", "hidden", kernel))
    w = b.param(f"{p}.conv1d.weight", (c, *taps), "linear_attention")
    if weight_view is not None:
        w = g.add(weight_view[0], f"{p}.conv1d.weight_view", (w,), weight_view[1])
    keep = kernel - 1
    inputs: tuple[Node, ...] = (x,)
    if b.wl.past_len > 0:
        past_t = TensorType(
            (B, Dim("conv_w", "key_token", keep, positions=(f"P-{keep}", "P")), c),
            b.wl.stream_dtype,
        )
        past = g.input(f"past_key_values.{layer}.conv_state", past_t)
        s_conv = Dim(S_CONV, "key_token", positions=(f"P-{keep}", "P+T"))
        x = g.add("state_concat", f"{p}.conv_concat", (past, x), {"axes": {"s": s_conv}})
        inputs = (x,)
    w_now = Dim("conv_w", "key_token", keep, positions=(f"P+T-{keep}", "P+T"))
    state = g.add("conv_state", f"{p}.conv_state", inputs, {"axes": {"w": w_now}})
    g.set_output(f"present.{layer}.conv_state", state, STATE)
    _carries_state(b, layer)
    attrs = {"axes": {"t": T}, "kernel": kernel, "with_state": b.wl.past_len > 0}
    if bias:
        bb = b.param(f"{p}.conv1d.bias", (c,), "linear_attention")
        if weight_view is not None:  # the bias's entries follow the weight's rows
            view = {"axes": {"c": c}, "index": weight_view[1]["index"]}
            bb = g.add(weight_view[0], f"{p}.conv1d.bias_view", (bb,), view)
        return g.add("causal_conv1d_bias", f"{p}.conv1d", (x, w, bb), attrs)
    return g.add("causal_conv1d", f"{p}.conv1d", (x, w), attrs)


def recurrent_state(b: Emitter, layer: int, dims: tuple[Dim, ...]) -> Node | None:
    """The past recurrent state input `past_key_values.{layer}.recurrent_state` (B, *dims) in
    fp32, or None without a past (the recurrence starts from zeros)."""
    if b.wl.past_len == 0:
        return None
    t = TensorType((B, *dims), "fp32")
    return b.g.input(f"past_key_values.{layer}.recurrent_state", t)


def set_recurrent_state(b: Emitter, layer: int, state: object) -> None:
    """Make `state` (a Node or Ref) the output `present.{layer}.recurrent_state` (role STATE)."""
    b.g.set_output(f"present.{layer}.recurrent_state", state, STATE)  # type: ignore[arg-type]
    _carries_state(b, layer)


def _carries_state(b: Emitter, layer: int) -> None:
    """Record that `layer` carries state rather than keys and values (graph.meta['state_layers']:
    what the memory pass prices as full attention for the comparison)."""
    layers = b.g.meta.setdefault("state_layers", [])
    if layer not in layers:
        layers.append(layer)


# layer type -> (the mixer's module name under model.layers.{i}, the function that builds it:
# (builder, scope, x, layer) -> the mixer's output); a layer type absent here attends
MIXERS: dict[str, tuple[str, Callable[[Emitter, str, Node, int], Node]]] = {}
