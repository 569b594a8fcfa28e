"""issue 18: Llama 4's matmul FLOPs against torch's FlopCounterMode over transformers' own model
on the meta device, Scout's and Maverick's published text_config cut to 2 layers (Scout: two MoE
layers; Maverick: a dense layer then an MoE one).

transformers' Llama4TextMoe runs every routed expert on every token (the unchosen ones on inputs
the router scaled to zero), so its expert bmms count E experts' work per token where graphllm
counts the k the router chose: the matmuls outside the experts compare exactly, and graphllm's
expert matmuls equal FlopCounterMode's expert bmms x k / E.
"""

from __future__ import annotations

import functools
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from graphllm import Workload, build_graph  # noqa: E402
from graphllm.ir.opspec import OPS, node_flops  # noqa: E402
from graphllm.models.config import PRESETS_DIR, config_from_dict  # noqa: E402
from tests.support.flop_counter import count_forward  # noqa: E402

PRESETS = ("llama4-scout", "llama4-maverick")
WORKLOADS = {
    "prefill-b2-t64": {"batch": 2, "seq_len": 64},
    "prefill-b1-t32-last": {"batch": 1, "seq_len": 32, "logits": "last"},
    "decode-b2-p48": {"batch": 2, "seq_len": 1, "past_len": 48},
    "extend-b1-t8-p40": {"batch": 1, "seq_len": 8, "past_len": 40},
}


@functools.cache
def _models(preset: str):
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text(encoding="utf-8"))
    text = dict(d["text_config"]) | {"num_hidden_layers": 2}
    text.pop("moe_layers", None)  # Llama4TextConfig derives it from interleave_moe_layer_step
    text["no_rope_layers"] = [1, 0]  # a chunked RoPE layer, then a NoPE one (its temperature)
    # Scout's published 4, which transformers 4.5x read as true; transformers 5 wants a bool
    text["attn_temperature_tuning"] = bool(text.get("attn_temperature_tuning", True))
    cfg = config_from_dict(dict(text), preset)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.Llama4TextConfig(**text), attn_implementation="sdpa"
        )
    return cfg, model.eval()


def _graphllm(preset: str, workload: dict) -> tuple[int, int]:
    """(all matmul FLOPs, those of the routed experts' matmuls)."""
    cfg, _ = _models(preset)
    g = build_graph(cfg, Workload(**workload))
    total = experts = 0.0
    for n in g.nodes():
        if OPS[n.op].matmul:
            f = node_flops(g, n)[0]
            total += f
            experts += f if ".experts." in n.name else 0
    return round(total), round(experts)


@pytest.mark.parametrize("workload", WORKLOADS.values(), ids=WORKLOADS.keys())
@pytest.mark.parametrize("preset", PRESETS)
def test_matmul_flops_equal_flop_counter_experts_at_k_of_e(preset, workload):
    cfg, model = _models(preset)
    counter = count_forward(model, workload)
    counts = counter.get_flop_counts()
    experts_hf = sum(
        sum(ops.values()) for mod, ops in counts.items() if mod.endswith("feed_forward.experts")
    )
    assert experts_hf > 0
    total, experts = _graphllm(preset, workload)
    assert total - experts == counter.get_total_flops() - experts_hf
    k, e = cfg.num_experts_per_tok, cfg.num_experts
    assert experts * e == experts_hf * k
