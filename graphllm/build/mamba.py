"""The Mamba2 mixer as the builder adds it (issue 19, Nemotron-H's NemotronHMamba2Mixer), from the
config's Mamba fields alone:

  x  = zero_padding(x)                                   padded positions enter as zeros
  z | xBC | dt = in_proj(x)                              inner | inner + 2 G N | H channels
  xBC = zero_padding(silu(conv1d(xBC)))                  the causal conv, with its carried state
  x | B | C = xBC                                        x as H heads of P, B and C as G groups of N
  y, state = scan(x, dt, A_log, B, C, D, dt_bias[, past state])
  out = out_proj(gated_group_rmsnorm(y, z))              y * silu(z), normed per group of inner/G

The scan is the chunked form for a prefill (chunks of the config's chunk_size) and the recurrent
step for one token after a past, as transformers dispatches; the conv state and the SSM state
(B, H, P, N) are the layer's carried state (graph outputs of role STATE).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from graphllm.build.dims import T
from graphllm.build.recurrent import (
    MIXERS,
    causal_conv,
    recurrent_state,
    set_recurrent_state,
    zero_padding,
)
from graphllm.ir import Dim, Node, Ref

if TYPE_CHECKING:
    from graphllm.build.builder import _Builder


def scan_form(b: _Builder) -> str:
    """The scan's form for the builder's workload: transformers' recurrent step for one token
    after a past, its chunked form otherwise."""
    return "recurrent" if b.wl.past_len > 0 and b.wl.seq_len == 1 else "chunked"


def mamba_mixer(b: _Builder, p: str, x: Node, i: int) -> Node:
    """Layer i's Mamba2 mixer at scope p: (B, T, d) -> (B, T, d); its weights count under the
    recurrent mixers' kind, linear_attention, as the shared conv's do."""
    c, g = b.cfg, b.g
    b.scopes[p] = "mamba"
    heads = Dim("h_m", "head", c.mamba_num_heads)
    width = Dim("p_m", "head_dim", c.mamba_head_dim)
    groups = Dim("g_m", "kv_head", c.mamba_n_groups)
    state = Dim("n_m", "head_dim", c.ssm_state_size)
    inner = Dim("d_m", "hidden", c.mamba_inner)
    gn = c.mamba_n_groups * c.ssm_state_size
    bc = Dim("d_gn", "hidden", gn)
    conv = Dim("d_conv", "hidden", c.mamba_inner + 2 * gn)
    proj = Dim("d_in_proj", "hidden", c.mamba_inner + conv.size + c.mamba_num_heads)  # type: ignore[operator]
    x = zero_padding(b, f"{p}.zero_padding", x)
    zxbcdt = b.linear(f"{p}.in_proj", x, proj, "linear_attention", bias=c.mamba_proj_bias)
    # z | xBC | dt, each picked from the fused projection's channels (not a split of it, so that
    # tp cuts in_proj by columns and gathers its output)
    picked, start = [], 0
    for what, dim in (("z", inner), ("xBC", conv), ("dt", heads)):
        index = list(range(start, start + dim.size))  # type: ignore[operator]
        attrs = {"axes": {"c": dim}, "index": index}
        picked.append(g.add("pick_channels", f"{p}.in_proj_{what}", (zxbcdt,), attrs))
        start += dim.size  # type: ignore[operator]
    z, xbc, dt = picked
    xbc_node = causal_conv(b, p, xbc, i, c.conv_kernel, bias=c.mamba_conv_bias)
    xbc_node = g.add("silu", f"{p}.conv_act", (xbc_node,))
    xbc_node = zero_padding(b, f"{p}.conv_zero_padding", xbc_node)
    parts = {"f1": inner, "f2": bc, "f3": bc}
    attrs = {"axes": parts, "sizes": [d.size for d in parts.values()]}
    split = g.add("split3", f"{p}.xbc_split", (xbc_node,), attrs)  # x | B | C
    xs = g.add(
        "to_heads", f"{p}.x_heads", (Ref(split.name, 0),), {"axes": {"h": heads, "e": width}}
    )
    bs = g.add(
        "to_heads", f"{p}.B_groups", (Ref(split.name, 1),), {"axes": {"h": groups, "e": state}}
    )
    cs = g.add(
        "to_heads", f"{p}.C_groups", (Ref(split.name, 2),), {"axes": {"h": groups, "e": state}}
    )
    a_log = b.param(f"{p}.A_log", (heads,), "linear_attention")
    d = b.param(f"{p}.D", (heads,), "linear_attention")
    dt_bias = b.param(f"{p}.dt_bias", (heads,), "linear_attention")
    inputs: tuple = (xs, dt, a_log, bs, cs, d, dt_bias)
    past = recurrent_state(b, i, (heads, width, state))
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
    y = g.add("from_heads", f"{p}.y", (Ref(scan.name, 0),), {"axes": {"(h e)": inner}})
    b.scopes[f"{p}.norm"] = "norms"
    w = b.param(f"{p}.norm.weight", (inner,), "norms")
    norm_attrs = {"group_size": c.mamba_inner // c.mamba_n_groups, "eps": c.rms_norm_eps}
    y = g.add("gated_group_rmsnorm", f"{p}.norm", (y, z, w), norm_attrs)
    return b.linear(f"{p}.out_proj", y, b.d, "linear_attention", bias=c.mamba_proj_bias)


MIXERS["mamba2"] = ("mixer", mamba_mixer)
