"""What MLA saves: its KV cache per token against standard multi-head attention's, and the naive
(transformers: re-expand the cached latent every step) against the absorbed form's FLOPs and bytes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from graphllm.build.builder import build_graph
from graphllm.models.model_config import ModelConfig
from graphllm.models.workload import Workload, dtype
from graphllm.passes import run


@dataclass(frozen=True)
class KVPerToken:
    """Cached values (and bytes at `kv_dtype`) per token, summed over the layers."""

    mla_values: int  # layers x (kv_lora_rank + qk_rope_head_dim)
    mha_values: int  # layers x heads x (qk_head_dim + v_head_dim): the same model with MHA
    mla_bytes: float
    mha_bytes: float

    @property
    def ratio(self) -> float:
        """How many times smaller MLA's cache is."""
        return self.mha_values / self.mla_values

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio}


def kv_per_token(cfg: ModelConfig, kv_dtype: str = "bf16") -> KVPerToken:
    """MLA's cache per token against standard MHA's with the same heads and head widths."""
    if not cfg.is_mla:
        raise ValueError(f"{cfg.name} does not use MLA")
    n = cfg.num_hidden_layers
    mla = n * (cfg.kv_lora_rank + cfg.qk_rope_head_dim)
    mha = n * cfg.num_attention_heads * (cfg.head_dim + cfg.v_head_dim)
    dt = dtype(kv_dtype)
    return KVPerToken(mla, mha, dt.nbytes(mla), dt.nbytes(mha))


@dataclass(frozen=True)
class FormCost:
    flops: Any  # exact counts, as the cost pass gives them: ints (FLOPs above 2**53 included)
    matmul_flops: Any
    bytes: float
    attention_flops: Any  # in the attention scopes (projections, expansion, core)


def form_cost(cost: Any) -> FormCost:
    """A FormCost from the cost pass's report (forward, flash attention)."""
    attn = cost.flops["by_scope"]["attention"]
    return FormCost(cost.flops["total"], cost.flops["matmul"], cost.bytes["total"], attn)


def form_costs(
    cfg: ModelConfig, workload: Workload, known: dict[str, FormCost] | None = None
) -> dict[str, FormCost]:
    """FLOPs and bytes of one forward of `workload` in each MLA form ('naive', 'absorbed');
    `known` forms (costed already, forward and flash) are taken as they are."""

    out = dict(known or {})
    for form in ("naive", "absorbed"):
        if form not in out:
            out[form] = form_cost(run(build_graph(cfg, workload, mla=form), ["cost"])["cost"])
    return {form: out[form] for form in ("naive", "absorbed")}
