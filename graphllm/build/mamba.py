"""The Mamba2 mixer as the builder adds it (Nemotron-H's NemotronHMamba2Mixer), from the
config's Mamba fields alone:

  x  = zero_padding(x)                                   padded positions enter as zeros
  z | xBC | dt = in_proj(x)                              inner | inner + 2 G N | H channels
                                                         (its rows read group by group: below)
  xBC = zero_padding(silu(conv1d(xBC)))                  the causal conv, with its carried state
  x | B | C = xBC                                        x as H heads of P, B and C as G groups of N
  y, state = scan(x, dt, A_log, B, C, D, dt_bias[, past state])
  out = out_proj(gated_group_rmsnorm(y, z))              y * silu(z), normed per group of inner/G

The scan is the chunked form for a prefill (chunks of the config's chunk_size) and the recurrent
step for one token after a past, as transformers dispatches; the conv state and the SSM state
(B, H, P, N) are the layer's carried state (graph outputs of role STATE).

in_proj's weight rows are read per group of heads ([z, x, B, C, dt] of each of the G groups,
`weight_rows`) and the conv's rows likewise ([x, B, C] of each group, `weight_rows` too), so that a
block of groups, a TP rank's, is a block of every tensor down to the scan (head-parallel TP as
vLLM's mamba_mixer2). The conv state's channels are in that per-group order.
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


def scan_form(b: Emitter) -> str:
    """The scan's form for the builder's workload: transformers' recurrent step for one token
    after a past, its chunked form otherwise."""
    return "recurrent" if b.wl.past_len > 0 and b.wl.seq_len == 1 else "chunked"


class _Sizes(NamedTuple):
    """A Mamba2 layer's dims and sizes: G groups of r heads of P channels, an SSM state of N."""

    heads: Dim  # H
    width: Dim  # P, a head's channels
    groups: Dim  # G
    state: Dim  # N
    inner: Dim  # H P, z's and x's channels
    conv: Dim  # the conv's channels: x, B and C
    proj: Dim  # in_proj's: z, x, B, C and dt
    n_g: int
    n: int
    r: int  # heads per group
    hp: int  # one group's heads' channels of z (and of x)
    gn: int  # G N, B's (and C's) channels

    @staticmethod
    def of(c: ModelConfig) -> _Sizes:
        gn = c.mamba_n_groups * c.ssm_state_size
        conv_n = c.mamba_inner + 2 * gn
        r = c.mamba_num_heads // c.mamba_n_groups
        return _Sizes(
            heads=Dim("h_m", "head", c.mamba_num_heads),
            width=Dim("p_m", "head_dim", c.mamba_head_dim),
            groups=Dim("g_m", "kv_head", c.mamba_n_groups),
            state=Dim("n_m", "head_dim", c.ssm_state_size),
            inner=Dim("d_m", "hidden", c.mamba_inner),
            conv=Dim("d_conv", "hidden", conv_n),
            proj=Dim("d_in_proj", "hidden", c.mamba_inner + conv_n + c.mamba_num_heads),
            n_g=c.mamba_n_groups,
            n=c.ssm_state_size,
            r=r,
            hp=r * c.mamba_head_dim,
            gn=gn,
        )


