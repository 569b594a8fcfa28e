"""The MoE feed-forward as the builder adds it: router, top-k, dispatch, experts, combine, shared
expert. Every family's routing and checkpoint names come from the config's fields (scoring,
top-k method, renormalisation and scaling; MoENames), so nothing here knows a family.
"""

from __future__ import annotations

from graphllm.build.dims import C
from graphllm.build.emit import Emitter
from graphllm.ir import Dim, Node, Ref


def moe_ffn(b: Emitter, layer: str, x: Node) -> Node:
    """Router -> top-k -> dispatch -> experts -> weighted combine (+ a shared expert, gated or not)."""
    c, g, names = b.cfg, b.g, b.cfg.moe_names
    p = f"{layer}.{names.block}"
    b.scopes.update(
        {
            p: "moe",
            f"{p}.{names.router}": "router",
            f"{p}.router": "router",
            f"{p}.experts": "experts",
            f"{p}.{names.shared_gate}": "router",
        }
    )
    n_exp = Dim("E", "expert", c.num_experts)
    ffn = Dim("ffn_e", "ffn", c.moe_intermediate_size)
    logits = b.linear(f"{p}.{names.router}", x, n_exp, "router", bias=c.router_bias)
    weights, chosen = router(b, p, logits)
    slots = g.add(
        "moe_dispatch", f"{p}.experts.dispatch", (x, chosen), {"axes": {"x": n_exp, "c": C}}
    )
    if c.experts_stacked:
        y = stacked_experts(b, p, slots, n_exp, ffn)
        return g.add("moe_combine", f"{p}.experts.combine", (y, weights, chosen))

    def expert_linear(role: str, inp: Node, out: Dim) -> Node:
        w = b.param(
            f"{p}.experts.*.{role}.weight",
            (n_exp, out, inp.out.dims[-1]),
            "moe_experts",
            stacked="expert",
        )
        return g.add("expert_linear", f"{p}.experts.{role}", (inp, w))

    if c.moe_weights_input:
        slots = g.add("moe_scale_slots", f"{p}.experts.scale", (slots, weights, chosen))
    if c.fused_experts:
        y = _fused_experts(b, p, slots, n_exp, ffn)
    elif not c.mlp_gated:  # NemotronHExperts: down(act(up(x)))
        up = expert_linear(names.expert_up, slots, ffn)  # (E, C, ffn_e)
        y = expert_linear(names.expert_down, b.act(f"{p}.experts.act_fn", up), b.d)
    else:
        gate = expert_linear(names.expert_gate, slots, ffn)  # (E, C, ffn_e)
        up = expert_linear(names.expert_up, slots, ffn)
        m = g.add("mul", f"{p}.experts.mul", (b.act(f"{p}.experts.act_fn", gate), up))
        y = expert_linear(names.expert_down, m, b.d)  # (E, C, d)
    if c.moe_weights_input:
        out = g.add("moe_sum", f"{p}.experts.combine", (y, chosen))  # (B, T, d)
    else:
        out = g.add("moe_combine", f"{p}.experts.combine", (y, weights, chosen))  # (B, T, d)
    return _shared(b, p, x, out)


def _shared(b: Emitter, p: str, x: Node, out: Node) -> Node:
    """The routed experts' sum plus the shared expert (gated or not), where there is one."""
    c, g, names = b.cfg, b.g, b.cfg.moe_names
    if c.shared_expert_intermediate_size:
        s = f"{p}.{names.shared}"
        sh = b.mlp(s, x, c.shared_expert_intermediate_size, "shared_experts")
        if c.shared_expert_gate:
            one = Dim("1", "hidden", 1)
            gl = b.linear(f"{p}.{names.shared_gate}", x, one, "router")
            gs = g.add("sigmoid", f"{p}.{names.shared_gate}.sigmoid", (gl,))
            sh = g.add("gate_mul", f"{s}.gated", (sh, gs))
        out = g.add("add", f"{p}.add_shared", (out, sh))
    return out


def _fused_experts(b: Emitter, p: str, slots: Node, n_exp: Dim, ffn: Dim) -> Node:
    """Llama4TextExperts: bmm with gate_up_proj (E, d, 2f), chunked into gate and up, then bmm
    with down_proj (E, f, d); the tensors as the checkpoint stores them, whole."""
    g = b.g
    two = Dim("2ffn_e", "ffn", 2 * ffn.size)  # type: ignore[operator]
    # routed experts, stacked: memory and bytes moved count a chosen expert's slice, and ep cuts
    # the E axis. Not marked layout "in_out" (gpt-oss's): tp then cuts gate_up's 2f axis and
    # down's f axis, where in_out would keep gate_up whole on every rank (a split cuts it)
    fused = {"stacked": "expert"}
    w_gu = b.param(f"{p}.experts.gate_up_proj", (n_exp, b.d, two), "moe_experts", **fused)
    gu = g.add("expert_matmul", f"{p}.experts.gate_up", (slots, w_gu))
    attrs = {"axes": {"f1": ffn, "f2": ffn}, "sizes": [ffn.size, ffn.size]}
    split = g.add("split", f"{p}.experts.gate_up_split", (gu,), attrs)
    gate, up = Ref(split.name, 0), Ref(split.name, 1)
    m = g.add("mul", f"{p}.experts.mul", (b.act(f"{p}.experts.act_fn", gate), up))
    w_down = b.param(f"{p}.experts.down_proj", (n_exp, ffn, b.d), "moe_experts", **fused)
    return g.add("expert_matmul", f"{p}.experts.down", (m, w_down))


