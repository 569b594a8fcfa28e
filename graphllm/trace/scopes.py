"""The kinds of a traced model's scopes and weights, read from its modules' class names.

A built graph names its scopes' kinds as it builds them (graphllm.build.kinds); a traced one has
transformers' module tree, whose class names say what each module is (`LlamaAttention`,
`Qwen3MoeSparseMoeBlock`, `MixtralExperts`, `LlamaRMSNorm`, ...). The decoder layers are the
children of the model's layer list.
"""

from __future__ import annotations

import re

from graphllm.build.kinds import WEIGHT_KINDS

# class-name patterns, first match wins: a scope kind of graphllm.build.kinds.SCOPE_KINDS, read
# from the end of the name (its start is the family's: `Qwen3MoeAttention` is an attention,
# `Glm4MoeMLP` a dense MLP); a rotary embedding's tables are no embedding
_CLASS_KINDS: tuple[tuple[re.Pattern[str], str | None], ...] = (
    (re.compile(r"RotaryEmbedding$"), None),
    (re.compile(r"Embed(ding|dings|s)?$"), "embedding"),
    # a wrapper of a norm, the attention and a norm (DBRX's NormAttentionNorm) is no norm
    (re.compile(r"AttentionNorm$"), None),
    (re.compile(r"Norm(Gated|1P|PerHead)?$"), "norms"),
    (re.compile(r"Experts?$"), "experts"),
    # a linear attention's forget gate (Kimi Linear's) makes its decay, a residual or message
    # gate (Ergo's, Inkling 2 Loop's) scales a stream: they route nothing
    (re.compile(r"(Forget|Residual|Message)Gate$"), None),
    (re.compile(r"(Router|Gate|Gating)$"), "router"),
    (re.compile(r"(SparseMo[eE]Block|SparseMoe|MoeBlock|MoE|Moe|MoELayer|MoeLayer)$"), "moe"),
    (re.compile(r"(Mamba\d?Mixer|Mixer|Mamba\d?)$"), "mamba"),
    # (Griffin's recurrent block, RecurrentGemma's: its conv and RG-LRU, a linear recurrence)
    (
        re.compile(
            r"(GatedDeltaNet|LinearAttention|DeltaNet|DeltaAttention|LightningAttention"
            r"|RecurrentBlock)$"
        ),
        "linear_attention",
    ),
    (re.compile(r"Attention(Block)?$"), "attention"),
    (re.compile(r"(MLP|FeedForward|FFN|Mlp)(Block)?$"), "mlp"),
)
_LAYER = re.compile(r"^(.*\.)?(layers|h|blocks|layer)\.\d+$")
# a scope kind -> the kind its weights count under
_WEIGHT_OF = {
    "embedding": "embedding",
    "norms": "norms",
    "experts": "moe_experts",
    "router": "router",
    "attention": "attention",
    "core_attention": "attention",
    "mlp": "mlp",
    "shared_expert": "shared_experts",
    "moe": "mlp",
    "lm_head": "lm_head",
    "mamba": "linear_attention",
    "linear_attention": "linear_attention",
}


def scope_kinds(modules: dict[str, str]) -> dict[str, str]:
    """Module path -> scope kind, for the modules whose class says one (`modules`: path ->
    class name, as the forward ran them). A class is read without the family's name, which
    the outermost module's class starts with: Kimi Linear's MLA layer is `KimiLinear` + `Attention`, no
    linear attention."""
    out: dict[str, str] = {}
    family = _family(min(modules.items(), key=lambda m: m[0].count("."))[1] if modules else "")
    for path, name in modules.items():
        cls = name[len(family) :] if family and name.startswith(family) else name
        if _LAYER.match(path):
            out[path] = "layer"
            continue
        if path.rsplit(".", 1)[-1] == "lm_head":
            out[path] = "lm_head"
            continue
        for pattern, kind in _CLASS_KINDS:
            if pattern.search(cls):
                # a shared expert runs on every token, whether its class reads as an MLP or
                # as experts (Inkling's SharedExperts)
                if kind in ("mlp", "experts") and "shared" in path.rsplit(".", 1)[-1]:
                    kind = "shared_expert"
                if kind is not None:
                    out[path] = kind
                break
    return out


_MODEL_CLASS = re.compile(r"(For[A-Z]\w*|LMHeadModel|Model)$")


def _family(root: str) -> str:
    """The family's name the outermost module's class starts with (`KimiLinearModel`:
    `KimiLinear`); '' where it is not a model class."""
    m = _MODEL_CLASS.search(root)
    return root[: m.start()] if m else ""


def param_kind(name: str, scopes: dict[str, str]) -> str:
    """The weight kind of parameter `name`: its innermost scope's that has one."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        scope = scopes.get(".".join(parts[:i]), "")
        kind = _WEIGHT_OF.get(scope)
        # a gate of the MoE block's own (Qwen's shared_expert_gate) routes, as a router does
        if scope == "moe" and i == len(parts) - 2 and "gate" in parts[i]:
            return "router"
        if kind is not None:
            return kind
    return "mlp" if "mlp" in WEIGHT_KINDS else WEIGHT_KINDS[0]