def mamba_mixer(b: Emitter, p: str, x: Node, i: int) -> Node:
    """Layer i's Mamba2 mixer at scope p: (B, T, d) -> (B, T, d); its weights count under the
    recurrent mixers' kind, linear_attention, as the shared conv's do."""
    c, g = b.cfg, b.g
    b.scopes[p] = "mamba"
    m = _Sizes.of(c)
    x = zero_padding(b, f"{p}.zero_padding", x)
    zxbcdt = _in_proj(b, p, x, m)
    per = 2 * m.hp + 2 * m.n + m.r  # one group's [z, x, B, C, dt]

    def select(what: str, first: int, width: int, out: Dim) -> Node:
        attrs = {"axes": {"c": out}, "index": per_group(m.n_g, per, first, width), "groups": m.n_g}
        return g.add("select_blocked", f"{p}.in_proj_{what}", (zxbcdt,), attrs)

    z = select("z", 0, m.hp, m.inner)  # head order: each group's heads are consecutive
    xbc = select("xBC", m.hp, m.hp + 2 * m.n, m.conv)  # [x, B, C] of each group
    dt = select("dt", 2 * m.hp + 2 * m.n, m.r, m.heads)
    xs, bs, cs = _split_xbc(b, p, _conv(b, p, xbc, i, m), m)
    scan = _scan(b, p, i, m, (xs, dt, bs, cs))
    y = g.add("from_heads", f"{p}.y", (Ref(scan.name, 0),), {"axes": {"(h e)": m.inner}})
    b.scopes[f"{p}.norm"] = "norms"
    w = b.param(f"{p}.norm.weight", (m.inner,), "norms")
    norm_attrs = {"group_size": c.mamba_inner // c.mamba_n_groups, "eps": c.rms_norm_eps}
    y = g.add("gated_group_rmsnorm", f"{p}.norm", (y, z, w), norm_attrs)
    return b.linear(f"{p}.out_proj", y, b.d, "linear_attention", bias=c.mamba_proj_bias)


def _in_proj(b: Emitter, p: str, x: Node, m: _Sizes) -> Node:
    """in_proj(x), its rows (z | x | B | C | dt) read group by group: [z, x, B, C, dt] of each
    group's heads, so that a block of groups (a TP rank's) is a block of its channels."""
    g, inner_n, n, hp, gn, r = b.g, b.cfg.mamba_inner, m.n, m.hp, m.gn, m.r
    rows = [
        [j * hp + e for e in range(hp)]
        + [inner_n + j * hp + e for e in range(hp)]
        + [2 * inner_n + j * n + e for e in range(n)]
        + [2 * inner_n + gn + j * n + e for e in range(n)]
        + [2 * inner_n + 2 * gn + j * r + e for e in range(r)]
        for j in range(m.n_g)
    ]
    index = [k for block in rows for k in block]
    view = {"axes": {"c": m.proj}, "index": index, "groups": m.n_g}
    w = b.param(f"{p}.in_proj.weight", (m.proj, b.d), "linear_attention")
    w = g.add("weight_rows", f"{p}.in_proj.weight_view", (w,), view)
    if b.cfg.mamba_proj_bias:
        bias = b.param(f"{p}.in_proj.bias", (m.proj,), "linear_attention")
        bias = g.add("weight_rows", f"{p}.in_proj.bias_view", (bias,), view)
        return g.add("linear_bias", f"{p}.in_proj", (x, w, bias))
    return g.add("linear", f"{p}.in_proj", (x, w))


def _conv(b: Emitter, p: str, xbc: Node, i: int, m: _Sizes) -> Node:
    """zero_padding(silu(conv1d(xBC))), the causal conv with its carried state."""
    c, n, hp, gn = b.cfg, m.n, m.hp, m.gn
    inner_n = c.mamba_inner
    # the checkpoint's conv weight holds x (all heads), then B, then C: its rows regrouped
    conv_rows = [
        [j * hp + e for e in range(hp)]
        + [inner_n + j * n + e for e in range(n)]
        + [inner_n + gn + j * n + e for e in range(n)]
        for j in range(m.n_g)
    ]
    regroup = {"index": [k for block in conv_rows for k in block], "axes": {"c": m.conv}}
    out = causal_conv(
        b,
        p,
        xbc,
        i,
        c.conv_kernel,
        bias=c.mamba_conv_bias,
        weight_view=("weight_rows", regroup),
    )
    out = b.g.add("silu", f"{p}.conv_act", (out,))
    return zero_padding(b, f"{p}.conv_zero_padding", out)


def _split_xbc(b: Emitter, p: str, xbc: Node, m: _Sizes) -> tuple[Node, Node, Node]:
    """x (B, T, H, P) as heads, and B and C (B, T, G, N) as groups, from the conv's output."""
    g, hp, n = b.g, m.hp, m.n
    e_group = Dim("d_mgroup", "hidden", hp + 2 * n)  # a group's channels, not a head's
    grouped = g.add("to_heads", f"{p}.groups", (xbc,), {"axes": {"h": m.groups, "e": e_group}})
    e_x, e_n = Dim("d_mx", "hidden", hp), Dim("d_mn", "hidden", n)
    parts = {"f1": e_x, "f2": e_n, "f3": e_n}
    attrs = {"axes": parts, "sizes": [hp, n, n]}
    split = g.add("split3", f"{p}.xbc_split", (grouped,), attrs)  # x | B | C of each group
    ungroup = {"axes": {"r": Dim("r_m", "head", m.r), "e": m.width, "h": m.heads}}
    xs = g.add("ungroup_heads", f"{p}.x_heads", (Ref(split.name, 0),), ungroup)
    bc = Dim("d_gn", "hidden", m.gn)
    bs, cs = (
        g.add(
            "to_heads",
            f"{p}.{what}_groups",
            (
                g.add(
                    "from_heads", f"{p}.{what}_flat", (Ref(split.name, k),), {"axes": {"(h e)": bc}}
                ),
            ),
            {"axes": {"h": m.groups, "e": m.state}},
        )
        for k, what in ((1, "B"), (2, "C"))
    )  # (B, T, groups, N)
    return xs, bs, cs


def _scan(b: Emitter, p: str, i: int, m: _Sizes, xdtbc: tuple[Node, Node, Node, Node]) -> Node:
    """The scan over (x, dt, B, C) with its weights, after the layer's past state where there is
    one: outputs y (B, T, H, P) and the present state (B, H, P, N), a graph output."""
    c, g = b.cfg, b.g
    xs, dt, bs, cs = xdtbc
    a_log = b.param(f"{p}.A_log", (m.heads,), "linear_attention")
    d = b.param(f"{p}.D", (m.heads,), "linear_attention")
    dt_bias = b.param(f"{p}.dt_bias", (m.heads,), "linear_attention")
    inputs: tuple = (xs, dt, a_log, bs, cs, d, dt_bias)
    past = recurrent_state(b, i, (m.heads, m.width, m.state))
    op = "ssm_scan" if past is None else "ssm_scan_past"
    if past is not None:
        inputs = (*inputs, past)
    scan_attrs = {
        "axes": {"t": T},
        "chunk_size": c.mamba_chunk_size,
        "dt_min": c.mamba_dt_min,
        "form": scan_form(b),
    }
    scan = g.add(op, f"{p}.scan", inputs, scan_attrs)  # (B, T, H, P), (B, H, P, N)
    set_recurrent_state(b, i, Ref(scan.name, 1))
    return scan


MIXERS["mamba2"] = ("mixer", mamba_mixer)
