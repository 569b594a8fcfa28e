"""Qwen3-Next's Gated DeltaNet, as the builder adds it for a `linear_attention` layer (issue 19).

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


def gated_deltanet(b: Emitter, p: str, x: Node, i: int) -> Node:
    """The linear-attention mixer of layer i under scope `p` (model.layers.{i}.linear_attn).

    The projections' channels are laid out per key-head group (transformers'
    fix_query_key_value_ordering: [q, k, v, z] and [b, a] for each group), and the graph keeps
    that order group-major down to the delta rule (the conv's weight rows regrouped to match),
    so a split of the groups, a TP rank's heads, carries through every op."""
    c, g = b.cfg, b.g
    b.scopes[p] = "linear_attention"
    n_k, n_v = c.linear_num_key_heads, c.linear_num_value_heads
    d_k, d_v, r = c.linear_key_head_dim, c.linear_value_head_dim, n_v // n_k
    key_dim, value_dim = n_k * d_k, n_v * d_v
    heads_k, heads_v = Dim("h_lk", "kv_head", n_k), Dim("h_lv", "head", n_v)
    e_k, e_v = Dim("d_lk", "head_dim", d_k), Dim("d_lv", "head_dim", d_v)
    x = zero_padding(b, f"{p}.zero_padding", x)
    per = 2 * d_k + 2 * r * d_v  # one group's [q, k, v, z]
    qkvz = b.linear(f"{p}.in_proj_qkvz", x, Dim("d_qkvz", "hidden", n_k * per), "linear_attention")
    ba = b.linear(f"{p}.in_proj_ba", x, Dim("d_ba", "hidden", 2 * n_v), "linear_attention")
    group = 2 * d_k + r * d_v  # one group's q, k, v: what the conv reads
    conv_dim = Dim("d_conv", "hidden", n_k * group)
    d_value = Dim("d_lvalue", "hidden", value_dim)

    def select(name: str, src: Node, index: list[int], out: Dim) -> Node:
        attrs = {"axes": {"c": out}, "index": index, "groups": n_k}
        return g.add("select_blocked", name, (src,), attrs)

    mixed = select(f"{p}.qkv", qkvz, per_group(n_k, per, 0, group), conv_dim)  # (B, T, C)
    z = select(f"{p}.z", qkvz, per_group(n_k, per, group, r * d_v), d_value)
    beta_in = select(f"{p}.b", ba, per_group(n_k, 2 * r, 0, r), heads_v)  # (B, T, value heads)
    a_in = select(f"{p}.a", ba, per_group(n_k, 2 * r, r, r), heads_v)
    # the checkpoint's conv weight holds q (all groups), then k, then v: its rows regrouped
    rows = [
        [j * d_k + e for e in range(d_k)]
        + [key_dim + j * d_k + e for e in range(d_k)]
        + [2 * key_dim + j * r * d_v + e for e in range(r * d_v)]
        for j in range(n_k)
    ]
    regroup = {"index": [x for block in rows for x in block], "axes": {"c": conv_dim}}
    conv = causal_conv(b, p, mixed, i, c.conv_kernel, weight_view=("select_rows", regroup))
    conv = g.add("silu", f"{p}.conv_act", (conv,))
    e_group = Dim("d_lgroup", "head_dim", group)
    grouped = {"axes": {"h": heads_k, "e": e_group}}
    conv = g.add("to_heads", f"{p}.groups", (conv,), grouped)  # (B, T, key heads, q|k|v)
    e_vs = Dim("d_lvs", "head_dim", r * d_v)
    parts = {"f1": e_k, "f2": e_k, "f3": e_vs}
    split = g.add(
        "split3", f"{p}.qkv_split", (conv,), {"axes": parts, "sizes": [d_k, d_k, r * d_v]}
    )
    q, k = Ref(split.name, 0), Ref(split.name, 1)  # (B, T, key heads, d_k)
    r_dim = Dim("r_lv", "head", r)
    ungroup = {"axes": {"r": r_dim, "e": e_v, "h": heads_v}}
    v = g.add("ungroup_heads", f"{p}.v_heads", (Ref(split.name, 2),), ungroup)  # (B, T, h_v, d_v)
    # the kernel's use_qk_l2norm_in_kernel, eps 1e-6 whatever the model's rms_norm_eps
    q = g.add("l2normalize", f"{p}.q_l2norm", (q,), {"eps": 1e-6})
    k = g.add("l2normalize", f"{p}.k_l2norm", (k,), {"eps": 1e-6})
    beta = g.add("sigmoid", f"{p}.beta", (beta_in,))
    a_log = b.param(f"{p}.A_log", (heads_v,), "linear_attention")
    dt_bias = b.param(f"{p}.dt_bias", (heads_v,), "linear_attention")
    decay = g.add("delta_decay", f"{p}.decay", (a_in, a_log, dt_bias))
    ins: tuple[Node, ...] = (q, k, v, decay, beta)  # type: ignore[assignment]
    past = recurrent_state(b, i, (heads_v, e_k, e_v))
    if past is None:
        op = "gated_delta_chunked"  # a prefill from a zero state
    else:
        ins += (past,)
        # transformers steps token by token for one new token, else runs the chunked form
        op = "gated_delta_step" if b.wl.seq_len == 1 else "gated_delta_chunked_state"
    attrs = {"axes": {"t": T}, "chunk": c.linear_chunk_size}
    core = g.add(op, f"{p}.core", ins, attrs)  # (B, T, value heads, d_v), the final state
    set_recurrent_state(b, i, Ref(core.name, 1))
    z = g.add("to_heads", f"{p}.z_heads", (z,), {"axes": {"h": heads_v, "e": e_v}})
    b.scopes[f"{p}.norm"] = "norms"
    w = b.param(f"{p}.norm.weight", (e_v,), "norms")
    o = g.add("gated_rmsnorm", f"{p}.norm", (Ref(core.name, 0), z, w), {"eps": c.rms_norm_eps})
    o = g.add("from_heads", f"{p}.merge_heads", (o,), {"axes": {"(h e)": d_value}})
    return b.linear(f"{p}.out_proj", o, b.d, "linear_attention")


MIXERS["linear_attention"] = ("linear_attn", gated_deltanet)
