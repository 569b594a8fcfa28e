"""The fused lowerings' regions, as declared pattern tables (graphllm.exporters.onnx.patterns).

Each table is a region's tree from its output back to its inputs, with the checks over its
captures; graphllm.exporters.onnx.fused finds them and its emitters read the captures. These
tables are the only place the fused lowerings spell op names, outside the rows they register.
"""

from __future__ import annotations

import numpy as np

from graphllm.exporters.onnx.patterns import Alt, Check, Match, Op, Optional, Pattern, Var
from graphllm.ir import Node

NO_PAST = "{node}: no past %s input (export the graph with one)"
# attention. Q, K and V: three projections of one input x, or Phi-3's one split in three
QKV_PATTERN = Op(("linear", "linear_bias"), Var("x"), name="qkv_proj")


# Q, K and V whole: each its part of Phi-3's one projection, or its own projection
Q_PROJ_PATTERN, K_PROJ_PATTERN, V_PROJ_PATTERN = (
    Op("split3", QKV_PATTERN, name="qkv_split", out=part)
    | Op(("linear", "linear_bias"), Var("x"), name=f"{x}_proj")
    for part, x in enumerate("qkv")
)
# Q, K and V split into heads; Q and K normalised over the whole projection first where they
# are (OLMo 2)
Q_HEADS_PATTERN, K_HEADS_PATTERN = (
    Op("split_heads", Optional(Op("rmsnorm", proj, name=f"{x}_wide_norm")), name=f"{x}_heads")
    for proj, x in ((Q_PROJ_PATTERN, "q"), (K_PROJ_PATTERN, "k"))
)
V_HEADS_PATTERN = Op("split_heads", V_PROJ_PATTERN, name="v_heads")
# Q and K: a per-head RMSNorm where there is one (Qwen3), or a per-head LayerNorm with each
# head's own weight (Cohere's), rotated by one set of positions, on rotate-half or adjacent
# pairs (Cohere's RoPE), except in a NoPE layer (SmolLM3's), whose Q and K are not rotated
Q_PATTERN, K_NEW_PATTERN = (
    Optional(
        Op(
            ("rope", "rope_pairs"),
            Op("rmsnorm", heads, name=f"{x}_norm")
            | Op("head_layernorm", heads, name=f"{x}_layernorm")
            | heads,
            Var("positions"),
            name=f"{x}_rope",
        )
    )
    for heads, x in ((Q_HEADS_PATTERN, "q"), (K_HEADS_PATTERN, "k"))
)
# K and V behind the past ones, copied to the query heads (GQA) where they are fewer
K_PATTERN = Optional(
    Op(
        "repeat_kv",
        Op("kv_concat", Var("past_k"), K_NEW_PATTERN, name="k_cache", why=NO_PAST % "k"),
    )
)
V_PATTERN = Optional(
    Op(
        "repeat_kv",
        Op("kv_concat", Var("past_v"), V_HEADS_PATTERN, name="v_cache", why=NO_PAST % "v"),
    )
)
# softmax(mask(scale * Q K^T)) V, the heads merged
SEPARATE_QKV = ("q_proj", "k_proj", "v_proj")
MASKED_SCORES_PATTERN = Op(
    "mask",
    Op(
        "mul_const",
        Op("scores", Q_PATTERN, K_PATTERN),
        name="scale",
        # Gemma 2 soft-caps the scores before the mask
        why="{node}: the scores reach the mask through {op}, which the fused "
        "attention op cannot apply (soft-capping)",
    ),
    name="key_mask",
)
ATTENTION_PATTERN = Pattern(
    Op(
        "merge_heads",
        Op(
            "pv",
            Op("softmax", MASKED_SCORES_PATTERN, name="probs")
            # gpt-oss's sinks join the softmax (GroupQueryAttention's head_sink)
            | Op("softmax_sink", MASKED_SCORES_PATTERN, Var("sinks"), name="probs"),
            V_PATTERN,
        ),
        name="merge",
    ),
    checks=(
        Check(
            lambda m: m["key_mask"].attrs.get("causal", True),
            "{key_mask}: attention that is not causal",
        ),
        Check(
            lambda m: ("q_rope" in m) == ("k_rope" in m),
            "{q_heads}: one of q and k rotated, the other not",
        ),
        Check(
            lambda m: (
                "q_rope" not in m
                or np.array_equal(m["k_rope"].attrs["inv_freq"], m["q_rope"].attrs["inv_freq"])
            ),
            "{k_rope}: rotates otherwise than {q_rope}",
        ),
        Check(
            lambda m: (
                "q_rope" not in m
                or (m["q_rope"].op, rope_layout(m["q_rope"]))
                == (m["k_rope"].op, rope_layout(m["k_rope"]))
            ),
            "{k_rope}: pairs its channels otherwise than {q_rope}",
        ),
        Check(
            # RotaryEmbedding writes a rotated pair back where it was read (in place) or as
            # rotate-half does; DeepSeek-V3's layout gathers first members, then second ones
            lambda m: "q_rope" not in m or rope_layout(m["q_rope"]) in FUSED_ROPE_LAYOUTS,
            "{q_rope}: RoPE pairs written back first members then second ones (layout "
            "'interleave'), which RotaryEmbedding cannot express",
        ),
        Check(
            lambda m: ("qkv_split" in m) == all(p not in m for p in SEPARATE_QKV),
            "{q_heads}: q, k and v mix a projection split in three with separate ones",
        ),
        Check(
            lambda m: len({len(p.inputs) for p in qkv_projections(m)}) == 1,
            "{q_proj}: q, k and v are not projections of one input",
        ),
    ),
)
# a gated MLP down(act(gate(x)) * up(x)) whose gate and up are projections of x, both with a
# bias or neither
GATED_MLP_PATTERN = Pattern(
    Op(
        "mul",
        Op(
            ("silu", "gelu_tanh"),
            Op(("linear", "linear_bias"), Var("x"), name="gate"),
            name="act",
        ),
        Op(("linear", "linear_bias"), Var("x"), name="up"),
        name="gated",
    ),
    checks=(
        Check(
            lambda m: len(m["gate"].inputs) == len(m["up"].inputs),
            "{up}: a bias on one of gate and up only",
        ),
    ),
)
# routed experts as onnxruntime's MoE op runs them: SwiGLU experts, routed by the top k of the
# router's softmax, renormalised or not
ROUTER_PATTERN = Op(
    "topk",
    Op(
        "softmax",
        Op("linear", Var("x"), name="router"),
        why="{anchor}: routing the MoE op cannot do (top-k of {op} scores; the op takes the top"
        " k of the router's softmax)",
    ),
    name="top_k",
)
DISPATCH_PATTERN = Op("moe_dispatch", Var("x"), name="dispatch")
MOE_PATTERN = Pattern(
    Op(
        "moe_combine",
        Op(
            "expert_linear",
            Op(
                "mul",
                Op(
                    "silu",
                    Op("expert_linear", DISPATCH_PATTERN, name="gate"),
                    name="act",
                    why="{anchor}: onnxruntime's MoE op runs SwiGLU experts only on the CPU"
                    " provider, and these experts use {op}",
                ),
                Op("expert_linear", DISPATCH_PATTERN, name="up"),
            ),
            name="down",
        ),
        Alt(
            Op("normalize", ROUTER_PATTERN, name="renormalised"),
            ROUTER_PATTERN,
            why="{anchor}: routing the MoE op cannot do ({op} weights)",
        ),
        Op("topk", name="top_k", out=1),  # the weights' top-k, matched with them
        name="combine",
    )
)
# a residual add and the RMSNorm of its sum
SKIP_NORM_PATTERN = Pattern(
    Op("rmsnorm", Op("add", Var("residual"), Var("branch"), name="residual_add"), name="norm")
)