def router(b: Emitter, p: str, logits: Node) -> tuple[Node | Ref, Ref]:
    """(routing weights, chosen expert ids), each (B, T, k), as transformers' routers compute them.

    Scores: softmax or sigmoid. Selection: 'greedy' top-k; 'group_limited_greedy' (top-k inside
    the topk_group groups with the best single score: DeepSeek-V2); 'noaux_tc' (DeepSeek-V3: the
    scores plus the stored e_score_correction_bias choose, groups ranked by their two best, and
    the unbiased scores of the chosen experts weight them). Then optional renormalisation and
    routed_scaling_factor (not both where renorm_replaces_scaling).
    """
    c, g = b.cfg, b.g
    n_exp = logits.out.dims[-1]
    scoring = c.scoring_func
    if c.topk_then_score:
        # gpt-oss: the top-k of the logits, then the scores over the k chosen
        k = c.num_experts_per_tok
        top = g.add(
            "topk", f"{p}.router.topk", (logits,), {"k": k, "axes": {"k": Dim("k", "topk", k)}}
        )
        w = g.add(scoring, f"{p}.router.{scoring}", (Ref(top.name, 0),))
        return w, Ref(top.name, 1)
    scores = g.add(scoring, f"{p}.router.{scoring}", (logits,))  # (B, T, E)
    choose: Node = scores
    if c.topk_method == "noaux_tc":
        where = c.moe_names.correction_bias
        name = f"{p}.{where}" if where else f"{logits.name}.e_score_correction_bias"
        bias = b.param(name, (n_exp,), "router")
        choose = g.add("bias_add", f"{p}.router.bias", (scores, bias))
    if c.topk_method != "greedy" and c.n_group > 1:
        attrs = {
            "n_group": c.n_group,
            "topk_group": c.topk_group,
            "score": "max" if c.topk_method == "group_limited_greedy" else "top2",
            "fill": 0.0 if c.topk_method == "group_limited_greedy" else float("-inf"),
        }
        choose = g.add("group_limit", f"{p}.router.group_limit", (choose,), attrs)
    topk = Dim("k", "topk", c.num_experts_per_tok)
    top = g.add(
        "topk", f"{p}.router.topk", (choose,), {"k": c.num_experts_per_tok, "axes": {"k": topk}}
    )
    weights: Node | Ref = Ref(top.name, 0)
    chosen = Ref(top.name, 1)
    if c.topk_method == "noaux_tc":
        weights = g.add("gather_k", f"{p}.router.gather", (scores, chosen))
    if c.norm_topk_prob:
        weights = g.add("normalize", f"{p}.router.normalize", (weights,))
    if c.routed_scaling_factor != 1.0 and not (c.norm_topk_prob and c.renorm_replaces_scaling):
        attrs = {"value": c.routed_scaling_factor}
        weights = g.add("mul_const", f"{p}.router.scale", (weights,), attrs)
    return weights, chosen


def stacked_experts(b: Emitter, p: str, slots: Node, n_exp: Dim, ffn: Dim) -> Node:
    """gpt-oss's experts: each projection one (E, in, out) tensor with an (E, out) bias, gate and
    up interleaved in gate_up_proj, through the clamped SwiGLU. (E, C, d) -> (E, C, d)."""
    c, g = b.cfg, b.g
    two = Dim("2ffn_e", "ffn", 2 * c.moe_intermediate_size)

    def linear(role: str, inp: Node, out: Dim) -> Node:
        # layout "in_out": (E, in, out), where the other families' experts are (E, out, in)
        w = b.param(
            f"{p}.experts.{role}",
            (n_exp, inp.out.dims[-1], out),
            "moe_experts",
            stacked="expert",
            layout="in_out",
        )
        bias = b.param(f"{p}.experts.{role}_bias", (n_exp, out), "moe_experts", stacked="expert")
        # the op is not named as its weight: the checkpoint calls the tensor itself gate_up_proj
        return g.add("expert_linear_bias", f"{p}.experts.{role}.matmul", (inp, w, bias))

    gu = linear(c.moe_names.expert_gate, slots, two)  # (E, C, 2 ffn_e)
    attrs = {"axes": {"f1": ffn, "f2": ffn}}
    split = g.add("split_interleaved", f"{p}.experts.gate_up_split", (gu,), attrs)
    gate, up = Ref(split.name, 0), Ref(split.name, 1)
    act = {"limit": c.swiglu_limit, "alpha": c.swiglu_alpha}
    m = g.add("clamped_swiglu", f"{p}.experts.act_fn", (gate, up), act)
    return linear(c.moe_names.expert_down, m, b.d)
