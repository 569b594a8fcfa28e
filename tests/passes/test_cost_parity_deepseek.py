"""DeepSeek-V2/V3: the cost pass's matmul FLOPs == FlopCounterMode on transformers' own models.

As tests/passes/test_cost_parity.py does for the other families: each preset cut to 2 layers
(one dense, one MoE: V3's first_k_dense_replace is set to 1), transformers' model built on the
meta device with sdpa attention and `batched_mm` experts, one forward counted; a cached step
fills a P-token cache outside the counter. transformers expands the cached latent through
kv_b_proj at every step, which is graphllm's default ('naive') MLA form.
"""

from __future__ import annotations

import functools
import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_cost_parity import count_forward  # noqa: E402  (the same counting, one copy)

from graphllm import Workload, build_graph  # noqa: E402
from graphllm.models.config import PRESETS_DIR, config_from_dict  # noqa: E402
from graphllm.passes import run  # noqa: E402

MODELS = {
    "deepseek-v2-lite": {},  # one q_proj, greedy softmax routing, 64 experts top 6
    "deepseek-v2": {},  # q down/up projections, group-limited routing over 160 experts
    "deepseek-v3": {"first_k_dense_replace": 1},  # sigmoid, bias, grouped top-8 of 256
}
WORKLOADS = {
    "prefill-b1-t64": {"batch": 1, "seq_len": 64},
    "prefill-b2-t32-last": {"batch": 2, "seq_len": 32, "logits": "last"},
    "decode-b2-p48": {"batch": 2, "seq_len": 1, "past_len": 48},
    "extend-b1-t8-p40": {"batch": 1, "seq_len": 8, "past_len": 40},
}


def _config_dict(preset: str) -> dict:
    d = json.loads((PRESETS_DIR / f"{preset}.json").read_text(encoding="utf-8"))
    d = {k: v for k, v in d.items() if not k.startswith("_") and k != "quantization_config"}
    return {**d, "num_hidden_layers": 2, **MODELS[preset]}


@functools.cache
def _models(preset: str):
    d = _config_dict(preset)
    cfg = config_from_dict(dict(d), preset)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(
            transformers.AutoConfig.for_model(**d),
            attn_implementation="sdpa",
            experts_implementation="batched_mm",
        )
    return cfg, model.eval()


def counted(preset: str, workload: dict) -> int:
    return count_forward(_models(preset)[1], workload).get_total_flops()


def matmul_flops(preset: str, workload: dict, mla: str = "naive") -> int:
    cfg, _ = _models(preset)
    graph = build_graph(cfg, Workload(**workload), mla=mla)
    return round(float(run(graph, ["cost"])["cost"].flops["matmul"]))


@pytest.mark.parametrize("workload", WORKLOADS.values(), ids=WORKLOADS.keys())
@pytest.mark.parametrize("preset", MODELS)
def test_matmul_flops_equal_flop_counter(preset, workload):
    assert matmul_flops(preset, workload) == counted(preset, workload)
