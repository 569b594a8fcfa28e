"""The kinds of a traced model's scopes and weights, read from its modules' class names.

A built graph names its scopes' kinds as it builds them (graphllm.build.kinds); a traced one has
transformers' module tree, whose class names say what each module is (`LlamaAttention`,
`Qwen3MoeSparseMoeBlock`, `MixtralExperts`, `LlamaRMSNorm`, ...). The decoder layers are the
children of the model's layer list.
"""

from __future__ import annotations

import re

from graphllm.build.kinds import WEIGHT_KINDS

# class-name patterns, first match wins: a scope kind of graphllm.build.kinds.SCOPE_KINDS
_CLASS_KINDS = (
    (re.compile(r"Embed"), "embedding"),
    (re.compile(r"Norm"), "norms"),
    (re.compile(r"Experts?$"), "experts"),
    (re.compile(r"(Router|Gate|TopkRouter)$"), "router"),
    (re.compile(r"(SparseMoe|MoE|Moe)"), "moe"),
    (re.compile(r"(Mamba|Mixer)"), "mamba"),
    (re.compile(r"(GatedDeltaNet|LinearAttention|DeltaNet|Lightning)"), "linear_attention"),
    (re.compile(r"Attention"), "attention"),
    (re.compile(r"(MLP|FeedForward|FFN|Mlp)"), "mlp"),
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
    class name, as the forward ran them)."""
    out: dict[str, str] = {}
    for path, cls in modules.items():
        if _LAYER.match(path):
            out[path] = "layer"
            continue
        if path.rsplit(".", 1)[-1] == "lm_head":
            out[path] = "lm_head"
            continue
        for pattern, kind in _CLASS_KINDS:
            if pattern.search(cls):
                if kind == "mlp" and "shared" in path.rsplit(".", 1)[-1]:
                    kind = "shared_expert"
                out[path] = kind
                break
    return out


def param_kind(name: str, scopes: dict[str, str]) -> str:
    """The weight kind of parameter `name`: its innermost scope's that has one."""
    parts = name.split(".")
    for i in range(len(parts) - 1, 0, -1):
        kind = _WEIGHT_OF.get(scopes.get(".".join(parts[:i]), ""))
        if kind is not None:
            return kind
    return "mlp" if "mlp" in WEIGHT_KINDS else WEIGHT_KINDS[0]
