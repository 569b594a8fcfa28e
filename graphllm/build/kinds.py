"""The two labels the builder puts on a model's parts, declared in one place.

- A weight's kind (`param` attrs['kind']): the group its parameters count in (the `params` pass's
  `by_kind`, in this order). Every weight has exactly one.
- A scope's kind (graph.meta['scopes']: name prefix -> kind): the part of the model a node lies in,
  for roll-ups (`by_scope` of `cost` and `roofline`, in this order), diagrams and per-layer
  figures. Scopes nest (a layer holds attention, which holds core attention), and a node counts in
  every scope that prefixes its name.

Where a weight group and a scope are the same part of the model they have the same word, except
three spellings that the JSON reports keep: the routed experts' weights are `moe_experts` in the
scope `experts`, the shared experts' `shared_experts` in `shared_expert`, and an MTP module's
`eh_proj` is `mtp_proj` inside the scope `mtp` (whose other weights keep their own kinds).
"""

from __future__ import annotations

WEIGHT_KINDS = (
    "embedding",
    "attention",
    "mlp",
    "moe_experts",
    "shared_experts",
    "router",
    "norms",
    "lm_head",
    "mtp_proj",  # an MTP module's eh_proj; its other weights count under their own kinds
    "linear_attention",  # a Gated DeltaNet (or Mamba) mixer's weights
)
LAYER = "layer"  # a decoder block: figures per layer, not a roll-up
SCOPE_KINDS = (
    "embedding",
    "attention",
    "core_attention",
    "mlp",
    "moe",
    "router",
    "experts",
    "shared_expert",
    "norms",
    "lm_head",
    "mtp",  # DeepSeek-V3's multi-token-prediction modules, when built
    "linear_attention",  # a layer's Gated DeltaNet (or Mamba) mixer
    "mamba",  # a Mamba2 mixer (Nemotron-H)
)