# gpt-oss's experts as onnxruntime's MoE op runs them (swiglu_fusion=1: gate and up
# interleaved, gate the even channels, as the checkpoint stores them; swiglu_limit,
# activation_alpha, activation_beta=1 for the up path's + 1; fc1/fc2 biases), routed by the
# softmax over the top k of a router with a bias, which the op's softmax over every expert
# renormalised over its k (normalize_routing_weights) gives: exp(l_i) / sum over the k of exp
STACKED_ROUTER_PATTERN = Op(
    "softmax",
    Op("topk", Op(("linear", "linear_bias"), Var("x"), name="router"), name="top_k"),
    why="{anchor}: routing the MoE op cannot do ({op} weights)",
    name="routing",
)
GATE_UP_PATTERN = Op("expert_linear_bias", DISPATCH_PATTERN, name="gate_up")
CLAMPED_MOE_PATTERN = Pattern(
    Op(
        "moe_combine",
        Op(
            "expert_linear_bias",
            Op(
                "clamped_swiglu",
                Op("split_interleaved", GATE_UP_PATTERN, name="gate_up_split"),
                Op("split_interleaved", name="gate_up_split", out=1),
                name="act",
            ),
            name="down",
        ),
        STACKED_ROUTER_PATTERN,
        Op("topk", name="top_k", out=1),
        name="combine",
    )
)


def attention_sinks(m: Match) -> str | None:
    """The sinks param of an attention match whose softmax has them (gpt-oss), else None."""
    return m.ref("sinks").node if "sinks" in m else None


def qkv_projections(m: Match) -> list[Node]:
    """Q, K and V's projections in an attention match: Phi-3's one, or three."""
    return [m["qkv_proj"]] if "qkv_split" in m else [m[p] for p in SEPARATE_QKV]


# how a rotation pairs its channels. 'half': x_i with x_i+e/2 (rotate-half); 'complex':
# adjacent pairs (x_2i, x_2i+1) written back in place, which RotaryEmbedding and
# GroupQueryAttention call interleaved; 'interleave' (DeepSeek-V3, latent attention only) writes
# the pairs back first members then second ones, which neither can (onnx.ai/onnx/operators/
# onnx__RotaryEmbedding.html; onnxruntime's docs/ContribOperators.md, GroupQueryAttention)
FUSED_ROPE_LAYOUTS = ("half", "complex")


def rope_layout(rope: Node) -> str:
    """A RoPE node's channel pairing: its `layout` attr, rotate-half where it has none."""
    return str(rope.attrs.get("layout", "half"))
