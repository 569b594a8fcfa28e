"""Qwen3-Next's Gated DeltaNet, as the builder adds it for a `linear_attention` layer.

As transformers' Qwen3NextGatedDeltaNet: padded positions zeroed; in_proj_qkvz and in_proj_ba,
whose outputs are laid out per key head group ([q, k, v, z] and [b, a] for each of the
linear_num_key_heads groups) and regrouped, group by group, into q|k|v for the conv, z, b and
a; the causal conv
with SiLU over q|k|v (its conv state carried); q and k L2-normed per head; the decay
g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b); the gated delta rule (chunked from a
zero state, token by token in a decode step; its recurrent state carried); the gated RMSNorm
norm(o) * w * silu(z) per value head; out_proj.
"""

from __future__ import annotations

from typing import NamedTuple

from graphllm.build.dims import T
from graphllm.build.emit import Emitter
from graphllm.build.recurrent import (
    MIXERS,
    causal_conv,
    per_group,
    recurrent_state,
    set_recurrent_state,
    zero_padding,
)
from graphllm.ir import Dim, Node, Ref
from graphllm.models.model_config import ModelConfig


class _Sizes(NamedTuple):
    """A layer's heads: n_k key heads (the groups), each with r of the n_v value heads; d_k and
    d_v the key and value head dims."""

    n_k: int
    n_v: int
    d_k: int
    d_v: int
    r: int
    heads_k: Dim
    heads_v: Dim
    e_k: Dim
    e_v: Dim
    conv: Dim  # what the conv reads: q, k and v of every group

    @staticmethod
    def of(c: ModelConfig) -> _Sizes:
        n_k, n_v = c.linear_num_key_heads, c.linear_num_value_heads
        d_k, d_v, r = c.linear_key_head_dim, c.linear_value_head_dim, n_v // n_k
        return _Sizes(
            n_k=n_k,
            n_v=n_v,
            d_k=d_k,
            d_v=d_v,
            r=r,
            heads_k=Dim("h_lk", "kv_head", n_k),
            heads_v=Dim("h_lv", "head", n_v),
            e_k=Dim("d_lk", "head_dim", d_k),
            e_v=Dim("d_lv", "head_dim", d_v),
            conv=Dim("d_conv", "hidden", n_k * (2 * d_k + r * d_v)),
        )


def gated_deltanet(b: Emitter, p: str, x: Node, i: int) -> Node:
    """The linear-attention mixer of layer i under scope `p` (model.layers.{i}.linear_attn).

    The projections' channels are laid out per key-head group (transformers'
    fix_query_key_value_ordering: [q, k, v, z] and [b, a] for each group), and the graph keeps
    that order group-major down to the delta rule (the conv's weight rows regrouped to match),
    so a split of the groups, a TP rank's heads, carries through every op."""
    c, g = b.cfg, b.g
    b.scopes[p] = "linear_attention"
    m = _Sizes.of(c)
    n_k, d_k, d_v, r = m.n_k, m.d_k, m.d_v, m.r
    x = zero_padding(b, f"{p}.zero_padding", x)
    per = 2 * d_k + 2 * r * d_v  # one group's [q, k, v, z]
    qkvz = b.linear(f"{p}.in_proj_qkvz", x, Dim("d_qkvz", "hidden", n_k * per), "linear_attention")
    ba = b.linear(f"{p}.in_proj_ba", x, Dim("d_ba", "hidden", 2 * m.n_v), "linear_attention")
    group = 2 * d_k + r * d_v  # one group's q, k, v: what the conv reads
    d_value = Dim("d_lvalue", "hidden", m.n_v * d_v)

    def select(name: str, src: Node, index: list[int], out: Dim) -> Node:
        attrs = {"axes": {"c": out}, "index": index, "groups": n_k}
        return g.add("select_blocked", name, (src,), attrs)

    mixed = select(f"{p}.qkv", qkvz, per_group(n_k, per, 0, group), m.conv)  # (B, T, C)
    z = select(f"{p}.z", qkvz, per_group(n_k, per, group, r * d_v), d_value)
    beta_in = select(f"{p}.b", ba, per_group(n_k, 2 * r, 0, r), m.heads_v)  # (B, T, value heads)
    a_in = select(f"{p}.a", ba, per_group(n_k, 2 * r, r, r), m.heads_v)
    q, k, v = _qkv(b, p, mixed, i, m)
    core = _delta_rule(b, p, i, m, (q, k, v), a_in, beta_in)
    z = g.add("to_heads", f"{p}.z_heads", (z,), {"axes": {"h": m.heads_v, "e": m.e_v}})
    b.scopes[f"{p}.norm"] = "norms"
    w = b.param(f"{p}.norm.weight", (m.e_v,), "norms")
    o = g.add("gated_rmsnorm", f"{p}.norm", (Ref(core.name, 0), z, w), {"eps": c.rms_norm_eps})
    o = g.add("from_heads", f"{p}.merge_heads", (o,), {"axes": {"(h e)": d_value}})
    return b.linear(f"{p}.out_proj", o, b.d, "linear_attention")


