"""DeepSeek-V2/V3: the cost pass's matmul FLOPs == FlopCounterMode on transformers' own models.

As tests/passes/test_cost_parity.py does for the other families: each preset cut to 2 layers
(one dense, one MoE: V3's first_k_dense_replace is set to 1), transformers' model built on the
meta device with sdpa attention and `batched_mm` experts, one forward counted; a cached step
fills a P-token cache outside the counter. transformers expands the cached latent through
kv_b_proj at every step, which is graphllm's default ('naive') MLA form.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from graphllm import Workload, build_graph
from graphllm.passes import run
from tests.support.flop_counter import (
    DEEPSEEK_MODELS,
    DEEPSEEK_WORKLOADS,
    count_forward,
    deepseek_models,
)


def counted(preset: str, workload: dict) -> int:
    return count_forward(deepseek_models(preset)[1], workload).get_total_flops()


def matmul_flops(preset: str, workload: dict, mla: str = "naive") -> int:
    cfg, _ = deepseek_models(preset)
    graph = build_graph(cfg, Workload(**workload), mla=mla)
    return round(float(run(graph, ["cost"])["cost"].flops["matmul"]))


@pytest.mark.parametrize("workload", DEEPSEEK_WORKLOADS.values(), ids=DEEPSEEK_WORKLOADS.keys())
@pytest.mark.parametrize("preset", DEEPSEEK_MODELS)
def test_matmul_flops_equal_flop_counter(preset, workload):
    assert matmul_flops(preset, workload) == counted(preset, workload)