def _qkv(b: Emitter, p: str, mixed: Node, i: int, m: _Sizes) -> tuple[Node | Ref, ...]:
    """q and k (B, T, key heads, d_k), L2-normed, and v (B, T, value heads, d_v): q|k|v through
    the causal conv with SiLU, split per group."""
    g, n_k, d_k, d_v, r = b.g, m.n_k, m.d_k, m.d_v, m.r
    key_dim = n_k * d_k
    # the checkpoint's conv weight holds q (all groups), then k, then v: its rows regrouped
    rows = [
        [j * d_k + e for e in range(d_k)]
        + [key_dim + j * d_k + e for e in range(d_k)]
        + [2 * key_dim + j * r * d_v + e for e in range(r * d_v)]
        for j in range(n_k)
    ]
    regroup = {"index": [x for block in rows for x in block], "axes": {"c": m.conv}}
    conv = causal_conv(b, p, mixed, i, b.cfg.conv_kernel, weight_view=("select_rows", regroup))
    conv = g.add("silu", f"{p}.conv_act", (conv,))
    e_group = Dim("d_lgroup", "head_dim", 2 * d_k + r * d_v)
    grouped = {"axes": {"h": m.heads_k, "e": e_group}}
    conv = g.add("to_heads", f"{p}.groups", (conv,), grouped)  # (B, T, key heads, q|k|v)
    e_vs = Dim("d_lvs", "head_dim", r * d_v)
    parts = {"f1": m.e_k, "f2": m.e_k, "f3": e_vs}
    split = g.add(
        "split3", f"{p}.qkv_split", (conv,), {"axes": parts, "sizes": [d_k, d_k, r * d_v]}
    )
    q, k = Ref(split.name, 0), Ref(split.name, 1)  # (B, T, key heads, d_k)
    r_dim = Dim("r_lv", "head", r)
    ungroup = {"axes": {"r": r_dim, "e": m.e_v, "h": m.heads_v}}
    v = g.add("ungroup_heads", f"{p}.v_heads", (Ref(split.name, 2),), ungroup)  # (B, T, h_v, d_v)
    # the kernel's use_qk_l2norm_in_kernel, eps 1e-6 whatever the model's rms_norm_eps
    q = g.add("l2normalize", f"{p}.q_l2norm", (q,), {"eps": 1e-6})
    k = g.add("l2normalize", f"{p}.k_l2norm", (k,), {"eps": 1e-6})
    return q, k, v


def _delta_rule(
    b: Emitter, p: str, i: int, m: _Sizes, qkv: tuple, a_in: Node, beta_in: Node
) -> Node:
    """The gated delta rule over q, k, v with its decay and beta, after the layer's past state
    where there is one: outputs o (B, T, value heads, d_v) and the final state, a graph output."""
    g = b.g
    beta = g.add("sigmoid", f"{p}.beta", (beta_in,))
    a_log = b.param(f"{p}.A_log", (m.heads_v,), "linear_attention")
    dt_bias = b.param(f"{p}.dt_bias", (m.heads_v,), "linear_attention")
    decay = g.add("delta_decay", f"{p}.decay", (a_in, a_log, dt_bias))
    ins: tuple[Node, ...] = (*qkv, decay, beta)
    past = recurrent_state(b, i, (m.heads_v, m.e_k, m.e_v))
    if past is None:
        op = "gated_delta_chunked"  # a prefill from a zero state
    else:
        ins += (past,)
        # transformers steps token by token for one new token, else runs the chunked form
        op = "gated_delta_step" if b.wl.seq_len == 1 else "gated_delta_chunked_state"
    attrs = {"axes": {"t": T}, "chunk": b.cfg.linear_chunk_size}
    core = g.add(op, f"{p}.core", ins, attrs)  # (B, T, value heads, d_v), the final state
    set_recurrent_state(b, i, Ref(core.name, 1))
    return core


MIXERS["linear_attention"] = ("linear_attn", gated_deltanet)
